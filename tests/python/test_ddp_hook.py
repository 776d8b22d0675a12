"""DDP with gradcomp's comm hook on gloo (2, 3 and 4 ranks, torch.multiprocessing): every step, each bucket's averaged
gradient equals what gradcomp's C++ compressed_allreduce gives for the same bucket, segments and step over in-process
communicators (an independent transport), with the algorithm the codec's traits call for (dense, sparse with the
dense switch, scatter-reduce-allgather); Python codecs follow Horovod's semantics. The model trains and the ranks stay
identical."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
import gradcomp.torch as gct
import helpers

STEPS = 4


def _recording(hook, buckets):
    """The hook, recording each bucket's (name, segments, step) as gradcomp hands it to compressed_allreduce."""
    def recording_hook(state, bucket):
        _, segments = gct.bucket_segments(state, bucket)
        buckets.append((gct.bucket_name(segments), segments, state.step))
        return hook(state, bucket)
    return recording_hook


def _expected_algorithm(comp):
    traits = comp.traits
    return ("dense" if traits["summable"] else "sparse" if traits["gatherable"] else "rounds" if traits["rounds"]
            else "sra")


def _worker(rank, world, port, specs, bucket_cap_mb, switched=None, hierarchical=False):
    """switched: {spec: whether every bucket's sparse allreduce must have gone dense}."""
    helpers.init_gloo(rank, world, port)
    helpers.register_python_codec()
    for spec in specs:
        model = helpers.make_model()
        ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
        state, hook = gct.ddp_comm_hook(spec, model=model, hierarchical=hierarchical)
        buckets = []
        ddp.register_comm_hook(state, _recording(hook, buckets))
        ref_comps = [gradcomp.compressor(spec) for _ in range(world)]
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        losses = []
        calls_before = helpers.HalfPrecision.calls
        for step in range(STEPS):
            batches = [helpers.make_batch(step, r) for r in range(world)]
            opt.zero_grad()
            buckets.clear()
            loss = helpers.loss_of(ddp, batches[rank])
            loss.backward()
            losses.append(float(loss))
            if spec == "pyhalf":
                expected = helpers.expected_grads(ref_comps, model, batches, step, world)
            else:
                local = helpers.local_grads(model, batches, world)
                expected = helpers.expected_bucket_grads(ref_comps, local, buckets, world, hierarchical)
                # The C++ algorithm the codec's traits call for ran on every bucket.
                for name, _, _ in buckets:
                    stats = state.last_stats[name]
                    assert stats["algorithm"] == _expected_algorithm(state.compressor), f"{spec} {name}: {stats}"
                    assert stats["hierarchical"] == hierarchical, f"{spec} {name}: {stats}"
                    assert stats["staged_bytes"] == 0, f"{spec} {name}: CPU buckets are never staged: {stats}"
                    if switched is not None and spec in switched:
                        assert stats["switched_to_dense"] == switched[spec], f"{spec} {name}: {stats}"
            helpers.assert_grads_match(model, expected, spec, rank, step)
            opt.step()
        assert state.step == STEPS, f"{spec}: hook counted {state.step} steps, expected {STEPS}"
        if spec == "pyhalf":
            assert helpers.HalfPrecision.calls > calls_before, "the Python codec was not called by the hook"
        # The ranks hold identical parameters (they applied the same aggregated gradient).
        flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        for r in range(world):
            assert torch.equal(gathered[r], flat), f"{spec}: rank {r} parameters differ from rank {rank}"
        # The compressor state travels in the hook state's state_dict.
        sd = state.state_dict()
        f = gradcomp._state.fields(sd)
        assert f["step"] == STEPS and f["kind"] == "ddp_hook" and isinstance(f["state"], bytes)
        helpers.release(ddp)
    dist.destroy_process_group()


def _run(world, bucket_cap_mb):
    helpers.register_python_codec()
    specs = helpers.available_specs() + ["pyhalf"]
    mp.spawn(_worker, args=(world, helpers.rendezvous(), specs, bucket_cap_mb), nprocs=world, join=True)


def test_ddp_hook_cpp_algorithms_2_ranks():
    """The hook runs the C++ algorithms on gloo: scatter-reduce-allgather for QSGD and 1-bit, the sparse allreduce
    for top-k, staying sparse at 1% (one 2372-value bucket) and switching to dense at 60% (the two ranks' pairs
    outweigh a dense float32 sum); results equal the in-process reference and are identical on both ranks."""
    names = {c["name"] for c in gradcomp.list_compressors()}
    switched = {"topk:ratio=0.01": False, "topk:ratio=0.6": True}
    specs = [s for s in ("qsgd", "onebit", *switched) if s.split(":")[0] in names]
    mp.spawn(_worker, args=(2, helpers.rendezvous(), specs, 25, switched), nprocs=2, join=True)


