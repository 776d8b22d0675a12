"""hvd.join() served by notes (join_notes.py), on the backend GRADCOMP_BACKEND names, under mpirun: a DistributedOptimizer
step whose exchange is already waiting for the rank when it joins, and one that begins after the rank's JOIN note
came; sparse gradients and grouped allreduces with a joined rank; three joins in a row (each rank in turn joining
first); collectives join() does not serve refused while a rank is joined; a joined rank waiting out the others'
stretch without served operations longer than the timeout (their ALIVE notes); a parameter unfrozen after the
optimizer was made and a gradient only some ranks have (zeros elsewhere, as Horovod), with a rank joined; and no note
at all while no rank is joined. Every result is checked against sums computed here."""
import sys
import time

import torch

import gradcomp
import gradcomp.torch as hvd
from gradcomp.torch import join_notes
from gradcomp.torch.context import _ctx

LR = 0.5


def _close(got, want, what, atol=1e-6):
    if not torch.allclose(got, want, atol=atol):
        raise AssertionError(f"rank {hvd.rank()} ({hvd.backend()}): {what}: got {got.flatten()[:6].tolist()}, want "
                             f"{want.flatten()[:6].tolist()}")


def _grad_of(rank, step):
    return torch.arange(12, dtype=torch.float32).view(3, 4) * (rank + 1) + step


def _optimizer(tag, **options):
    w = torch.nn.Parameter(torch.zeros(3, 4))
    b = torch.nn.Parameter(torch.zeros(5))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w, b], lr=LR), [(f"{tag}.w", w), (f"{tag}.b", b)], **options)
    return w, b, opt


def _step(w, b, opt, rank, step):
    opt.zero_grad()
    ((w * _grad_of(rank, step)).sum() + (b * (rank + 1)).sum()).backward()
    opt.step()


def _expected(size, steps_of):
    """w and b after each rank's own steps: every step's update is the sum over the ranks still stepping / size."""
    w, b = torch.zeros(3, 4), torch.zeros(5)
    for step in range(max(steps_of)):
        active = [r for r in range(size) if step < steps_of[r]]
        w -= LR * sum(_grad_of(r, step) for r in active) / size
        b -= LR * sum(torch.full((5,), r + 1.0) for r in active) / size
    return w, b


def check_timing(rank, size, joiner_waits, **options):
    """Rank 0 steps once and joins; the others step three times. joiner_waits: rank 0 joins 0.3 s late, so the others'
    second step is already waiting for it (its listener answers with the open exchanges); otherwise the others wait,
    and their exchanges begin after the JOIN note came."""
    steps_of = [1] + [3] * (size - 1)
    w, b, opt = _optimizer(f"timing{int(joiner_waits)}{len(options)}", **options)
    for step in range(steps_of[rank]):
        if rank != 0 and step == 1 and not joiner_waits:
            time.sleep(0.3)
        _step(w, b, opt, rank, step)
    if rank == 0 and joiner_waits:
        time.sleep(0.3)
    last = hvd.join()
    assert last == size - 1, f"join() returned {last}"
    want_w, want_b = _expected(size, [min(steps_of[rank], s) for s in steps_of])
    atol = 1e-2 if options else 1e-6  # fp16 on the wire
    _close(w.detach(), want_w, f"w after {steps_of[rank]} steps (joiner_waits={joiner_waits}, {options})", atol)
    _close(b.detach(), want_b, f"b after {steps_of[rank]} steps (joiner_waits={joiner_waits}, {options})", atol)


def check_sparse(rank, size):
    """An Embedding(sparse=True)'s gradient is gathered (Horovod's sparse allreduce); a joined rank adds no rows."""
    emb = torch.nn.Embedding(6, 2, sparse=True)
    torch.nn.init.zeros_(emb.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0), [("sparse.emb", emb.weight)])
    if rank != 0:
        opt.zero_grad()
        (emb(torch.tensor([rank % 6])).sum() * (rank + 1)).backward()
        opt.step()
    hvd.join()
    want = torch.zeros(6, 2)
    if rank != 0:
        for r in range(1, size):
            want[r % 6] -= (r + 1) / size
    _close(emb.weight.detach(), want, "sparse embedding with rank 0 joined")


def check_generations(rank, size):
    """Three joins in a row, rank g % size joining first in round g: counts and generations stay agreed."""
    w, b, opt = _optimizer("generations")
    steps = 0
    for g in range(3):
        mine = 1 if rank == g % size else 2
        for _ in range(mine):
            _step(w, b, opt, rank, steps)
            steps += 1
        last = hvd.join()
        want_last = max(r for r in range(size) if r != g % size)
        assert last == want_last, f"round {g}: join() returned {last}, want {want_last}"
    assert bool(torch.isfinite(w).all())


