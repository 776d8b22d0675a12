"""The collectives on eager tensors, over init()'s C++ communicator: what collectives.py runs directly (eager mode) or
inside a py_function (tf.function). Float32/16/bf16 Average and Sum go through the C++ allreduce (or
compressed_allreduce with a codec); every other dtype and op (int64, float64, Min, Max, Product) is an allgather
reduced with TensorFlow ops in rank order (bit-identical on every rank). Shapes and dtypes are checked across ranks
before any data moves: a mismatch raises InvalidArgument on every rank, naming the tensor and the ranks."""
import numpy as np
import tensorflow as tf

from .. import _gradcomp as _C
from .._compressors import InvalidArgument
from . import tensors as T
from .context import Average, Max, Min, Product, Sum, _ctx

_MAX_DIMS = 8
_DESC = 2 + _MAX_DIMS  # int64 fields of a descriptor: dtype enum, ndim, dims


def _descriptor(t, what):
    if t.shape.rank > _MAX_DIMS:
        raise InvalidArgument(f"{what}: tensors of more than {_MAX_DIMS} dimensions are not supported "
                              f"(rank {_ctx.rank}: shape {t.shape})")
    d = np.zeros(_DESC, np.int64)
    d[0], d[1] = t.dtype.as_datatype_enum, t.shape.rank
    d[2:2 + t.shape.rank] = t.shape.as_list()
    return d


def _describe(d):
    return f"{tf.dtypes.as_dtype(int(d[0])).name}{list(int(x) for x in d[2:2 + int(d[1])])}"


def gather_descriptors(ts, what):
    """Every rank's (dtype, shape) of each tensor of `ts`: an int64 array [size, len(ts), _DESC] (one allgather)."""
    local = np.stack([_descriptor(t, what) for t in ts]) if ts else np.zeros((0, _DESC), np.int64)
    out = np.empty((_ctx.size,) + local.shape, np.int64)
    _ctx.comm.allgather(local.view(np.uint8).reshape(-1), out.view(np.uint8).reshape(-1))
    return out


def check_same(descs, what, first_dim=True):
    """InvalidArgument on every rank when some rank's dtype or shape (or, first_dim=False, shape past the first
    dimension) differs from rank 0's."""
    for r in range(1, descs.shape[0]):
        for i in range(descs.shape[1]):
            a, b = descs[0, i], descs[r, i]
            same = a[0] == b[0] and a[1] == b[1] and (
                np.array_equal(a, b) if first_dim else np.array_equal(a[3:], b[3:]))
            if not same:
                raise InvalidArgument(f"{what}: rank {r} has {_describe(b)} where rank 0 has {_describe(a)} "
                                      f"(tensor {i}; seen on rank {_ctx.rank})")


def allreduce(t, op, name, comp=None, step=0):
    """`op` over ranks of eager tensor `t` (not modified) as a new tensor; `comp` (a gradcomp Compressor) compresses
    a float tensor through the C++ compressed_allreduce under `name`, with codec step `step`."""
    what = f"gradcomp.tensorflow.allreduce('{name}')"
    check_same(gather_descriptors([t], what), what)
    if t.dtype in T.NATIVE and op in (Average, Sum):
        out = T.fresh_copy(t)
        if T.numel(out.shape) > 0:
            if comp is None:
                _ctx.comm.allreduce(T.capsule(out), op)
            else:
                _C.compressed_allreduce(_ctx.comm, comp._impl, T.capsule(out), name, op, step)
        return out
    if comp is not None:
        raise InvalidArgument(f"{what}: compression applies to float32/float16/bfloat16 tensors with Average or "
                              f"Sum, got {t.dtype.name} with {op}")
    return _reduce_stack(_gather_equal(t), op, what)


def _gather_equal(t):
    """[size, *t.shape]: every rank's `t` (shapes already checked equal)."""
    send = T.byte_view(t)
    recv = T.empty([_ctx.size * int(send.shape[0])], tf.uint8)
    if int(send.shape[0]) > 0:
        _ctx.comm.allgather(T.capsule(send), T.capsule(recv))
    return T.from_bytes(recv, t.dtype, [_ctx.size] + t.shape.as_list())


