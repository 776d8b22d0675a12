"""gradcomp.tensorflow's collectives and DistributedGradientTape on every rank (mpirun -np 2|4; exits non-zero on a
failed check): values against closed forms, dtypes (float32/16/64, bfloat16, int32/64, bool), Min/Max/Product,
allgather of unequal first dimensions, broadcast, alltoall with splits, tf.IndexedSlices, the same calls inside
tf.function, gradients through allreduce, a shape mismatch raising on every rank with both ranks named, and the
owners of compressor state (a second tape over the same variables continues the first one's residuals; a tape over
other variables starts clean)."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import gradcomp.tensorflow as hvd  # noqa: E402

tf.get_logger().setLevel("ERROR")  # the tf.function per call below retraces on purpose
hvd.init()
r, n = hvd.rank(), hvd.size()
failures = []


def check(what, got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
        failures.append(f"{what}: got {got!r} want {want!r}")


def collectives(tag, wrap):
    """The calls, each run through wrap(fn): directly, or traced into a tf.function."""
    ranks = np.arange(n)
    for dt in (tf.float32, tf.float16, tf.bfloat16, tf.float64, tf.int32, tf.int64):
        x = tf.cast(tf.constant([1, 2, 3]) * (r + 1), dt)
        check(f"{tag} sum {dt.name}", wrap(lambda: hvd.allreduce(x, op=hvd.Sum)).numpy(),
              tf.cast(tf.constant([1, 2, 3]) * int((ranks + 1).sum()), dt).numpy())
    check(f"{tag} average", wrap(lambda: hvd.allreduce(tf.fill([5], float(r)))).numpy(),
          np.full(5, ranks.mean(), np.float32))
    check(f"{tag} int average truncates", wrap(lambda: hvd.allreduce(tf.constant([r], tf.int64))).numpy(),
          np.array([int(ranks.sum() / n)], np.int64))
    v = tf.constant([r + 1.0, -r - 1.0], tf.float64)
    check(f"{tag} max", wrap(lambda: hvd.allreduce(v, op=hvd.Max)).numpy(), np.array([n, -1.0]))
    check(f"{tag} min", wrap(lambda: hvd.allreduce(v, op=hvd.Min)).numpy(), np.array([1.0, -n]))
    check(f"{tag} product", wrap(lambda: hvd.allreduce(tf.constant([r + 1], tf.int32), op=hvd.Product)).numpy(),
          np.array([np.prod(ranks + 1)], np.int32))
    b = tf.constant([r == 0, True])
    check(f"{tag} bool min", wrap(lambda: hvd.allreduce(b, op=hvd.Min)).numpy(), np.array([n == 1, True]))
    g = wrap(lambda: hvd.allgather(tf.fill([r + 1, 2], r)))
    check(f"{tag} allgather", g.numpy(), np.concatenate([np.full((q + 1, 2), q, np.int32) for q in ranks]))
    check(f"{tag} broadcast", wrap(lambda: hvd.broadcast(tf.constant([r, 7], tf.int64), n - 1)).numpy(),
          np.array([n - 1, 7], np.int64))
    splits = [1] * n  # one row to each rank, the rest (n more rows) to the last
    splits[-1] += n
    out, rsplits = wrap(lambda: hvd.alltoall(tf.range(2 * n) + 100 * r, splits=splits))
    want = [100 * q + r for q in ranks] if r < n - 1 else np.concatenate([100 * q + np.arange(n - 1, 2 * n)
                                                                          for q in ranks])
    check(f"{tag} alltoall", out.numpy(), np.asarray(want, np.int32))
    check(f"{tag} alltoall splits", rsplits.numpy(), np.full(n, splits[r], np.int32))
    sp = tf.IndexedSlices(tf.constant([[1.0, 2.0]]) * (r + 1), tf.constant([r]), tf.constant([n, 2]))
    s = wrap(lambda: hvd.allreduce(sp, op=hvd.Sum))
    check(f"{tag} sparse values", s.values.numpy(), np.array([[q + 1.0, 2 * (q + 1.0)] for q in ranks], np.float32))
    check(f"{tag} sparse indices", s.indices.numpy(), ranks.astype(np.int32))


collectives("eager", lambda fn: fn())
collectives("tf.function", tf.function(lambda fn: fn()))  # each call traced into a graph: py_function nodes

# Gradient of an allreduce: the allreduce of the gradient.
x = tf.Variable([1.0, 2.0])
with tf.GradientTape() as tape:
    y = tf.reduce_sum(hvd.allreduce(x * (r + 1), op=hvd.Sum))
check("allreduce gradient", tape.gradient(y, x).numpy(), np.full(2, float(n * (r + 1)), np.float32))

# A shape mismatch raises on every rank, naming the tensor and both ranks.
try:
    hvd.allreduce(tf.zeros([2 + (r == n - 1)]), name="mismatch")
    failures.append("mismatched shapes did not raise")
except hvd.InvalidArgument as e:
    if "mismatch" not in str(e) or f"rank {n - 1}" not in str(e):
        failures.append(f"mismatch message: {e}")
check("usable after an error", hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy(), np.full(2, n, np.float32))

# Owners: top-k 1 of 4 with error feedback. Tapes over `a` continue one residual; a tape over `b` starts clean.
a, b = tf.Variable(tf.zeros(4)), tf.Variable(tf.zeros(4))
grad_in = tf.constant([4.0, 3.0, 2.0, 1.0])


def tape_step(var):
    with tf.GradientTape() as t:
        loss = tf.reduce_sum(var * grad_in)
    t = hvd.DistributedGradientTape(t, compression=hvd.Compression.topk(0.25), op=hvd.Sum)
    return t.gradient(loss, [var])[0].numpy()


check("tape a step 1", tape_step(a), np.array([4.0 * n, 0, 0, 0], np.float32))
check("tape a step 2 (residual kept)", tape_step(a), np.array([0, 6.0 * n, 0, 0], np.float32))
check("tape b step 1 (own state)", tape_step(b), np.array([4.0 * n, 0, 0, 0], np.float32))
check("tape a step 3", tape_step(a), np.array([8.0 * n, 0, 0, 0], np.float32))

for f in failures:
    print(f"rank {r}: FAILED {f}", flush=True)
print(f"rank {r}/{n} [{hvd.backend()}]: {'OK' if not failures else f'{len(failures)} failures'}", flush=True)
hvd.shutdown()
sys.exit(1 if failures else 0)
