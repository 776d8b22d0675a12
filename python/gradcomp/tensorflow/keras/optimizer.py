"""DistributedOptimizer for Keras 3 on the TensorFlow backend (tf.keras in TensorFlow >= 2.16): a subclass of the
wrapped optimizer's class, made from its config as Horovod does, whose gradients are reduced over every rank right
before the optimizer clips and applies them.

Where: Keras 3's BaseOptimizer applies gradients in `_backend_apply_gradients(grads, variables)` and calls
`_clip_gradients(grads)` exactly once per update (after filtering empty gradients and unscaling, before clipping,
weight decay and the update). The reduction runs there, so with backward_passes_per_step=N (Keras's own
`gradient_accumulation_steps=N`) the gradients are accumulated locally for N passes and reduced once, on the update
step, as Horovod's LocalGradientAggregationHelper does. The optimizer is one owner of compressor state
(owners.Owner): its own compressor copy, runtime scope and step."""
from ..._compressors import Compression, InvalidArgument
from ..collectives import _check_set, global_process_set
from ..context import Average, Sum, check_op, require_init
from ..gradients import gradient_names, reduce_gradients
from ..owners import Owner

_HOOKS = ("_backend_apply_gradients", "_clip_gradients")


class _Settings:
    def __init__(self, compression=Compression.none, op=Average, sparse_as_dense=False, predivide=1.0,
                 passes=1, average_aggregated=False):
        self.compression, self.op, self.sparse_as_dense = compression, op, sparse_as_dense
        self.predivide, self.passes, self.average_aggregated = float(predivide), int(passes), average_aggregated


class _DistributedMixin:
    _gradcomp_settings = _Settings()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._gradcomp_owner = Owner("optimizer", self._gradcomp_settings.compression)
        self._gradcomp_names = ()

    def _backend_apply_gradients(self, grads, trainable_variables):
        # Names only: a list of variables held here would be tracked (and saved) as the optimizer's own variables.
        self._gradcomp_names = tuple(gradient_names(trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        s = self._gradcomp_settings
        grads = list(grads)
        if s.passes > 1 and not s.average_aggregated:
            # Keras averages the accumulated passes; Horovod's default (average_aggregated_gradients=False) sums them.
            grads = [None if g is None else g * s.passes for g in grads]
        grads = reduce_gradients(self._gradcomp_owner, grads, list(self._gradcomp_names), s.op,
                                 s.sparse_as_dense, s.predivide)
        return super()._clip_gradients(grads)


def distributed_class(base, settings):
    """The class of base's optimizers with gradcomp's reduction (named and placed as `base`, so a saved model's
    optimizer reads back as the plain optimizer without gradcomp)."""
    missing = [h for h in _HOOKS if not hasattr(base, h)]
    if missing:
        raise InvalidArgument(f"gradcomp.tensorflow.keras.DistributedOptimizer: {base.__name__} has no "
                              f"{', '.join(missing)}: a Keras 3 optimizer (keras >= 3.0 on TensorFlow) is needed")
    return type(base.__name__, (_DistributedMixin, base), {"_gradcomp_settings": settings,
                                                           "__module__": base.__module__})


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """A new optimizer of `optimizer`'s class and config whose gradients are averaged (op=Average) or summed (Sum)
    over every rank before each update, each compressed with `compression` (a gradcomp codec, with its error
    feedback, or a Horovod-style compressor class). backward_passes_per_step=N: gradients accumulate locally for N
    passes and are reduced once (summed, or averaged with average_aggregated_gradients=True). Wrap a fresh optimizer
    (its variables are made on the first update)."""
    require_init()
    op = check_op(op)
    if op not in (Average, Sum):
        raise InvalidArgument(f"DistributedOptimizer: op must be Average or Sum, got {op}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if int(backward_passes_per_step) < 1:
        raise InvalidArgument(f"DistributedOptimizer: backward_passes_per_step must be >= 1, got "
                              f"{backward_passes_per_step}")
    _check_set(process_set, "DistributedOptimizer")
    settings = _Settings(compression, op, sparse_as_dense, gradient_predivide_factor, backward_passes_per_step,
                         average_aggregated_gradients)
    config = optimizer.get_config()
    if settings.passes > 1:
        if config.get("gradient_accumulation_steps"):
            raise InvalidArgument("DistributedOptimizer: the optimizer already accumulates gradients "
                                  "(gradient_accumulation_steps); pass backward_passes_per_step instead")
        config["gradient_accumulation_steps"] = settings.passes
    if name is not None:
        config["name"] = name
    return distributed_class(type(optimizer), settings).from_config(config)
