"""The C++ TorchCommunicator (gradcomp's Communicator over a torch.distributed gloo group), driven through its
Communicator bindings on 3 spawned ranks: closed-form results of every operation, half-precision sums in float32
(identical bits on every rank, for the split sum and the small-buffer path), the bytes the Python collectives' allreduce
sends, split into sub-groups, and the timeout."""
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradcomp
import helpers
from gradcomp import _gradcomp as _C
from gradcomp.torch import comm_ops
from gradcomp.torch import exchange as _torch_comm

WORLD = 3


def _same_on_every_rank(t):
    bits = t.view(torch.uint8)  # gloo cannot gather bfloat16
    gathered = [torch.zeros_like(bits) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, bits)
    return all(torch.equal(g, bits) for g in gathered)


def _check_half_sums(comm, rank, world):
    for dtype in (torch.float16, torch.bfloat16):
        # 300k values: 600 KB, under the split-sum threshold (float32 allreduce); 600k and 700k values: split sum, in
        # place (divides by 3) and through the padded buffer.
        for numel in (1000, 300_001, 600_000, 700_001):
            parts = [torch.randn(numel, generator=torch.Generator().manual_seed(7 * r + numel)).to(dtype)
                     for r in range(world)]
            for op in ("sum", "average"):
                t = parts[rank].clone()
                comm.allreduce(t, op)
                acc = parts[0].float()
                for r in range(1, world):
                    acc += parts[r]
                if op == "average":
                    acc /= world
                expected = acc.to(dtype)
                assert _same_on_every_rank(t), f"{dtype} {numel} {op}: ranks differ"
                if numel * 2 >= _torch_comm.SPLIT_SUM_MIN_BYTES:
                    # Split sum: float32 in rank order, one rounding: exactly the reference.
                    assert torch.equal(t, expected), f"{dtype} {numel} {op}: split sum differs from the f32 reference"
                else:
                    # gloo's float32 allreduce may add in another order: one rounding of the wire dtype at most.
                    ulp = 1e-3 if dtype == torch.float16 else 8e-3
                    err = ((t.float() - expected.float()).abs() / expected.float().abs().clamp_min(1e-3)).max()
                    assert float(err) <= ulp, f"{dtype} {numel} {op}: relative error {float(err)}"


def _check_bytes(comm, rank, world):
    # allgather: world blocks in rank order.
    send = torch.full((5,), rank + 1, dtype=torch.uint8)
    recv = torch.zeros(5 * world, dtype=torch.uint8)
    comm.allgather(send, recv)
    assert recv.tolist() == [r + 1 for r in range(world) for _ in range(5)]
    # allgatherv with a zero-length block.
    counts = [3 * r for r in range(world)]
    send = torch.full((counts[rank],), 10 + rank, dtype=torch.uint8)
    recv = torch.zeros(sum(counts), dtype=torch.uint8)
    comm.allgatherv(send, counts, recv)
    assert recv.tolist() == [10 + r for r in range(world) for _ in range(counts[r])]
    # alltoallv: rank s sends (s + d) % 3 bytes of value 16 s + d to rank d.
    send_counts = [(rank + d) % 3 for d in range(world)]
    send = torch.tensor([16 * rank + d for d in range(world) for _ in range(send_counts[d])], dtype=torch.uint8)
    recv_counts = [(s + rank) % 3 for s in range(world)]
    recv = torch.zeros(sum(recv_counts), dtype=torch.uint8)
    comm.alltoallv(send, send_counts, recv, recv_counts)
    assert recv.tolist() == [16 * s + rank for s in range(world) for _ in range(recv_counts[s])]
    # broadcast from the last rank; f32 and i32 sums.
    buf = torch.full((7,), rank, dtype=torch.uint8)
    comm.broadcast(buf, world - 1)
    assert buf.tolist() == [world - 1] * 7
    x = torch.full((4,), float(rank + 1))
    comm.allreduce(x, "sum")
    assert x.tolist() == [world * (world + 1) / 2] * 4
    comm.barrier()


