"""Step time of the same 25M-parameter MLP (784-2048-4096-3072-768-10, float32, SGD, synthetic batch) trained through
gradcomp.tensorflow (DistributedGradientTape in a tf.function) or gradcomp.torch (DistributedOptimizer), on the
backend init() picks under mpirun (the fusion runtime), codec `none` by default. Rank 0 prints one JSON line: the
framework, ranks, median and mean step seconds over --steps after --warmup; both frameworks compute with --threads
threads per rank. The issue's target: tf / torch <= 1.15
at 4 ranks (run both on an idle machine; bench/tensorflow/run_overhead.sh does).

    mpirun -np 4 .venv-tf/bin/python bench/tensorflow/step_overhead.py --framework tf
    mpirun -np 4 .venv/bin/python bench/tensorflow/step_overhead.py --framework torch
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

SIZES = [784, 2048, 4096, 3072, 768, 10]


def run_tf(a):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import gradcomp.tensorflow as hvd
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    hvd.init()
    tf.random.set_seed(0)
    layers = [tf.keras.Input((SIZES[0],))] + [tf.keras.layers.Dense(s, activation="relu") for s in SIZES[1:-1]] + \
        [tf.keras.layers.Dense(SIZES[-1])]
    model = tf.keras.Sequential(layers)
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    compression = hvd.Compression.custom(a.compression) if a.compression != "none" else hvd.Compression.none
    x = tf.random.normal([a.batch, SIZES[0]])
    y = tf.random.uniform([a.batch], 0, 10, tf.int64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def one():
        step().numpy()
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    return hvd, one, params


def run_torch(a):
    import torch
    import gradcomp.torch as hvd
    torch.set_num_threads(a.threads)
    hvd.init()
    torch.manual_seed(0)
    mods = []
    for i in range(len(SIZES) - 1):
        mods.append(torch.nn.Linear(SIZES[i], SIZES[i + 1]))
        if i < len(SIZES) - 2:
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods)
    comp = hvd.Compression.custom(a.compression) if a.compression != "none" else hvd.Compression.none
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), compression=comp)
    x, y = torch.randn(a.batch, SIZES[0]), torch.randint(0, 10, (a.batch,))

    def one():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return hvd, one, sum(p.numel() for p in model.parameters())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=("tf", "torch"), required=True)
    p.add_argument("--compression", default="none")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")),
                   help="compute threads per rank, the same for both frameworks (TensorFlow's intra- and inter-op "
                        "pools, torch.set_num_threads); default $OMP_NUM_THREADS or 1")
    a = p.parse_args()
    hvd, one, params = (run_tf if a.framework == "tf" else run_torch)(a)
    for _ in range(a.warmup):
        one()
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        one()
        times.append(time.perf_counter() - t)
    if hvd.rank() == 0:
        print(json.dumps({"framework": a.framework, "backend": hvd.backend(), "ranks": hvd.size(), "params": params,
                          "compression": a.compression, "batch": a.batch, "threads": a.threads, "median_step_s": statistics.median(times),
                          "mean_step_s": statistics.fmean(times)}), flush=True)


if __name__ == "__main__":
    main()
