"""How the benchmark's gradients travel: the only file that knows gradcomp's API.

wrap(comm, spec, model, optimizer) returns a Wrapped whose model/optimizer the trainer uses as-is, whose
after_backward() runs between loss.backward() and optimizer.step(), and whose payload_bytes() gives the cumulative
bytes this rank's compressor produced and the bytes of the uncompressed gradients it was given (both from gradcomp's own
per-call stats, never estimated).

comm:
  gradcomp   gradcomp.torch.DistributedOptimizer on gradcomp's C++ runtime over MPI (run under mpirun; the product's
             path, Horovod-style).
  ddp-hook   torch DistributedDataParallel with gradcomp.torch.ddp_comm_hook(spec) on a gloo process group.
  torch      reference without gradcomp: a flat dense torch.distributed.all_reduce of the f32 gradients (spec 'none'
             only; its byte count is the f32 tensor that all_reduce is given).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

COMMS = ("gradcomp", "ddp-hook", "torch")


class Wrapped:
    """A model and an optimizer to train with, plus what the communication path knows about its traffic."""

    def __init__(self, model, optimizer, label: str):
        self.model = model
        self.optimizer = optimizer
        self.label = label

    def after_backward(self) -> None:
        """Runs after loss.backward(), before optimizer.step()."""

    def payload_bytes(self) -> tuple[int, int]:
        """(compressed payload bytes, uncompressed f32 gradient bytes) this rank produced so far."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases the path's resources (hooks, runtime handles)."""


class TorchDense(Wrapped):
    """Plain PyTorch data parallelism: one flat f32 all_reduce per step, then divide by the world size."""

    def __init__(self, model, optimizer):
        super().__init__(model, optimizer, "torch.distributed dense all_reduce (gloo)")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.sent = 0

    def after_backward(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for p in self.params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        self.sent += flat.numel() * flat.element_size()

    def payload_bytes(self) -> tuple[int, int]:
        return self.sent, self.sent


def _stats_bytes(stats) -> tuple[int, int]:
    """(payload, raw) from gradcomp's stats object or dict."""
    get = (lambda k: stats[k]) if isinstance(stats, dict) else (lambda k: getattr(stats, k))
    return int(get("payload_bytes")), int(get("raw_bytes"))


class GradcompOptimizer(Wrapped):
    """Horovod-style: gradcomp.torch.DistributedOptimizer compresses and averages every gradient during backward."""

    def __init__(self, spec, model, optimizer):
        import gradcomp
        import gradcomp.torch as gct
        gct.broadcast_parameters(model.state_dict(), root_rank=0)
        gct.broadcast_optimizer_state(optimizer, root_rank=0)
        opt = gct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                       compression=gradcomp.Compression.from_spec(spec)
                                       if hasattr(gradcomp.Compression, "from_spec") else spec)
        super().__init__(model, opt, "gradcomp.torch.DistributedOptimizer (gradcomp runtime, MPI)")

    def payload_bytes(self) -> tuple[int, int]:
        return _stats_bytes(self.optimizer.stats())

    def close(self) -> None:
        close = getattr(self.optimizer, "close", None)
        if close:
            close()


class GradcompDdpHook(Wrapped):
    """torch DDP with gradcomp's comm hook on the default (gloo) process group."""

    def __init__(self, spec, model, optimizer):
        import gradcomp.torch as gct
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model)
        self.state, hook = gct.ddp_comm_hook(spec)
        ddp.register_comm_hook(self.state, hook)
        super().__init__(ddp, optimizer, "torch DDP + gradcomp.torch.ddp_comm_hook (gloo)")

    def payload_bytes(self) -> tuple[int, int]:
        return _stats_bytes(self.state.stats())


def gradcomp_available() -> bool:
    try:
        import gradcomp.torch  # noqa: F401
        return True
    except ImportError:
        return False


def wrap(comm: str, spec: str, model, optimizer) -> Wrapped:
    """The adapter for one run: `model` and `optimizer` are fresh and identical on every rank."""
    if comm == "torch":
        if spec.split(":")[0] != "none":
            raise ValueError(f"--comm torch is the plain-PyTorch reference and only runs 'none', not '{spec}'")
        return TorchDense(model, optimizer)
    if comm == "gradcomp":
        return GradcompOptimizer(spec, model, optimizer)
    if comm == "ddp-hook":
        return GradcompDdpHook(spec, model, optimizer)
    raise ValueError(f"unknown comm '{comm}' (choose from {', '.join(COMMS)})")


def init(comm: str) -> None:
    """Per-process setup of the communication path (after the side-channel process group exists)."""
    if comm == "gradcomp":
        import gradcomp.torch as gct
        gct.init()
