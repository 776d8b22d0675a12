"""gradcomp.torch's Python collectives on CUDA tensors (issue 19: Horovod's API takes tensors on any device): on the
torch backend with gloo (two spawned ranks sharing the machine's first GPU) every call gives, on the tensor's own
device, exactly what the same call gives for the CPU copy (the CPU results are checked against references in
test_hvd_collectives_mpi.py); gradients of the differentiable calls come back on the device too. Skipped, with the
reason, where torch has no CUDA device (label gpu; bench/gpu/check.sh runs it)."""
import os

import pytest
import torch
import torch.multiprocessing as mp

import gradcomp.torch as hvd
import helpers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA tests skipped: torch has no CUDA device")


def _x(rank, dtype=torch.float32):
    return (torch.arange(12, dtype=torch.float64).view(4, 3) % 5 + rank - 1).to(dtype)


def _same(got, want, what):
    assert got.device.type == "cuda", f"{what}: result on {got.device}, expected the input's CUDA device"
    assert torch.equal(got.cpu(), want), f"{what}: {got.cpu()} != {want}"


def _worker(rank, world, url):
    helpers.watchdog()
    os.environ.update(GRADCOMP_INIT_METHOD=url, RANK=str(rank), WORLD_SIZE=str(world), GRADCOMP_TORCH_PG="gloo",
                      LOCAL_WORLD_SIZE=str(world))
    hvd.init(backend="torch")
    dev = torch.device("cuda", 0)
    for dtype in (torch.float32, torch.float64, torch.int64):
        x = _x(rank, dtype)
        for op in (hvd.Average, hvd.Sum, hvd.Max):
            _same(hvd.allreduce(x.to(dev), op=op), hvd.allreduce(x, op=op), f"allreduce {dtype} {op}")
        y = x.to(dev, copy=True)
        hvd.allreduce_(y, op=hvd.Sum)
        _same(y, hvd.allreduce(x, op=hvd.Sum), f"allreduce_ {dtype}")
        _same(hvd.allgather(x[:rank + 1].to(dev)), hvd.allgather(x[:rank + 1]), f"allgather {dtype}")
        _same(hvd.broadcast(x.to(dev), root_rank=1), hvd.broadcast(x, root_rank=1), f"broadcast {dtype}")
        z = x.to(dev, copy=True)
        hvd.broadcast_(z, root_rank=1)
        _same(z, hvd.broadcast(x, root_rank=1), f"broadcast_ {dtype}")
        _same(hvd.alltoall(x.to(dev)), hvd.alltoall(x), f"alltoall {dtype}")
        _same(hvd.reducescatter(x.to(dev), op=hvd.Sum), hvd.reducescatter(x, op=hvd.Sum), f"reducescatter {dtype}")
    grouped = hvd.grouped_allreduce([_x(rank).to(dev), _x(rank + 1).to(dev)])
    for g, want in zip(grouped, hvd.grouped_allreduce([_x(rank), _x(rank + 1)])):
        _same(g, want, "grouped_allreduce")
    _same(hvd.synchronize(hvd.allreduce_async(_x(rank).to(dev))), hvd.allreduce(_x(rank)), "allreduce_async")
    leaf = _x(rank).to(dev).requires_grad_()
    (hvd.allreduce(leaf) * (rank + 1)).sum().backward()
    cpu_leaf = _x(rank).requires_grad_()
    (hvd.allreduce(cpu_leaf) * (rank + 1)).sum().backward()
    _same(leaf.grad, cpu_leaf.grad, "allreduce gradient")
    bn = hvd.SyncBatchNorm(3).to(dev)
    cpu_bn = hvd.SyncBatchNorm(3)
    batch = torch.randn(4, 3, generator=torch.Generator().manual_seed(rank))
    assert torch.allclose(bn(batch.to(dev)).cpu(), cpu_bn(batch), atol=1e-5), "SyncBatchNorm on CUDA"
    hvd.shutdown()


def test_python_collectives_on_cuda_tensors():
    mp.spawn(_worker, args=(2, helpers.rendezvous()), nprocs=2, join=True)
