"""Ranks that disagree on an exchange (issue 15, items 2 and 3), 2 gloo ranks: through DDP's backward and the
optimizer's torch backend, every rank raises gradcomp.InvalidArgument naming rank 0's and rank 1's side (before: DDP
raised "RuntimeError: Unable to cast <message> to Tensor", and a Python codec against a C++ one hung until gloo
aborted the process); the agreement is checked once per layout (one 16-byte fingerprint allgather per bucket layout
and owner, none after), and a bucket whose segments differ with the same names and total size is caught too."""
import gc
import os

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
import gradcomp.torch as hvd
from gradcomp.torch import exchange as _torch_comm
import helpers

WORLD = 2


def _count_fingerprints():
    """Counts this rank's agreement checks: allgathers of 16 bytes on the default group's adapter."""
    adapter = _torch_comm.exchange_for(None).comm.adapter
    seen = {"n": 0}
    inner = adapter.allgather

    def allgather(send, recv, timeout_s):
        seen["n"] += int(send.numel() == 16)
        return inner(send, recv, timeout_s)

    adapter.allgather = allgather
    return seen


def _assert_names_both_sides(err, mine, theirs):
    text = str(err)
    assert isinstance(err, gradcomp.InvalidArgument), f"{type(err).__name__}: {text}"
    assert "Unable to cast" not in text, text
    assert "rank 0 has" in text and "rank 1 has" in text, text
    assert mine in text and theirs in text, text


def _backward_error(ddp, rank):
    try:
        helpers.loss_of(ddp, helpers.make_batch(0, rank)).backward()
    except Exception as e:  # noqa: BLE001 - inspected by the caller
        return e
    raise AssertionError(f"rank {rank}: backward did not raise")


def _hook_worker(rank, url):
    helpers.init_gloo(rank, WORLD, url)
    helpers.register_python_codec()
    seen = _count_fingerprints()
    # Agreeing ranks: one check per bucket layout (DDP's first buckets, then its rebuilt ones), none after.
    model = helpers.make_model()
    ddp = DDP(model)
    state, hook = hvd.ddp_comm_hook("fp16", model=model)
    ddp.register_comm_hook(state, hook)
    counts, layouts = [], set()
    for step in range(4):
        ddp.zero_grad()
        helpers.loss_of(ddp, helpers.make_batch(step, rank)).backward()
        counts.append(seen["n"])
        layouts |= set(state.last_stats)
    assert counts[-1] == len(layouts) and counts[1] == counts[-1], \
        f"rank {rank}: agreement checks after each step {counts} for {len(layouts)} bucket layouts"
    helpers.release(ddp)
    # Disagreeing specs / codec kinds: every rank raises InvalidArgument from backward, naming both sides.
    for specs in (("fp16", "bf16"), ("pyhalf", "fp16"), ("topk:ratio=0.1", "topk:ratio=0.2")):
        model = helpers.make_model()
        ddp = DDP(model)
        state, hook = hvd.ddp_comm_hook(specs[rank], model=model)
        ddp.register_comm_hook(state, hook)
        err = _backward_error(ddp, rank)
        _assert_names_both_sides(err, f"spec='{gradcomp.compressor(specs[0]).spec}'",
                                 f"spec='{gradcomp.compressor(specs[1]).spec}'")
        del ddp  # its reducer is unusable after a failed backward (torch's state), as after any hook error
    # Same names and total size, different segments (the hook called directly, as DDP would with other shapes).
    sizes = (300, 700) if rank == 0 else (700, 300)
    state, hook = hvd.ddp_comm_hook("topk:ratio=0.1")
    with pytest.raises(gradcomp.InvalidArgument) as err:
        hook(state, helpers.FakeBucket(torch.randn(1000), [torch.zeros(n) for n in sizes])).wait()
    _assert_names_both_sides(err.value, "param0:300, param1:700", "param0:700, param1:300")
    hvd.shutdown()
    # The group is this test's own: destroy it while Python is alive. Left to interpreter exit, gloo's worker thread
    # frees the last views of gradcomp's buffers during finalization, and their deleters (which take the GIL) then
    # abort the process ("terminate called without an active exception", about one run in three).
    gc.collect()  # the DDP models dropped above go while their group is alive (helpers.release's rule)
    torch.distributed.destroy_process_group()


def test_hook_disagreeing_ranks_raise_on_every_rank():
    mp.spawn(_hook_worker, args=(helpers.rendezvous(),), nprocs=WORLD, join=True)


def _optimizer_worker(rank, url):
    helpers.watchdog()
    os.environ.update(GRADCOMP_INIT_METHOD=url, RANK=str(rank), WORLD_SIZE=str(WORLD), GRADCOMP_TORCH_PG="gloo")
    hvd.init(backend="torch")
    helpers.register_python_codec()
    seen = _count_fingerprints()
    model = helpers.make_model()
    params = len(list(model.parameters()))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), compression="fp16")
    for step in range(3):
        opt.zero_grad()
        helpers.loss_of(model, helpers.make_batch(step, rank)).backward()
        opt.step()
    assert seen["n"] == params, f"rank {rank}: {seen['n']} agreement checks for {params} parameters in 3 steps"
    opt._remove_hooks()
    for specs in (("fp16", "bf16"), ("fp16", "pyhalf")):
        model = helpers.make_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(), compression=specs[rank])
        helpers.loss_of(model, helpers.make_batch(0, rank)).backward()
        with pytest.raises(gradcomp.InvalidArgument) as err:
            opt.step()
        _assert_names_both_sides(err.value, f"spec='{gradcomp.compressor(specs[0]).spec}'",
                                 f"spec='{gradcomp.compressor(specs[1]).spec}'")
        opt._handles.clear()
        opt._remove_hooks()
    hvd.shutdown()


def test_optimizer_disagreeing_ranks_raise_on_every_rank():
    mp.spawn(_optimizer_worker, args=(helpers.rendezvous(),), nprocs=WORLD, join=True)