def test_ddp_hook_2_ranks():
    _run(2, bucket_cap_mb=0.004)  # several buckets, rebuilt after the first step


def test_ddp_hook_4_ranks():
    _run(4, bucket_cap_mb=25)


def test_ddp_hook_training_loss_decreases():
    """Training with a lossy codec (the most compressive registered one) still lowers the loss."""
    helpers.register_python_codec()
    specs = helpers.available_specs()
    spec = specs[-1] if specs else "pyhalf"
    mp.spawn(_train_worker, args=(2, helpers.rendezvous(), spec), nprocs=2, join=True)


def _train_worker(rank, world, port, spec):
    helpers.init_gloo(rank, world, port)
    helpers.register_python_codec()
    model = helpers.make_model()
    ddp = DDP(model)
    state, hook = gct.ddp_comm_hook(spec, model=model)
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    batch = helpers.make_batch(0, rank, n=64)
    first = None
    for _ in range(30):
        opt.zero_grad()
        loss = helpers.loss_of(ddp, batch)
        loss.backward()
        opt.step()
        first = first if first is not None else float(loss)
    assert float(loss) < 0.9 * first, f"{spec}: loss {first:.4f} -> {float(loss):.4f} did not decrease"
    helpers.release(ddp)
    dist.destroy_process_group()


def test_ddp_hook_hierarchical_4_ranks(monkeypatch):
    """hierarchical=True with two emulated nodes of two ranks (GRADCOMP_LOCAL_SIZE=2): float32 sum inside each node,
    the codec's algorithm between the two node leaders, broadcast back; equal to the in-process reference with the
    same node layout, identical on every rank."""
    monkeypatch.setenv("GRADCOMP_LOCAL_SIZE", "2")
    names = {c["name"] for c in gradcomp.list_compressors()}
    specs = [s for s in ("qsgd", "topk:ratio=0.05", "fp16") if s.split(":")[0] in names]
    mp.spawn(_worker, args=(4, helpers.rendezvous(), specs, 0.004, None, True), nprocs=4, join=True)


def _split_sum_worker(rank, world, port, specs):
    """Half-precision codecs through the split sum (all_to_all + float32 sum + all_gather), forced for every bucket
    size; 3 ranks so the chunks do not divide the buckets evenly."""
    from gradcomp.torch import exchange as _torch_comm
    helpers.init_gloo(rank, world, port)
    _torch_comm.SPLIT_SUM_MIN_BYTES = 0
    for spec in specs:
        model = helpers.make_model()
        ddp = DDP(model, bucket_cap_mb=0.004)
        state, hook = gct.ddp_comm_hook(spec, model=model)
        buckets = []
        ddp.register_comm_hook(state, _recording(hook, buckets))
        ref_comps = [gradcomp.compressor(spec) for _ in range(world)]
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for step in range(3):
            batches = [helpers.make_batch(step, r) for r in range(world)]
            opt.zero_grad()
            buckets.clear()
            helpers.loss_of(ddp, batches[rank]).backward()
            assert _torch_comm.exchange_for(None).comm.adapter.split_sum_min_bytes == 0
            expected = helpers.expected_bucket_grads(ref_comps, helpers.local_grads(model, batches, world), buckets,
                                                     world)
            helpers.assert_grads_match(model, expected, spec, rank, step)
            opt.step()
        flat = torch.cat([p.grad.view(-1) for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        for r in range(world):
            assert torch.equal(gathered[r], flat), f"{spec}: rank {r} gradients differ from rank {rank}"
        helpers.release(ddp)
    # A non-finite gradient raises (nonfinite=raise) through the hook's future on every rank, naming the tensor,
    # and no rank is left waiting in a collective.
    model = helpers.make_model()
    ddp = DDP(model)
    state, hook = gct.ddp_comm_hook("fp16", model=model)
    ddp.register_comm_hook(state, hook)
    x, y = helpers.make_batch(0, rank)
    x[0, 0] = float("nan")
    with pytest.raises(Exception, match="nonfinite|non-finite|NaN"):
        helpers.loss_of(ddp, (x, y)).backward()
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_hook_split_sum_3_ranks():
    names = {c["name"] for c in gradcomp.list_compressors()}
    specs = [s for s in ("fp16", "bf16", "fp16:ef=off") if s.split(":")[0] in names]
    mp.spawn(_split_sum_worker, args=(3, helpers.rendezvous(), specs), nprocs=3, join=True)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
