"""SyncBatchNorm: batch normalization whose training statistics are those of the batch of all ranks together
(horovod.torch.SyncBatchNorm's semantics), on CPU and CUDA tensors (Horovod's requires a GPU: it uses torch's CUDA
batch-norm kernels; this one is written in torch operations, so it runs wherever the collectives do).

Training: per channel, the sum of the local batch and its element count are summed over the ranks (one allreduce),
giving the global mean; then the sum of squared deviations from it (a second allreduce) gives the global biased
variance, used to normalize; the running mean and the unbiased variance (count N - 1) are updated with `momentum`
(or the cumulative average when momentum is None), as torch's BatchNorm does over the concatenated batch. Both
allreduces are differentiable (backward: the sum over ranks of the incoming gradients), so autograd produces the
gradients of a BatchNorm over the concatenated batch. Statistics are computed in float32 at least. Evaluation, or
one rank: torch's batch_norm with the running statistics. ``process_set``: the global set only for now."""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .._compressors import InvalidArgument
from .context import _ctx, _require_init
from .process_sets import global_process_set
from . import comm_ops as _ops


def _allreduce_sum(t):
    return _ops.allreduce(t, "sum", global_process_set.communicator())  # any device (comm_ops.py)


class _AllreduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return _allreduce_sum(t)

    @staticmethod
    def backward(ctx, grad):
        return _allreduce_sum(grad)


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d (input of 2 or more dimensions, channels in dimension 1) with the
    statistics of every rank's batch; ``hvd.SyncBatchNorm(num_features, eps, momentum, affine, track_running_stats,
    process_set)``."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        from .optimizer import check_process_set
        self.process_set = check_process_set(process_set, "SyncBatchNorm") if process_set is not None else None

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise InvalidArgument(f"SyncBatchNorm: expected 2D or more input (got {input.dim()}D input)")

    def forward(self, input):
        _require_init()
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        factor = 0.0
        if self.training and self.track_running_stats:
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if _ctx.size == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True, factor,
                                self.eps)
        return self._sync_forward(input, factor)

    def _sync_forward(self, input, factor):
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        shape = [1, c] + [1] * (input.dim() - 2)
        work = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
        x = input.to(work)
        local_n = input.numel() // c if c else 0
        first = _AllreduceSum.apply(torch.cat([x.sum(dims), x.new_tensor([float(local_n)])]))
        total = float(first[-1].detach())
        if total <= 1:
            raise InvalidArgument(f"SyncBatchNorm: expected more than 1 value per channel over all ranks when "
                                  f"training, got {int(total)}")
        mean = first[:-1] / total
        centered = x - mean.view(shape)
        var = _AllreduceSum.apply((centered * centered).sum(dims)) / total
        y = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            y = y * self.weight.to(work).view(shape) + self.bias.to(work).view(shape)
        if self.training and self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach().to(self.running_mean.dtype) * factor)
                unbiased = var.detach() * total / (total - 1)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype) * factor)
        return y.to(input.dtype)