def _reduce_stack(g, op, what):
    if g.dtype == tf.bool:
        if op in (Min, Product):
            return tf.reduce_all(g, 0)
        if op == Max:
            return tf.reduce_any(g, 0)
        raise InvalidArgument(f"{what}: bool tensors reduce with Min, Max or Product only, got {op}")
    if op == Min:
        return tf.reduce_min(g, 0)
    if op == Max:
        return tf.reduce_max(g, 0)
    if op == Product:
        return tf.reduce_prod(g, 0)
    s = tf.reduce_sum(g, 0)
    if op == Sum:
        return s
    if s.dtype.is_integer:  # Horovod: an integer average is the sum scaled by 1/size, truncated toward zero
        return tf.cast(tf.cast(s, tf.float64) / _ctx.size, s.dtype)
    return s / tf.cast(_ctx.size, s.dtype)


def allgather(t, name):
    """Every rank's `t` concatenated along the first dimension, in rank order (first dimensions may differ)."""
    what = f"gradcomp.tensorflow.allgather('{name}')"
    if t.shape.rank == 0:
        t = tf.reshape(t, [1])
    descs = gather_descriptors([t], what)
    check_same(descs, what, first_dim=False)
    rows = [int(d) for d in descs[:, 0, 2]]
    row_bytes = T.numel(t.shape[1:]) * T.itemsize(t.dtype)
    recv = T.empty([sum(rows) * row_bytes], tf.uint8)
    if sum(rows) * row_bytes > 0:
        _ctx.comm.allgatherv(_bytes_arg(T.byte_view(t)), [r * row_bytes for r in rows], T.capsule(recv))
    return T.from_bytes(recv, t.dtype, [sum(rows)] + t.shape.as_list()[1:])


def _bytes_arg(b):
    """A flat uint8 tensor as a C++ byte-buffer argument; an empty one (which may have no memory) as an empty NumPy
    array."""
    return T.capsule(b) if int(b.shape[0]) > 0 else np.empty(0, np.uint8)


def broadcast(ts, root, name):
    """Rank `root`'s value of each tensor of `ts` (new tensors; shapes and dtypes checked equal first)."""
    what = f"gradcomp.tensorflow.broadcast('{name}', root_rank={root})"
    if not 0 <= root < _ctx.size:
        raise InvalidArgument(f"{what}: root_rank must be in [0, {_ctx.size})")
    check_same(gather_descriptors(ts, what), what)
    out = []
    for t in ts:
        b = T.byte_view(T.fresh_copy(t)) if t.dtype != tf.bool else T.byte_view(t)
        if int(b.shape[0]) > 0:
            _ctx.comm.broadcast(T.capsule(b), root)
        out.append(T.from_bytes(b, t.dtype, t.shape.as_list()))
    return out


def alltoall(t, splits, name):
    """Rows splits[d] of `t` (in order) to rank d; returns (the rows received, in rank order; int32 received
    splits). splits None: equal parts (the first dimension must divide by the size)."""
    what = f"gradcomp.tensorflow.alltoall('{name}')"
    if t.shape.rank == 0:
        raise InvalidArgument(f"{what}: the tensor needs at least one dimension (rank {_ctx.rank})")
    n, d0 = _ctx.size, int(t.shape[0])
    if splits is None:
        if d0 % n:
            raise InvalidArgument(f"{what}: first dimension {d0} does not divide by {n} ranks; pass splits "
                                  f"(rank {_ctx.rank})")
        splits = np.full(n, d0 // n, np.int64)
    splits = np.asarray(splits, np.int64).reshape(-1)
    if splits.size != n or (splits < 0).any() or int(splits.sum()) != d0:
        raise InvalidArgument(f"{what}: splits {splits.tolist()} must be {n} non-negative counts adding up to the "
                              f"first dimension {d0} (rank {_ctx.rank})")
    check_same(gather_descriptors([t], what), what, first_dim=False)
    rsplits = np.empty(n, np.int64)
    _ctx.comm.alltoallv(splits.view(np.uint8), [8] * n, rsplits.view(np.uint8), [8] * n)
    row_bytes = T.numel(t.shape[1:]) * T.itemsize(t.dtype)
    recv = T.empty([int(rsplits.sum()) * row_bytes], tf.uint8)
    _ctx.comm.alltoallv(_bytes_arg(T.byte_view(t)), [int(s) * row_bytes for s in splits], _bytes_arg(recv),
                        [int(s) * row_bytes for s in rsplits])
    out = T.from_bytes(recv, t.dtype, [int(rsplits.sum())] + t.shape.as_list()[1:])
    return out, tf.constant(rsplits, tf.int32)


def barrier():
    _ctx.comm.barrier()
