"""DistributedGradientTape: a tf.GradientTape whose gradient() returns gradients reduced over every rank, each
compressed with the tape owner's codec (owners.py: the owner is the variables differentiated, with the spec)."""
import tensorflow as tf

from .._compressors import Compression, InvalidArgument
from .collectives import _check_set, global_process_set
from .context import Average, Sum, check_op, require_init
from .gradients import gradient_names, reduce_gradients
from .owners import Owner, owner_for_variables


class _DistributedTape:
    """Mixed in before the wrapped tape's class: gradient() reduces what the tape computed."""

    def gradient(self, target, sources, output_gradients=None, unconnected_gradients=tf.UnconnectedGradients.NONE,
                 use_generic_names=False):
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        owner = self._gradcomp_owner(flat_sources)
        names = gradient_names(flat_sources)
        reduced = reduce_gradients(owner, flat_grads, names, self._gradcomp_op, self._gradcomp_sparse_as_dense,
                                   self._gradcomp_predivide)
        return tf.nest.pack_sequence_as(grads, reduced)

    def _gradcomp_owner(self, sources):
        owner = owner_for_variables("tape", self._gradcomp_compression, sources)
        if owner is None:
            if self._gradcomp_own is None:
                self._gradcomp_own = Owner("tape", self._gradcomp_compression)
            owner = self._gradcomp_own
        return owner


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps `gradtape` (entered already or not) so that gradient() averages (op=Average) or sums (op=Sum) each
    gradient over every rank, compressed with `compression` (Compression.none, fp16, topk(0.01), ..., with error
    feedback in the codec's state, or a Horovod-style compressor class). Sparse gradients (tf.IndexedSlices) are
    allgathered, or densified first with sparse_as_dense=True. gradient_predivide_factor as Horovod's (op Average).
    groups/num_groups are accepted (each gradient is still compressed alone; the runtime fuses by size)."""
    require_init()
    op = check_op(op)
    if op not in (Average, Sum):
        raise InvalidArgument(f"DistributedGradientTape: op must be Average or Sum, got {op}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    _check_set(process_set, "DistributedGradientTape")
    cls = type(gradtape.__class__.__name__, (_DistributedTape, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording (the C++ tape object), persistence and watches
    tape._gradcomp_compression = compression
    tape._gradcomp_op = op
    tape._gradcomp_sparse_as_dense = sparse_as_dense
    tape._gradcomp_predivide = float(gradient_predivide_factor)
    tape._gradcomp_own = None
    return tape