def _check_python_allreduce_bytes(comm, adapter, rank, world):
    """comm_ops.allreduce of what the Communicator's allreduce does not take (float64 sum and average, int32 max,
    float16 sum; an odd length, so the last chunk is padded): each rank sends about 2(n-1)/n of the tensor's bytes
    (adapter.sent_bytes), as a ring allreduce, not the (n-1) copies of an allgather; the result is the reduction in
    rank order (half precision in float32, rounded once), the same bits on every rank."""
    numel = 3 * 4096 + 1
    cases = [(torch.float64, "sum"), (torch.float64, "average"), (torch.int32, "max"), (torch.float16, "sum")]
    for dtype, op in cases:
        gen = [torch.Generator().manual_seed(11 * r + 5) for r in range(world)]
        parts = [(torch.randn(numel, generator=g) * 1000).to(dtype) for g in gen]
        acc = parts[0].float() if dtype == torch.float16 else parts[0].clone()
        for p in parts[1:]:
            acc = torch.maximum(acc, p) if op == "max" else acc + p
        expected = (acc / world if op == "average" else acc).to(dtype)
        before = adapter.sent_bytes
        got = comm_ops.allreduce(parts[rank], op, comm)
        sent = adapter.sent_bytes - before
        nbytes = numel * parts[rank].element_size()
        assert torch.equal(got, expected), f"{dtype} {op}: differs from the reduction in rank order"
        assert _same_on_every_rank(got), f"{dtype} {op}: ranks differ"
        chunk = -(-numel // world) * parts[rank].element_size()
        assert sent <= 2 * (world - 1) * chunk, f"{dtype} {op}: sent {sent} bytes for a tensor of {nbytes}"
        assert sent < (world - 1) * nbytes, f"{dtype} {op}: sent {sent} bytes, an allgather's worth"


def _check_split(comm, rank, world):
    # Even and odd ranks; the last rank sits out (negative color).
    color = -1 if rank == world - 1 else rank % 2
    child = comm.split(color, rank)
    if color < 0:
        assert child is None
        return
    members = [r for r in range(world - 1) if r % 2 == color]
    assert (child.rank, child.size) == (members.index(rank), len(members))
    assert child.backend == "torch:gloo" and abs(child.timeout_s - comm.timeout_s) < 1e-3
    x = torch.full((3,), float(rank))
    child.allreduce(x, "sum")
    assert x.tolist() == [float(sum(members))] * 3


def _check_timeout(comm, rank):
    """Rank 0 waits alone past a 1 s deadline: gradcomp.Timeout naming its rank; then the others join the pending
    collective so the group drains."""
    comm.timeout_s = 1.0
    x = torch.ones(4)
    if rank == 0:
        start = time.monotonic()
        try:
            comm.allreduce(x, "sum")
        except gradcomp.Timeout as e:
            assert "rank 0 of" in str(e) and "allreduce" in str(e), str(e)
            assert time.monotonic() - start < 20
        else:
            raise AssertionError("allreduce with absent peers did not time out")
        dist.barrier()  # tells the others to join (queued behind the pending allreduce, so gloo completes both)
    else:
        time.sleep(3)
        comm.timeout_s = 60.0
        comm.allreduce(x, "sum")
        dist.barrier()


def _worker(rank, world, url):
    helpers.init_gloo(rank, world, url)
    adapter = _torch_comm.ProcessGroupAdapter()
    comm = _C.TorchCommunicator(adapter)
    assert (comm.rank, comm.size, comm.backend) == (rank, world, "torch:gloo")
    assert abs(comm.timeout_s - 90.0) < 1e-3, comm.timeout_s  # the process group's own timeout
    _check_bytes(comm, rank, world)
    _check_half_sums(comm, rank, world)
    _check_python_allreduce_bytes(comm, adapter, rank, world)
    _check_split(comm, rank, world)
    _check_timeout(comm, rank)
    del comm
    dist.destroy_process_group()


def test_torch_communicator_3_ranks():
    mp.spawn(_worker, args=(WORLD, helpers.rendezvous()), nprocs=WORLD, join=True)
