"""The calls of Horovod's examples/tensorflow2/tensorflow2_mnist.py (v0.28.1; written here, not copied) on
`import gradcomp.tensorflow as hvd`: a tf.function training step with hvd.DistributedGradientTape, the variables
broadcast from rank 0 after the first step, steps divided by the size, rank 0 logging. Differences from the original
that Keras 3 needs whatever the library (not gradcomp's): `opt.variables` is a list (not a method). Data:
Fashion-MNIST (tf_data.py) instead of the MNIST download; a smaller CNN so that it runs on two CPU cores. The checks
at the end (loss falling, parameters equal on every rank) are the test's.

    mpirun -np 2 python tests/python/tf_mnist.py [--compression none|fp16|topk] [--steps N]
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import gradcomp.tensorflow as hvd  # noqa: E402
from tf_data import load_data  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--compression", default="none", choices=("none", "fp16", "topk"))
parser.add_argument("--steps", type=int, default=240)
parser.add_argument("--lr", type=float, default=0.001)


def main(args):
    hvd.init()
    tf.random.set_seed(hvd.rank())  # different initial weights per rank: the broadcast must make them equal
    (mnist_images, mnist_labels), _ = load_data(train_samples=20000)
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(mnist_labels, tf.int64)))
    dataset = dataset.shard(hvd.size(), hvd.rank()).repeat().shuffle(10000, seed=hvd.rank()).batch(64)

    mnist_model = tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    loss = tf.keras.losses.SparseCategoricalCrossentropy()
    opt = tf.keras.optimizers.Adam(args.lr * hvd.size())
    compression = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
                   "topk": hvd.Compression.topk(0.1)}[args.compression]

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
        if first_batch:
            hvd.broadcast_variables(mnist_model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss_value

    losses = []
    for batch, (images, labels) in enumerate(dataset.take(args.steps // hvd.size())):
        loss_value = training_step(images, labels, batch == 0)
        losses.append(float(hvd.allreduce(loss_value, name="loss")))
        if batch % 10 == 0 and hvd.rank() == 0:
            print("Step #%d\tLoss: %.6f" % (batch, losses[-1]))
    return mnist_model, losses


def check(model, losses):
    """Loss falls (the last tenth's mean below 60% of the first tenth's) and every rank holds rank 0's weights."""
    k = max(len(losses) // 10, 1)
    first, last = np.mean(losses[:k]), np.mean(losses[-k:])
    flat = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    root = hvd.broadcast(tf.constant(flat), 0).numpy()
    ok = last < 0.6 * first and np.array_equal(flat, root)
    print(f"rank {hvd.rank()}/{hvd.size()}: loss {first:.4f} -> {last:.4f}, weights equal to rank 0's: "
          f"{np.array_equal(flat, root)} -> {'OK' if ok else 'FAILED'}", flush=True)
    return ok


if __name__ == "__main__":
    a = parser.parse_args()
    sys.exit(0 if check(*main(a)) else 1)
