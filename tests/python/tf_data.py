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


def train_dataset(rank, size, batch=64):
    """This rank's shard of 20,000 training images, scaled to [0, 1], repeated, shuffled, batched (as Horovod's
    examples build theirs from the MNIST download)."""
    import tensorflow as tf
    (images, labels), _ = load_data(train_samples=20000)
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(labels, tf.int64)))
    return dataset.shard(size, rank).repeat().shuffle(10000, seed=rank).batch(batch)


def small_cnn():
    """Horovod's example CNN, narrowed for two CPU cores (one 8-filter convolution, a 64-unit dense layer)."""
    import tensorflow as tf
    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])


def compression(hvd, name):
    return {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16, "topk": hvd.Compression.topk(0.1)}[name]


def weights_equal_to_root(hvd, model):
    """Whether this rank's trainable weights equal rank 0's bit for bit."""
    import tensorflow as tf
    flat = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    return bool(np.array_equal(flat, hvd.broadcast(tf.constant(flat), 0).numpy()))
