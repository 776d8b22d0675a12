"""Fashion-MNIST for the TensorFlow example equivalents: what tf.keras.datasets.mnist.load_data() returns
((x_train, y_train), (x_test, y_test), uint8 images [N, 28, 28], uint8 labels), read from Debian's
dataset-fashion-mnist (Horovod's examples download MNIST, which cannot run here)."""
import gzip
import os

import numpy as np

DATA_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def _idx(name):
    with gzip.open(os.path.join(DATA_DIR, name), "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_data(train_samples=None):
    x, y = _idx("train-images-idx3-ubyte.gz"), _idx("train-labels-idx1-ubyte.gz")
    xt, yt = _idx("t10k-images-idx3-ubyte.gz"), _idx("t10k-labels-idx1-ubyte.gz")
    return (x[:train_samples], y[:train_samples]), (xt, yt)
