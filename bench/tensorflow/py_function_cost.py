"""What the tf.py_function boundary costs per call, on one process (no communication): a tf.function computing
v * 1; the same through an identity py_function; gradcomp.tensorflow's allreduce of 16 floats inside a tf.function and
eagerly. Microseconds per call, median of --repeats runs of --calls calls. Run on an idle machine:

    PYTHONPATH=build/python .venv-tf/bin/python bench/tensorflow/py_function_cost.py
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

import gradcomp.tensorflow as hvd  # noqa: E402


def per_call_us(fn, x, calls, repeats):
    fn(x)
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn(x)
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(runs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    hvd.init()
    x = tf.ones([16])
    rows = {
        "tf.function: v * 1": tf.function(lambda v: v * 1.0),
        "tf.function: identity py_function": tf.function(lambda v: tf.py_function(lambda t: t, [v], tf.float32)),
        "tf.function: hvd.allreduce (1 rank)": tf.function(lambda v: hvd.allreduce(v, op=hvd.Sum)),
        "eager: hvd.allreduce (1 rank)": lambda v: hvd.allreduce(v, op=hvd.Sum),
    }
    for name, fn in rows.items():
        print(f"{name:40s} {per_call_us(fn, x, a.calls, a.repeats):9.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