def check_unserved_refused(rank, size):
    """A collective join() does not serve, run while rank 0 is joined, is refused at once, naming the joined rank."""
    from gradcomp.torch.context import _ctx
    if rank != 0:
        deadline = time.monotonic() + 20
        while _ctx.notes.joined_ranks() != [0]:
            assert time.monotonic() < deadline, "rank 0's JOIN note did not come"
            time.sleep(0.01)
        for name, call in (("allgather", lambda: hvd.allgather(torch.ones(2))),
                           ("broadcast_object", lambda: hvd.broadcast_object(rank)),
                           ("barrier", hvd.barrier)):
            try:
                call()
            except gradcomp.InvalidArgument as e:
                assert "rank(s) [0] are in join()" in str(e), f"{name}: {e}"
            else:
                raise AssertionError(f"{name} while rank 0 was joined was not refused")
        hvd.allreduce(torch.ones(3), name="unserved.after")  # what join serves still runs
    hvd.join()


def check_long_quiet(rank, size):
    """With a 0.5 s timeout, rank 0 joins while the others spend 2 s without a served operation, then step once: their
    ALIVE notes keep it waiting, and it serves the step."""
    saved, _ctx.notes.timeout_s = _ctx.notes.timeout_s, 0.5
    beats = join_notes.beats_sent
    w, b, opt = _optimizer("quiet")
    if rank != 0:
        time.sleep(2.0)
        _step(w, b, opt, rank, 0)
    hvd.join()
    _ctx.notes.timeout_s = saved
    steps_of = [0] + [1] * (size - 1)
    want_w, want_b = _expected(size, [min(steps_of[rank], s) for s in steps_of])  # rank 0 applies no step
    _close(w.detach(), want_w, "w after rank 0 waited out 2 s of the others' quiet")
    _close(b.detach(), want_b, "b after rank 0 waited out 2 s of the others' quiet")
    if rank != 0:
        assert join_notes.beats_sent > beats, f"rank {rank} sent no ALIVE note in 2 s while rank 0 was joined"


def check_unfrozen_and_missing(rank, size):
    """w and b are frozen when the optimizer is made and unfrozen before the first step (so both are exchanged from
    synchronize(), in parameter order, on every backend); b has a gradient on rank 1 only (the others send zeros for
    it, as Horovod). Rank 0 steps once and joins; the others step twice."""
    w = torch.nn.Parameter(torch.zeros(3, 4), requires_grad=False)
    b = torch.nn.Parameter(torch.zeros(5), requires_grad=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w, b], lr=LR), [("unfrozen.w", w), ("unfrozen.b", b)])
    w.requires_grad_(True)
    b.requires_grad_(True)
    steps = 1 if rank == 0 else 2
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = (w * _grad_of(rank, step)).sum() + ((b * 2.0).sum() if rank == 1 else 0.0)
        loss.backward()
        opt.step()
    hvd.join()
    want_w = torch.zeros(3, 4)
    for step in range(steps):
        want_w -= LR * sum(_grad_of(r, step) for r in range(size) if step < (1 if r == 0 else 2)) / size
    _close(w.detach(), want_w, "the unfrozen w")
    _close(b.detach(), torch.full((5,), -LR * 2.0 * steps / size), "b, whose gradient only rank 1 has")


def check_silent_until_joined(rank, size):
    """While no rank is joined a step sends no note; once one is, the others tell it each exchange."""
    w, b, opt = _optimizer("silent")
    before = join_notes.notes_sent
    for step in range(4):
        _step(w, b, opt, rank, step)
    hvd.allreduce(torch.ones(3), name="silent.allreduce")
    assert join_notes.notes_sent == before, f"rank {rank}: {join_notes.notes_sent - before} notes sent while no rank was joined"
    if rank != 0:
        _step(w, b, opt, rank, 4)
    hvd.join()
    sent = hvd.allgather_object(join_notes.notes_sent - before)  # every rank's, after the join
    assert sent[0] == size - 1, f"rank 0 sent {sent[0]} notes, want its {size - 1} JOIN notes"
    ops_noted = sum(sent[1:]) - (size - 1) ** 2  # beyond the others' JOIN notes
    if hvd.backend() == "runtime":
        assert ops_noted == 0, f"{ops_noted} OP notes, but the runtime negotiates the steps"  # its join serves them
    else:  # each of the step's two exchanges noted to rank 0 by at least one rank (a late listener notes none)
        assert ops_noted >= 2, f"the others sent {sent[1:]} notes: {ops_noted} OP notes for two exchanges"


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    assert size > 1, "run under mpirun with 2 or more ranks"
    torch.set_num_threads(1)
    for joiner_waits in (True, False):
        check_timing(rank, size, joiner_waits)
        hvd.barrier()
    check_timing(rank, size, True, compression=hvd.Compression.fp16, groups=1)
    hvd.barrier()
    check_sparse(rank, size)
    hvd.barrier()
    check_generations(rank, size)
    hvd.barrier()
    check_unserved_refused(rank, size)
    hvd.barrier()
    check_long_quiet(rank, size)
    hvd.barrier()
    check_unfrozen_and_missing(rank, size)
    hvd.barrier()
    check_silent_until_joined(rank, size)
    print(f"rank {rank}: join checks OK on backend {hvd.backend()}")
    hvd.shutdown()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import os
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
