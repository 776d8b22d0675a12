"""DistributedOptimizer(op=Adasum) on more than one rank: Horovod's delta optimizer (_DistributedAdasumOptimizer).
Each rank applies the wrapped optimizer's step to its own gradients; the parameters' deltas (new - start) are
combined with Adasum (adasum.py), each through the compression's compress/decompress (none, fp16 or a Horovod-style
compressor: Adasum is a reduction, so gradcomp's lossy codecs do not apply and raise); the parameters become
start + combined delta. Gradients accumulated over backward_passes_per_step passes are divided by that count (as
gradcomp's optimizer does). Horovod steps one parameter at a time; here the wrapped step runs once over all of them
(the same for optimizers that update each parameter from its own state: SGD, Adam, ...). As in Horovod, synchronize()
does nothing and skip_synchronize() raises."""
import contextlib

import torch

from .._compressors import Compression, CompressionSpec, InvalidArgument, _is_horovod_style
from .adasum import adasum_allreduce_, check_size
from .context import _ctx


def _adasum_compression(compression):
    if compression is None:
        return Compression.none
    if isinstance(compression, CompressionSpec):
        if compression.spec in ("none", "fp16"):
            return Compression.none if compression.spec == "none" else Compression.fp16
    elif _is_horovod_style(compression):
        return compression
    raise InvalidArgument(f"DistributedOptimizer(op=Adasum): compression {compression!r} is not supported: Adasum is "
                          "a reduction of the full tensors; use Compression.none, Compression.fp16 or a Horovod-style "
                          "compressor (compress(tensor) -> (tensor, ctx), decompress(tensor, ctx))")


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def _adasum_setup(self, named_parameters, compression, backward_passes_per_step):
        check_size(_ctx.size)
        self._adasum_compression = _adasum_compression(compression)
        self._op = "adasum"
        if named_parameters is not None:
            named = list(named_parameters)
            if len({n for n, _ in named}) != len(named):
                raise InvalidArgument("DistributedOptimizer: named_parameters has duplicate names")
        self._handles = {}
        self.set_backward_passes_per_step(backward_passes_per_step)

    def set_backward_passes_per_step(self, passes):
        passes = int(passes)
        if passes < 1:
            raise InvalidArgument(f"DistributedOptimizer: backward_passes_per_step must be >= 1, got {passes}")
        self._backward_passes_per_step = passes
        self.backward_passes_per_step = passes

    def synchronize(self):
        """Nothing to do: the deltas are combined in step() (Horovod's Adasum optimizer does the same)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if self._backward_passes_per_step > 1:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(self._backward_passes_per_step)
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
            super(self.__class__, self).step()
            comp = self._adasum_compression
            for p, start in zip(params, starts):  # the same order on every rank
                delta = p.detach() - start
                compressed, ctx = comp.compress(delta)
                compressed = compressed.contiguous()
                adasum_allreduce_(compressed)
                p.copy_(start + comp.decompress(compressed, ctx).view_as(p).to(p.dtype))
        return loss
