"""gradcomp.torch.DistributedOptimizer (torch.distributed backend, 2 gloo ranks via torch.multiprocessing) and
checkpoint/resume: the optimizer's aggregated gradients equal the compressors' reference result for every registered
codec and a Python-registered one; a run interrupted, saved (model, optimizer with its compressor state, hook state)
and resumed in fresh objects ends bit-identical to the uninterrupted run, for the optimizer and for the DDP hook."""
import io
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
import gradcomp.torch as hvd
import helpers

WORLD = 2


def _init(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      GRADCOMP_TORCH_PG="gloo")
    hvd.init(backend="torch")
    assert hvd.rank() == rank and hvd.size() == WORLD
    helpers.register_python_codec()


def _grads_worker(rank, port, specs):
    _init(rank, port)
    for spec in specs:
        model = helpers.make_model(seed=rank)  # different init per rank: broadcast_parameters fixes it
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                       named_parameters=model.named_parameters(), compression=spec)
        assert isinstance(opt, torch.optim.SGD)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        ref = [gradcomp.compressor(spec) for _ in range(WORLD)]
        calls = helpers.HalfPrecision.calls
        for step in range(3):
            batches = [helpers.make_batch(step, r) for r in range(WORLD)]
            expected = helpers.expected_grads(ref, model, batches, step, WORLD)
            opt.zero_grad()
            helpers.loss_of(model, batches[rank]).backward()
            opt.synchronize()
            helpers.assert_grads_match(model, expected, spec, rank, step)
            with opt.skip_synchronize():
                opt.step()
        if spec == "pyhalf":
            assert helpers.HalfPrecision.calls > calls, "the Python codec was not used by the optimizer"
        opt._remove_hooks()
    hvd.shutdown()


def test_optimizer_gradients_match_reference():
    helpers.register_python_codec()
    specs = helpers.available_specs() + ["pyhalf"]
    mp.spawn(_grads_worker, args=(helpers.free_port(), specs), nprocs=WORLD, join=True)


def _train(model, opt, steps, first_step, rank, ddp=None):
    for step in range(first_step, first_step + steps):
        opt.zero_grad()
        helpers.loss_of(ddp if ddp is not None else model, helpers.make_batch(step, rank)).backward()
        opt.step()


def _flat(model):
    return torch.cat([p.detach().view(-1) for p in model.parameters()])


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def _resume_worker(rank, port, specs):
    _init(rank, port)
    for spec in specs:
        # --- DistributedOptimizer ---
        def make():
            model = helpers.make_model(seed=0)
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                           named_parameters=model.named_parameters(), compression=spec)
            return model, opt
        model_a, opt_a = make()
        _train(model_a, opt_a, 6, 0, rank)
        opt_a._remove_hooks()
        model_b, opt_b = make()
        _train(model_b, opt_b, 3, 0, rank)
        ckpt = _roundtrip({"model": model_b.state_dict(), "opt": opt_b.state_dict()})
        opt_b._remove_hooks()
        assert "gradcomp" in ckpt["opt"], "the optimizer's state_dict must carry the compressor state"
        model_c, opt_c = make()
        model_c.load_state_dict(ckpt["model"])
        opt_c.load_state_dict(ckpt["opt"])
        _train(model_c, opt_c, 3, 3, rank)
        opt_c._remove_hooks()
        assert torch.equal(_flat(model_a), _flat(model_c)), f"optimizer {spec}: resumed run differs"
        # Without the compressor state the resumed run differs (the test can fail).
        if gradcomp.compressor(spec).traits.get("lossy"):
            model_d, opt_d = make()
            model_d.load_state_dict(ckpt["model"])
            sd = dict(ckpt["opt"])
            sd.pop("gradcomp")
            opt_d.load_state_dict(sd)
            _train(model_d, opt_d, 3, 3, rank)
            opt_d._remove_hooks()
            assert not torch.equal(_flat(model_a), _flat(model_d)), f"{spec}: residuals had no effect"

        # --- DDP hook ---
        def make_ddp():
            model = helpers.make_model(seed=0)
            ddp = DDP(model, bucket_cap_mb=0.004)
            state, hook = hvd.ddp_comm_hook(spec, model=model)
            ddp.register_comm_hook(state, hook)
            return model, ddp, state, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        model_a, ddp_a, _, opt_a = make_ddp()
        _train(model_a, opt_a, 6, 0, rank, ddp_a)
        model_b, ddp_b, state_b, opt_b = make_ddp()
        _train(model_b, opt_b, 3, 0, rank, ddp_b)
        ckpt = _roundtrip({"model": model_b.state_dict(), "opt": opt_b.state_dict(), "hook": state_b.state_dict()})
        model_c = helpers.make_model(seed=0)
        model_c.load_state_dict(ckpt["model"])
        ddp_c = DDP(model_c, bucket_cap_mb=0.004)
        state_c, hook = hvd.ddp_comm_hook(spec, model=model_c)
        state_c.load_state_dict(ckpt["hook"])
        ddp_c.register_comm_hook(state_c, hook)
        opt_c = torch.optim.SGD(ddp_c.parameters(), lr=0.05, momentum=0.9)
        opt_c.load_state_dict(ckpt["opt"])
        _train(model_c, opt_c, 3, 3, rank, ddp_c)
        assert torch.equal(_flat(model_a), _flat(model_c)), f"DDP hook {spec}: resumed run differs"
    hvd.shutdown()


def test_checkpoint_resume_bit_identical():
    specs = helpers.stateful_specs() or ["none"]
    mp.spawn(_resume_worker, args=(helpers.free_port(), specs[:2]), nprocs=WORLD, join=True)


def test_unsupported_op_and_uninitialized_use_raise():
    with pytest.raises(gradcomp.InvalidArgument, match="init"):
        hvd.rank()
    model = helpers.make_model()
    with pytest.raises(gradcomp.InvalidArgument, match="init"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(gradcomp.InvalidArgument, match="not supported"):
        hvd._check_op(hvd.Adasum)
