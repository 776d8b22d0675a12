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
from tf_data import compression as pick_compression, small_cnn, train_dataset, weights_equal_to_root  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--compression", default="none", choices=("none", "fp16", "topk"))
parser.add_argument("--steps", type=int, default=160)
parser.add_argument("--lr", type=float, default=0.001)


def main(args):
    hvd.init()
    tf.random.set_seed(hvd.rank())  # different initial weights per rank: the broadcast must make them equal
    dataset = train_dataset(hvd.rank(), hvd.size())
    mnist_model = small_cnn()
    loss = tf.keras.losses.SparseCategoricalCrossentropy()
    opt = tf.keras.optimizers.Adam(args.lr * hvd.size())
    compression = pick_compression(hvd, args.compression)

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
    equal = weights_equal_to_root(hvd, model)
    ok = last < 0.6 * first and equal
    print(f"rank {hvd.rank()}/{hvd.size()}: loss {first:.4f} -> {last:.4f}, weights equal to rank 0's: {equal} -> "
          f"{'OK' if ok else 'FAILED'}", flush=True)
    return ok


if __name__ == "__main__":
    a = parser.parse_args()
    sys.exit(0 if check(*main(a)) else 1)
