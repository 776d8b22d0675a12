"""TensorFlow tensors as the C++ library takes them: DLPack capsules of an eager tensor's own memory (zero copy),
byte views of any dtype (bitcast, zero copy), fresh buffers to write results into, and the py_function boundary that
runs a collective's eager code from inside a tf.function.

TensorFlow tensors are immutable and their buffers may be shared (two gradients can be the same tensor, a small
constant may be cached), so a result is never written into an input: it goes into a buffer made for it
(`fresh_copy`: one copy of the input, where Horovod's op copies into its output or fusion buffer too; `empty`:
uninitialized) and that buffer, which nothing else references, is returned as the result tensor."""
import numpy as np
import tensorflow as tf

from .._compressors import InvalidArgument

# The element types the C++ reductions and codecs take; others are gathered and reduced with TensorFlow ops.
NATIVE = (tf.float32, tf.float16, tf.bfloat16)


def capsule(t):
    """A DLPack capsule of eager tensor `t`'s memory (shared, not copied); keep `t` alive while C++ uses it."""
    return tf.experimental.dlpack.to_dlpack(t)


def fresh_copy(t):
    """A copy of `t` in a buffer of its own (a result may be written into it)."""
    return tf.raw_ops.DeepCopy(x=t)


def empty(shape, dtype):
    """An uninitialized tensor of its own buffer."""
    return tf.raw_ops.Empty(shape=tf.constant(list(shape), tf.int32), dtype=dtype)


def byte_view(t):
    """`t`'s bytes as a flat uint8 tensor sharing its memory (bool is cast: TensorFlow cannot bitcast it)."""
    if t.dtype == tf.bool:
        t = tf.cast(t, tf.uint8)
    if t.dtype == tf.string or t.dtype == tf.resource or t.dtype == tf.variant:
        raise InvalidArgument(f"gradcomp.tensorflow: tensors of dtype {t.dtype.name} cannot be communicated")
    if t.dtype != tf.uint8:
        t = tf.bitcast(t, tf.uint8)
    return tf.reshape(t, [-1])


def from_bytes(b, dtype, shape):
    """The tensor of `dtype` and `shape` whose bytes are the uint8 tensor `b` (shared memory; bool is cast)."""
    if dtype == tf.bool:
        return tf.reshape(tf.cast(b, tf.bool), shape)
    if dtype != tf.uint8:
        b = tf.bitcast(tf.reshape(b, [-1, dtype.size]), dtype)
    return tf.reshape(b, shape)


def itemsize(dtype):
    return 1 if dtype == tf.bool else dtype.size


def numel(shape):
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def run(fn, inputs, touts, shapes):
    """fn(*inputs) (eager tensors in, a list of tensors out) now when executing eagerly; inside a tf.function a
    tf.py_function node that runs it eagerly at execution time, its outputs given `shapes` (None dims unknown).
    py_function nodes are stateful, so a tf.function runs them in program order (automatic control dependencies):
    every rank issues its collectives in the same order."""
    if tf.executing_eagerly():
        return list(fn(*inputs))
    outs = tf.py_function(fn, list(inputs), list(touts))
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for o, s in zip(outs, shapes):
        o.set_shape(s)
    return outs
