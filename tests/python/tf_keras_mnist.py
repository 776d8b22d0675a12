"""The calls of Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py (v0.28.1; written here, not copied) on
`import gradcomp.tensorflow.keras as hvd`: DistributedOptimizer(backward_passes_per_step=1,
average_aggregated_gradients=True), model.compile/fit with BroadcastGlobalVariablesCallback(0),
MetricAverageCallback and LearningRateWarmupCallback(warmup_epochs=3), a checkpoint on rank 0, steps per epoch
divided by the size. Differences that Keras 3 needs whatever the library (not gradcomp's): compile() takes no
`experimental_run_tf_function`, and ModelCheckpoint writes `.keras` files (not `.h5`). Data: Fashion-MNIST
(tf_data.py); a smaller CNN and fewer epochs for two CPU cores. The checks at the end (loss falling, weights equal on
every rank, the checkpoint reloading through hvd.load_model) are the test's.

    mpirun -np 2 python tests/python/tf_keras_mnist.py [--compression none|fp16|topk] [--epochs N]
"""
import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import gradcomp.tensorflow.keras as hvd  # noqa: E402
from tf_data import compression as pick_compression, small_cnn, train_dataset, weights_equal_to_root  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--compression", default="none", choices=("none", "fp16", "topk"))
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--steps-per-epoch", type=int, default=120)
parser.add_argument("--backward-passes-per-step", type=int, default=1)


def main(args, ckpt_dir):
    hvd.init()
    tf.random.set_seed(hvd.rank())
    dataset = train_dataset(hvd.rank(), hvd.size())
    mnist_model = small_cnn()
    scaled_lr = 0.001 * hvd.size()
    opt = tf.keras.optimizers.Adam(scaled_lr)
    compression = pick_compression(hvd, args.compression)
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=args.backward_passes_per_step,
                                   average_aggregated_gradients=True, compression=compression)
    mnist_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
    ]
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(os.path.join(ckpt_dir, "checkpoint-{epoch}.keras")))
    verbose = 2 if hvd.rank() == 0 else 0
    history = mnist_model.fit(dataset, steps_per_epoch=args.steps_per_epoch * 2 // hvd.size(), callbacks=callbacks,
                              epochs=args.epochs, verbose=verbose)
    return mnist_model, history.history["loss"]


def check(model, losses, ckpt_dir, epochs):
    """Loss falls (last epoch below 60% of the first; the epoch losses are averaged over ranks by
    MetricAverageCallback), every rank holds rank 0's weights, and rank 0's last checkpoint loads back through
    hvd.load_model with a DistributedOptimizer carrying the saved optimizer state."""
    equal = weights_equal_to_root(hvd, model)
    ok = losses[-1] < 0.6 * losses[0] and equal
    if hvd.rank() == 0:
        loaded = hvd.load_model(os.path.join(ckpt_dir, f"checkpoint-{epochs}.keras"))
        same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(loaded.variables, model.variables))
        it = int(loaded.optimizer.iterations.numpy())
        wrapped = type(loaded.optimizer).__mro__[1].__module__.startswith("gradcomp")
        print(f"load_model: weights equal {same}, optimizer {type(loaded.optimizer).__name__} wrapped {wrapped}, "
              f"iterations {it}", flush=True)
        ok = ok and same and wrapped and it == int(model.optimizer.iterations.numpy())
    print(f"rank {hvd.rank()}/{hvd.size()}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, weights equal to rank 0's: "
          f"{equal} -> {'OK' if ok else 'FAILED'}", flush=True)
    return ok


if __name__ == "__main__":
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        sys.exit(0 if check(*main(a, d), d, a.epochs) else 1)
