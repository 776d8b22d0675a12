"""How the benchmark's gradients travel: the only file that knows gradcomp's API.

wrap(comm, spec, model, optimizer) returns a Wrapped whose model/optimizer the trainer uses as-is, whose
after_backward() runs between loss.backward() and optimizer.step(), and whose payload_bytes() gives the cumulative
bytes this rank's compressor produced and the bytes of the uncompressed gradients it was given (both from gradcomp's own
per-call stats, never estimated).

comm:
  gradcomp   gradcomp.torch.DistributedOptimizer (Horovod-style), ranks under mpirun. gradcomp.torch.init() picks its
             backend: gradcomp's C++ MPI collectives when the module was built with them, else torch.distributed
             (gloo); the run's label names the one used.
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

    def wire_bytes(self) -> int | None:
        """Bytes this rank sent, as gradcomp's collectives count them (None where gradcomp does not count them)."""
        counter = getattr(self, "counter", None)
        return None if counter is None else counter.wire

    def close(self) -> None:
        """Releases the path's resources (hooks, runtime handles)."""

    def optimizer_stats(self) -> dict | None:
        """gradcomp.torch.CompressedAdam's gradcomp_stats() for exchange=momentum rows, else None."""
        stats = getattr(self.optimizer, "gradcomp_stats", None)
        return stats() if callable(stats) else None


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


class PayloadCounter:
    """Sums gradcomp's own per-call compression stats over a run: payload bytes (CompressStats.payload_bytes, header
    included; for the MPI collectives AllreduceStats.payload_bytes, which sums the chunks of scatter-reduce-allgather)
    and the uncompressed f32 bytes of the gradients compressed (CompressStats.numel x 4, AllreduceStats.input_bytes).
    """

    def __init__(self):
        self.payload = 0
        self.raw = 0
        self.wire = None   # AllreduceStats.wire_bytes summed (gradcomp's MPI collectives only)
        self.calls = 0
        self.source = "CompressStats"

    def add(self, payload: int, raw: int, wire: int | None = None) -> None:
        self.payload += int(payload)
        self.raw += int(raw)
        if wire is not None:
            self.wire = (self.wire or 0) + int(wire)
        self.calls += 1


def counting_compressor(spec: str, counter: PayloadCounter):
    """A gradcomp.Compressor for `spec` that adds each compress() call's stats to `counter`. gradcomp's DDP hook and
    DistributedOptimizer take a Compressor instance wherever they take a spec and call its compress() (torch.distributed
    paths); gradcomp's C++ MPI collectives call the codec directly and are counted by count_mpi_allreduce()."""
    import gradcomp

    class CountingCompressor(gradcomp.Compressor):
        def compress(self, tensor, *args, **kwargs):
            payload = super().compress(tensor, *args, **kwargs)
            stats = self.last_stats()
            counter.add(stats["payload_bytes"], stats["numel"] * 4)
            return payload

    return CountingCompressor(spec)


_mpi_counter: PayloadCounter | None = None
_mpi_dense: tuple | None = None   # (gradcomp 'none' compressor, N): optimizer steps < N are sent uncompressed


def count_mpi_allreduce(counter: PayloadCounter, dense: tuple | None = None) -> None:
    """Routes the stats that gradcomp's compressed_allreduce returns (one dict per call) into `counter`. With
    `dense` = (a gradcomp.Compressor('none'), N), the calls of optimizer steps 0..N-1 (the step DistributedOptimizer
    passes) use that dense codec instead of the run's: the benchmark's dense warm-up (see GradcompOptimizer)."""
    global _mpi_counter, _mpi_dense
    import gradcomp.torch as gct
    _mpi_counter = counter
    _mpi_dense = dense
    native = gct._C
    if getattr(native, "_accuracy_bench_counting", False):
        return
    original = native.compressed_allreduce

    def counted(comm, compressor, tensor, *args, **kwargs):
        if _mpi_dense is not None:
            step = args[2] if len(args) > 2 else kwargs["step"]   # (name, op, step), as backends.py calls it
            if step < _mpi_dense[1]:
                compressor = _mpi_dense[0]._impl
        stats = original(comm, compressor, tensor, *args, **kwargs)
        if _mpi_counter is not None:
            if "payload_bytes" in stats:
                _mpi_counter.add(stats["payload_bytes"], stats["input_bytes"], stats["wire_bytes"])
                _mpi_counter.source = "AllreduceStats"
            elif stats["algorithm"] not in ("sra", "hierarchical"):
                # a binding without payload_bytes: one compress() per call, so the codec's last stats are exact
                _mpi_counter.add(compressor.last_stats()["payload_bytes"], stats["input_bytes"], stats["wire_bytes"])
                _mpi_counter.source = "AllreduceStats + CompressStats"
            else:
                raise RuntimeError("gradcomp's compressed_allreduce returned no payload_bytes for a "
                                   f"'{stats['algorithm']}' call (several compress() calls): rebuild the module")
        return stats

    native.compressed_allreduce = counted
    native._accuracy_bench_counting = True


_torch_counter: PayloadCounter | None = None


def count_torch_exchanges(counter: PayloadCounter) -> None:
    """Routes the AllreduceStats of gradcomp.torch's torch.distributed exchanges (the DDP hook and the 'torch'
    backend's DistributedOptimizer, both through exchange.allreduce_async) into `counter`. Those paths run the C++
    codec directly (never CountingCompressor.compress), so without this they counted 0 bytes."""
    global _torch_counter
    from gradcomp.torch import exchange
    _torch_counter = counter
    if getattr(exchange, "_accuracy_bench_counting", False):
        return
    original = exchange.allreduce_async

    def counted(*args, stats=None, **kwargs):
        filled = {} if stats is None else stats   # filled by the exchange worker before the future completes

        def record(fut):
            if _torch_counter is not None and "payload_bytes" in filled:
                _torch_counter.add(filled["payload_bytes"], filled["input_bytes"], filled["wire_bytes"])
                _torch_counter.source = "AllreduceStats"
            return fut.value()

        return original(*args, stats=filled, **kwargs).then(record)

    exchange.allreduce_async = counted
    exchange._accuracy_bench_counting = True


