"""horovod.tensorflow's collectives on tf.Tensor, tf.Variable and tf.IndexedSlices, in eager mode and inside
tf.function (one py_function node per call, see tensors.run), differentiable as Horovod's: the gradient of an
allreduce is the allreduce of the gradient; of an allgather, the averaged gradient's own rows; of a broadcast, the
averaged gradient on the root and zeros elsewhere; of an alltoall, the alltoall back."""
import tensorflow as tf

from .._compressors import Compression, InvalidArgument, compressor
from . import eager_ops
from . import tensors as T
from .context import Average, Sum, _ctx, check_op, require_init
from .owners import is_horovod_codec


class ProcessSet:
    """Horovod's process set type; the TensorFlow binding runs on the global set only."""

    def __init__(self, ranks=None):
        self.ranks = ranks
        self.process_set_id = 0

    def size(self):
        return _ctx.size

    def rank(self):
        return _ctx.rank

    def included(self):
        return True

    def __repr__(self):
        return "ProcessSet(global)"


global_process_set = ProcessSet()


def _check_set(process_set, what):
    if process_set is None or process_set is global_process_set or getattr(process_set, "process_set_id", 0) == 0:
        return
    raise InvalidArgument(f"gradcomp.tensorflow.{what}: only the global process set is supported")


def _begin(tensor, name, what, process_set):
    """The checks every collective starts with; returns the tensor as a tf.Tensor and the name (default `what`)."""
    require_init()
    _check_set(process_set, what)
    return tf.convert_to_tensor(tensor), name or what


def _spec(compression):
    if compression is None or compression == Compression.none or compression == "none":
        return None
    spec = getattr(compression, "spec", compression)
    if not isinstance(spec, str):
        raise InvalidArgument(f"gradcomp.tensorflow: compression={compression!r} is neither a gradcomp codec nor a "
                              "Horovod-style compressor (compress/decompress)")
    return spec


def _scaled(t, factor):
    return t if factor == 1.0 else t * tf.cast(factor, t.dtype)


def _allreduce_dense(t, op, name, spec, prescale, postscale):
    @tf.custom_gradient
    def reduce(x):
        def eager(v):
            comp = compressor(spec) if spec is not None else None
            return [eager_ops.allreduce(v, op, name, comp)]

        y = _scaled(T.run(eager, [_scaled(x, prescale)], [x.dtype], [x.shape])[0], postscale)

        def grad(dy):
            return _allreduce_dense(dy, op, f"{name}.grad", None, prescale, postscale)
        return y, grad
    return reduce(t)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """`op` (Average by default; Sum, Min, Max, Product) over every rank of `tensor` (tf.Tensor, tf.Variable or
    tf.IndexedSlices: an allgather of values and indices, values divided by the size for Average). compression: a
    gradcomp codec (Compression.fp16, Compression.topk(0.01), "qsgd:bits=4": the C++ compressed allreduce, a fresh
    compressor per call) or a Horovod-style compressor class used around the allreduce."""
    require_init()
    op = check_op(op, average)
    _check_set(process_set, "allreduce")
    name = name or "allreduce"
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Average, Sum):
            raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
        values = allgather(tensor.values, name=f"{name}.values")
        indices = allgather(tensor.indices, name=f"{name}.indices")
        if op == Average:
            values = values / tf.cast(_ctx.size, values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    tensor = tf.convert_to_tensor(tensor)
    if is_horovod_codec(compression):
        c, ctx = compression.compress(tensor)
        return compression.decompress(_allreduce_dense(c, op, name, None, prescale_factor, postscale_factor), ctx)
    return _allreduce_dense(tensor, op, name, _spec(compression), prescale_factor, postscale_factor)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, name=None):
    """allreduce() of each tensor of the list (each compressed on its own), in order."""
    base = name or "grouped_allreduce"
    return [allreduce(t, average, device_dense, device_sparse, compression, op, prescale_factor, postscale_factor,
                      f"{base}.{i}", process_set) for i, t in enumerate(tensors)]


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Every rank's `tensor` concatenated along the first dimension, in rank order (first dimensions may differ;
    the other dimensions and the dtype must agree: InvalidArgument on every rank)."""
    tensor, name = _begin(tensor, name, "allgather", process_set)

    @tf.custom_gradient
    def gather(x):
        shape = [None] + x.shape.as_list()[1:] if x.shape.rank else [None]
        y = T.run(lambda v: [eager_ops.allgather(v, name)], [x], [x.dtype], [shape])[0]

        def grad(dy):
            summed = allreduce(dy, op=Average, name=f"{name}.grad")
            rows = allgather(tf.reshape(tf.shape(x, out_type=tf.int64)[:1] if x.shape.rank else
                                        tf.constant([1], tf.int64), [1]), name=f"{name}.grad_rows")
            start = tf.reduce_sum(rows[:_ctx.rank])
            own = summed[start:start + rows[_ctx.rank]]
            return tf.reshape(own, tf.shape(x))
        return y, grad
    return gather(tensor)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    base = name or "grouped_allgather"
    return [allgather(t, f"{base}.{i}", process_set=process_set) for i, t in enumerate(tensors)]


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Rank root_rank's `tensor` on every rank (a new tensor; shapes and dtypes must agree)."""
    tensor, name = _begin(tensor, name, "broadcast", process_set)

    @tf.custom_gradient
    def bcast(x):
        y = T.run(lambda v: eager_ops.broadcast([v], root_rank, name), [x], [x.dtype], [x.shape])[0]

        def grad(dy):
            g = allreduce(dy, op=Average, name=f"{name}.grad")
            return g if _ctx.rank == root_rank else tf.zeros_like(g)
        return y, grad
    return bcast(tensor)


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Assigns rank root_rank's values to `variables` in place (one check and broadcast round for all of them)."""
    require_init()
    _check_set(process_set, "broadcast_")
    variables = list(variables)
    if not variables:
        return None
    name = name or "broadcast_variables"
    values = [v.read_value() if hasattr(v, "read_value") else tf.convert_to_tensor(v) for v in variables]
    new = T.run(lambda *vs: eager_ops.broadcast(list(vs), root_rank, name), values, [v.dtype for v in values],
                [v.shape for v in values])
    assigns = [v.assign(n) for v, n in zip(variables, new)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Rows splits[d] of `tensor` to rank d (equal parts without splits); returns the rows received in rank order,
    and with splits given also the int32 counts received from each rank."""
    tensor, name = _begin(tensor, name, "alltoall", process_set)
    split_t = tf.zeros([0], tf.int64) if splits is None else tf.cast(tf.reshape(splits, [-1]), tf.int64)

    @tf.custom_gradient
    def exchange(x):
        def eager(v, s):
            return list(eager_ops.alltoall(v, None if splits is None else s.numpy(), name))
        out, rsplits = T.run(eager, [x, split_t], [x.dtype, tf.int32],
                             [[None] + x.shape.as_list()[1:], [_ctx.size]])

        def grad(dy, *_unused):
            back, _ = alltoall(dy, splits=rsplits, name=f"{name}.grad")
            return tf.reshape(back, tf.shape(x))
        return (out, rsplits), grad
    out, rsplits = exchange(tensor)
    return (out, rsplits) if splits is not None else out


def barrier(process_set=global_process_set):
    require_init()
    eager_ops.barrier()


def join():
    """Horovod's join() for uneven data is not supported by the TensorFlow binding."""
    raise NotImplementedError("gradcomp.tensorflow.join(): not supported (gradcomp.torch has it)")
