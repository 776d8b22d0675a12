"""The gradient reduction shared by DistributedGradientTape and the Keras DistributedOptimizer: each dense gradient
compressed with its owner's codec and reduced by the C++ path of init()'s backend, all of a step's gradients in one
call (eagerly, or one py_function node inside a tf.function); sparse gradients (tf.IndexedSlices) allgathered as
Horovod does, or densified with sparse_as_dense.

On the "runtime" backend every gradient is submitted to the fusion runtime (Runtime.allreduce_async with the owner's
compressor, scope and step), then all are waited for: the runtime fuses them and negotiates by name, so ranks need not
submit in the same order. On "mpi" and "torch" each gradient is one compressed_allreduce on the world communicator,
in the order of the variables."""
import tensorflow as tf

from .. import _gradcomp as _C
from . import eager_ops
from . import tensors as T
from .context import Average, Sum, _ctx


def gradient_names(variables):
    """Names unique within an owner and equal on every rank: position and variable name ("3.dense/kernel")."""
    names = []
    for i, v in enumerate(variables):
        label = getattr(v, "path", None) or getattr(v, "name", None) or "tensor"
        names.append(f"{i}.{label}")
    return names


def _reduce_eager(owner, names, op, grads):
    """The owner's reduction of eager gradients (a list of new tensors); the owner's step advances once per call."""
    step = owner.step
    owner.step += 1
    outs = [T.fresh_copy(g) for g in grads]
    comp = owner.compressor
    if _ctx.runtime is not None:
        handles, first_error = [], None
        for name, o in zip(names, outs):
            try:
                if o.dtype in T.NATIVE and T.numel(o.shape) > 0:
                    handles.append(_ctx.runtime.allreduce_async(name, T.capsule(o), op=op, compressor=comp._impl,
                                                                scope=owner.scope, step=step))
            except Exception as e:  # an error fails its own tensor; the others still complete
                first_error = first_error or e
        for h in handles:
            try:
                _ctx.runtime.wait(h)
            except Exception as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error
    else:
        for name, o in zip(names, outs):
            if o.dtype in T.NATIVE and T.numel(o.shape) > 0:
                _C.compressed_allreduce(_ctx.comm, comp._impl, T.capsule(o), name, op, step)
    for i, (name, o) in enumerate(zip(names, outs)):
        if o.dtype not in T.NATIVE:  # float64 and other dtypes: the exact gathered reduction, uncompressed
            outs[i] = eager_ops.allreduce(grads[i], op, name)
    return outs


def _sparse(g, op, name):
    from .collectives import allgather  # the public, graph-aware allgather
    values = allgather(g.values, name=f"{name}.values")
    indices = allgather(g.indices, name=f"{name}.indices")
    if op == Average:
        values = values / tf.cast(_ctx.size, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=g.dense_shape)


def reduce_gradients(owner, grads, names, op=Average, sparse_as_dense=False, predivide=1.0):
    """`grads` (tensors, tf.IndexedSlices or None) reduced over every rank with `op` (Average or Sum), in a new list
    of the same structure. predivide (Horovod's gradient_predivide_factor, op Average): the gradients are scaled by
    1/predivide before the sum and by predivide/size after it."""
    out = list(grads)
    dense = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if not sparse_as_dense:
                out[i] = _sparse(g, op, names[i])
                continue
            g = tf.convert_to_tensor(g)
        dense.append(i)
        out[i] = tf.convert_to_tensor(g)
    if not dense:
        return out
    reduce_op = op
    if predivide != 1.0:
        reduce_op = Sum
        for i in dense:
            out[i] = out[i] * tf.cast(1.0 / predivide, out[i].dtype)
    if owner.horovod_codec is not None:
        from .collectives import allreduce
        for i in dense:
            c, ctx = owner.horovod_codec.compress(out[i])
            out[i] = owner.horovod_codec.decompress(allreduce(c, op=reduce_op, name=names[i]), ctx)
    else:
        ins = [out[i] for i in dense]
        sub = [names[i] for i in dense]
        reduced = T.run(lambda *gs: _reduce_eager(owner, sub, reduce_op, list(gs)), ins, [g.dtype for g in ins],
                        [g.shape for g in ins])
        for i, r in zip(dense, reduced):
            out[i] = r
    if predivide != 1.0:
        for i in dense:
            out[i] = out[i] * tf.cast(predivide / _ctx.size, out[i].dtype)
    return out