class GradcompOptimizer(Wrapped):
    """Horovod-style: gradcomp.torch.DistributedOptimizer compresses and averages every gradient during backward.
    dense_steps > 0 (backend 'mpi' only) sends the first dense_steps optimizer steps uncompressed through gradcomp's
    'none' codec, then `spec` from step dense_steps on with fresh codec state: a warm-up of the optimizer's moments
    on exact gradients, as 1-bit Adam's warm-up stage (Tang et al. 2021). The warm-up's payload counts in the ratio."""

    def __init__(self, spec, model, optimizer, dense_steps: int = 0, momentum: dict | None = None):
        import gradcomp
        import gradcomp.torch as gct
        self.counter = PayloadCounter()
        gct.broadcast_parameters(model.state_dict(), root_rank=0)
        gct.broadcast_optimizer_state(optimizer, root_rank=0)
        if dense_steps > 0 and gct.backend() != "mpi":
            raise NotImplementedError("a dense warm-up (dense_steps) is implemented on gradcomp.torch backend 'mpi' "
                                      f"only, not '{gct.backend()}'")
        if gct.backend() == "mpi":
            count_mpi_allreduce(self.counter, (gradcomp.Compressor("none"), dense_steps) if dense_steps > 0 else None)
        elif gct.backend() == "torch":
            count_torch_exchanges(self.counter)
        else:
            raise NotImplementedError(f"gradcomp.torch backend '{gct.backend()}' does not report payload bytes; "
                                      "run with GRADCOMP_BACKEND=mpi (the default here) or torch")
        if momentum is not None:  # CompressedAdam: its exact and compressed exchanges are counted as above
            opt = gct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=spec,
                                           exchange="momentum", exchange_options=momentum)
        else:
            opt = gct.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                           compression=counting_compressor(spec, self.counter))
        super().__init__(model, opt, f"gradcomp.torch.DistributedOptimizer (gradcomp backend '{gct.backend()}')"
                         + (", exchange='momentum'" if momentum is not None else ""))

    def payload_bytes(self) -> tuple[int, int]:
        return self.counter.payload, self.counter.raw


class GradcompDdpHook(Wrapped):
    """torch DDP with gradcomp's comm hook on the default (gloo) process group."""

    def __init__(self, spec, model, optimizer):
        import gradcomp.torch as gct
        from torch.nn.parallel import DistributedDataParallel
        self.counter = PayloadCounter()
        count_torch_exchanges(self.counter)
        ddp = DistributedDataParallel(model)
        self.state, hook = gct.ddp_comm_hook(counting_compressor(spec, self.counter), model=model)
        ddp.register_comm_hook(self.state, hook)
        super().__init__(ddp, optimizer, "torch DDP + gradcomp.torch.ddp_comm_hook (gloo)")

    def payload_bytes(self) -> tuple[int, int]:
        return self.counter.payload, self.counter.raw


def gradcomp_available() -> bool:
    try:
        import gradcomp.torch  # noqa: F401
        return True
    except ImportError:
        return False


def wrap(comm: str, spec: str, model, optimizer, dense_steps: int = 0, momentum: dict | None = None) -> Wrapped:
    """The adapter for one run: `model` and `optimizer` are fresh and identical on every rank. dense_steps > 0: the
    first dense_steps steps go uncompressed (--comm gradcomp on backend 'mpi' only; see GradcompOptimizer).
    momentum: CompressedAdam's options: the optimizer compresses its momentum (--comm gradcomp only)."""
    if dense_steps > 0 and comm != "gradcomp":
        raise NotImplementedError(f"a dense warm-up (dense_steps) needs --comm gradcomp, not '{comm}'")
    if momentum is not None and comm != "gradcomp":
        raise NotImplementedError(f"exchange=momentum needs --comm gradcomp (DistributedOptimizer), not '{comm}'")
    if comm == "torch":
        if spec.split(":")[0] != "none":
            raise ValueError(f"--comm torch is the plain-PyTorch reference and only runs 'none', not '{spec}'")
        return TorchDense(model, optimizer)
    if comm == "gradcomp":
        return GradcompOptimizer(spec, model, optimizer, dense_steps, momentum)
    if comm == "ddp-hook":
        return GradcompDdpHook(spec, model, optimizer)
    raise ValueError(f"unknown comm '{comm}' (choose from {', '.join(COMMS)})")


def init(comm: str) -> None:
    """Per-process setup of the communication path (after the side-channel process group exists)."""
    if comm == "gradcomp":
        import gradcomp.torch as gct
        # One compressed_allreduce per gradient on gradcomp's C++ MPI communicator ("mpi") when running under mpirun
        # with a module that has it, else torch.distributed. Not the fusion "runtime" backend (gradcomp.torch's
        # default under mpirun): its RuntimeStats count input and wire bytes but not payload bytes, and fusing would
        # make the sparsifiers select over whole fusion buffers instead of per tensor. GRADCOMP_BACKEND overrides.
        import os
        under_mpi = "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ
        backend = os.environ.get("GRADCOMP_BACKEND") or \
            ("mpi" if under_mpi and getattr(gct._C, "has_collectives", False) else None)
        gct.init(backend=backend)
