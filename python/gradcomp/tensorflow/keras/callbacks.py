"""horovod.tensorflow.keras.callbacks for Keras 3: the first batch's variables broadcast from the root, metrics
averaged over ranks at each epoch's end, and the learning-rate warm-up of Goyal et al. (Horovod's schedule)."""
import warnings

import keras
import tensorflow as tf

from ..collectives import allreduce
from ..context import rank, size
from ..functions import broadcast_variables


def _variables(obj):
    v = obj.variables
    return v() if callable(v) else v


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """After the first batch (the optimizer's variables exist then), every rank takes root_rank's model and
    optimizer variables."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._local_vars = set()

    def register_local_var(self, var):
        """A variable that stays each worker's own (not broadcast)."""
        self._local_vars.add(id(var))

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables([v for v in self.model.variables if id(v) not in self._local_vars], self.root_rank)
        broadcast_variables(_variables(self.model.optimizer), self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end every metric in `logs` becomes its average over the ranks (in sorted name order, so every
    rank reduces the same sequence); put it before callbacks that read the metrics."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        for metric in sorted(logs):
            value = logs[metric]
            logs[metric] = float(allreduce(tf.constant(float(value), tf.float64), name=f"metric.{metric}").numpy())


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """lr = initial_lr * multiplier(epoch) from start_epoch to end_epoch, at each epoch's first batch (staircase) or
    at every batch with a fractional epoch. momentum_correction scales a momentum held in a variable by new/old lr for
    one batch (Keras 3's SGD keeps momentum as a Python float fixed when the step is traced: left alone, warned)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.staircase, self.momentum_correction, self.steps_per_epoch = staircase, momentum_correction, \
            steps_per_epoch
        self.multiplier = multiplier if callable(multiplier) else (lambda e: multiplier ** (e - start_epoch))
        self.current_epoch = None
        self.restore_momentum = None

    def _lr(self):
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            steps = self.params.get("steps")
            if not steps:
                raise ValueError(f"Could not autodetect the number of steps per epoch; pass steps_per_epoch to "
                                 f"{type(self).__name__}()")
            self.steps_per_epoch = steps

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def _adjust(self, epoch):
        opt = self.model.optimizer
        old = self._lr()
        new = self.initial_lr * self.multiplier(epoch)
        opt.learning_rate = new
        momentum = getattr(opt, "momentum", None)
        if self.momentum_correction and momentum is not None:
            if isinstance(momentum, tf.Variable):
                self.restore_momentum = float(momentum.numpy())
                momentum.assign(self.restore_momentum * new / old)
            elif momentum and not getattr(self, "_warned", False):
                warnings.warn("momentum correction skipped: this optimizer's momentum is a Python number, fixed "
                              "when the training step was traced")
                self._warned = True

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (self.end_epoch is not None and
                                                     self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch, logs=None):
        if self.restore_momentum is not None:
            self.model.optimizer.momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = self._lr()


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's gradual warm-up: the learning rate rises from initial_lr / size to initial_lr over warmup_epochs
    (fractional epochs, batch by batch)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {self._lr():g}.")
