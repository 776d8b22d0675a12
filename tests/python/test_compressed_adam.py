"""gradcomp.torch.CompressedAdam on the "torch" backend (gloo ranks spawned here): the 1-bit Adam reference on 2 and 4
ranks with identical parameters on every rank after every step, the state round trip for every kind of codec, the
tiny-variance guard (and that without it the ignored coordinates are thrown away), a state refused on another world
size, DistributedOptimizer(exchange="momentum"), and the arithmetic alone (no ranks). The same checks run on the
"mpi" and "runtime" backends from compressed_adam_check.py under mpirun."""
import gc
import os
import tempfile
import weakref

import pytest
import torch
import torch.multiprocessing as mp

import gradcomp
import gradcomp.torch as hvd
from gradcomp.torch import adam_math
import compressed_adam_checks as checks
import helpers


def _init(rank, world, url):
    helpers.watchdog(120)
    os.environ.update(GRADCOMP_INIT_METHOD=url, RANK=str(rank), WORLD_SIZE=str(world), GRADCOMP_TORCH_PG="gloo")
    torch.set_num_threads(1)
    hvd.init(backend="torch")


def _reference_worker(rank, world, url, exact_below):
    _init(rank, world, url)
    checks.check_against_onebit_adam_reference(exact_below=exact_below)
    if world == 2:
        checks.check_against_onebit_adam_reference(compress="increment")
    hvd.shutdown()


@pytest.mark.parametrize("world,exact_below", [(2, 100), (4, 0)])
def test_onebit_adam_matches_reference(world, exact_below):
    """4 ranks: every tensor compressed; 2 ranks: the biases (64 and 4 values) exact throughout (exact_below), then
    compress="increment"."""
    mp.spawn(_reference_worker, args=(world, helpers.rendezvous(), exact_below), nprocs=world, join=True)


def _round_trip_worker(rank, world, url, folder):
    _init(rank, world, url)
    for spec, rule, precondition, compress in [("onebit", "adamw", False, "momentum"),
                                               ("topk:ratio=0.1", "adam", True, "increment"),
                                               ("qsgd:bits=4", "lamb", False, "momentum"),
                                               ("dgc:ratio=0.1", "adamw", False, "increment"),
                                               ("powersgd:rank=2", "adamw", False, "momentum")]:
        saved = checks.check_state_round_trip(spec, rule=rule, precondition=precondition, compress=compress)
    torch.save(saved, os.path.join(folder, f"rank{rank}.pt"))
    hvd.shutdown()


def _other_world_worker(rank, world, url, folder):
    _init(rank, world, url)
    model = checks._model()
    opt = hvd.CompressedAdam(model.parameters(), compression="powersgd:rank=2", warmup=3,
                             named_parameters=model.named_parameters())
    with pytest.raises(gradcomp.InvalidArgument, match="rank 0 of 1: the state was saved by rank 0 of 2"):
        opt.load_state_dict(torch.load(os.path.join(folder, "rank0.pt")))
    assert opt._step_count_gc == 0 and opt.phase == "warmup"  # nothing changed
    assert not any(bool(s["exp_avg"].any()) for s in opt.state.values())
    hvd.shutdown()


def test_state_round_trip_bit_identical_and_other_world_size_refused():
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_round_trip_worker, args=(2, helpers.rendezvous(), folder), nprocs=2, join=True)
        mp.spawn(_other_world_worker, args=(1, helpers.rendezvous(), folder), nprocs=1, join=True)


def _guard_worker(rank, world, url, out):
    _init(rank, world, url)
    guarded = checks.check_tiny_variance_guard()
    unguarded = checks.check_tiny_variance_guard(guard=None)
    if rank == 0:
        torch.save((guarded, unguarded), out)
    hvd.shutdown()


def test_tiny_variance_guard():
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "moved.pt")
        mp.spawn(_guard_worker, args=(2, helpers.rendezvous(), out), nprocs=2, join=True)
        guarded, unguarded = torch.load(out)
    assert guarded == 0.0, f"with the guard the ignored coordinates moved by {guarded}"
    assert unguarded > 1e3, f"without the guard they moved only {unguarded} (the test would not see the failure)"


def _wrapper_worker(rank, world, url):
    _init(rank, world, url)
    torch.manual_seed(1)
    model = helpers.make_model()
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(adamw, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(adamw, named_parameters=model.named_parameters(), compression="onebit",
                                   exchange="momentum", exchange_options=dict(warmup=2, verbose=False))
    assert isinstance(opt, hvd.CompressedAdam) and opt.rule == "adamw" and opt.param_groups[0] is adamw.param_groups[0]
    before = [p.detach().clone() for p in model.parameters()]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # Horovod's start: no step taken, every rank's state rank 0's
    assert opt._step_count_gc == 0 and all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    for step in range(4):
        opt.zero_grad()
        helpers.loss_of(model, helpers.make_batch(step, rank)).backward()
        opt.step()
        scheduler.step()
        checks.check_identical_on_every_rank(model, step)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 16) and opt.phase == "compressed"
    for bad, match in [(dict(op=hvd.Sum), "op"), (dict(backward_passes_per_step=2), "backward_passes_per_step")]:
        with pytest.raises(gradcomp.InvalidArgument, match=match):
            hvd.DistributedOptimizer(torch.optim.AdamW(model.parameters()), exchange="momentum", **bad)
    with pytest.raises(gradcomp.InvalidArgument, match="SGD"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), exchange="momentum")
    with pytest.raises(gradcomp.InvalidArgument, match="momentum correction"):
        hvd.CompressedAdam(model.parameters(), compression="dgc:momentum=0.9")
    opt._remove_hooks()
    hvd.shutdown()


def test_distributed_optimizer_exchange_momentum():
    mp.spawn(_wrapper_worker, args=(2, helpers.rendezvous()), nprocs=2, join=True)


def _exact_worker(rank, world, url):
    _init(rank, world, url)
    for rule, cls, local_steps in [("adamw", torch.optim.AdamW, 0), ("adam", torch.optim.Adam, 3)]:
        models = [helpers.make_model(), helpers.make_model()]
        bases = [cls(m.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1) for m in models]
        for step in range(local_steps):  # an Adam that has taken steps (the same on every rank) before it is wrapped
            for model, base in zip(models, bases):
                base.zero_grad()
                helpers.loss_of(model, helpers.make_batch(100 + step, 0)).backward()
                base.step()
        plain = hvd.DistributedOptimizer(bases[0], named_parameters=models[0].named_parameters(), compression="none")
        if local_steps:
            exact = hvd.DistributedOptimizer(bases[1], named_parameters=models[1].named_parameters(),
                                             compression="onebit", exchange="momentum",
                                             exchange_options=dict(warmup=1000))
            assert exact._step_count_gc == local_steps
        else:
            exact = hvd.CompressedAdam(models[1].parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1,
                                       rule=rule, compression="onebit", warmup=1000,
                                       named_parameters=models[1].named_parameters())
        for step in range(5):
            for model, opt in zip(models, (plain, exact)):
                opt.zero_grad()
                helpers.loss_of(model, helpers.make_batch(step, rank)).backward()
                opt.step()
            for (n, a), b in zip(models[0].named_parameters(), models[1].parameters()):
                assert torch.equal(a, b), f"rank {rank} {rule} step {step}: '{n}' differs from torch's {cls.__name__}"
        plain._remove_hooks()
        exact._remove_hooks()
    hvd.shutdown()


def test_exact_steps_are_torch_adam_bit_for_bit():
    """Never leaving the warm-up, CompressedAdam is DistributedOptimizer(torch.optim.AdamW / Adam, 'none') bit for
    bit: the exact step is torch's arithmetic; DistributedOptimizer(exchange="momentum") takes over the state of an
    Adam that has already taken steps."""
    mp.spawn(_exact_worker, args=(2, helpers.rendezvous()), nprocs=2, join=True)


def _quantized_exact_worker(rank, world, url):
    _init(rank, world, url)
    models = [helpers.make_model(), helpers.make_model()]
    start = torch.cat([p.detach().flatten() for p in models[0].parameters()])
    plain = hvd.DistributedOptimizer(torch.optim.AdamW(models[0].parameters(), lr=1e-2, betas=(0.9, 0.95)),
                                     named_parameters=models[0].named_parameters(), compression="none")
    quantized = hvd.CompressedAdam(models[1].parameters(), lr=1e-2, betas=(0.9, 0.95), compression="onebit",
                                   warmup=1000, exact_compression="qsgd:bits=8,ef=on",
                                   named_parameters=models[1].named_parameters())
    spec = quantized._exact.spec
    assert spec.startswith("qsgd:bits=8,") and ",ef=off," in spec, spec  # stateless whatever the spec asks
    for step in range(4):
        for model, opt in zip(models, (plain, quantized)):
            opt.zero_grad()
            helpers.loss_of(model, helpers.make_batch(step, rank)).backward()
            opt.step()
        checks.check_identical_on_every_rank(models[1], step)
    exact, quant = (torch.cat([p.detach().flatten() for p in m.parameters()]) for m in models)
    moved, apart = (exact - start).norm().item(), (quant - exact).norm().item()
    print(f"rank {rank}: exact AdamW moved {moved:.4g}, the qsgd-8 run is {apart:.4g} from it")
    assert 0 < apart < 0.2 * moved, f"rank {rank}: qsgd-8 exact steps {apart:.4g} from exact AdamW's {moved:.4g}"
    stats = quantized.gradcomp_stats()
    if stats["input_bytes"]:  # backends that count bytes; fp16 would send just over half (payload headers)
        assert stats["exact_bytes"][1] * 2 < stats["exact_bytes"][0], stats
    for bad in ("topk:ratio=0.01", "onebit"):
        with pytest.raises(gradcomp.InvalidArgument, match="exact_compression"):
            hvd.CompressedAdam(models[1].parameters(), exact_compression=bad)
    plain._remove_hooks()
    quantized._remove_hooks()
    hvd.shutdown()


def test_exact_steps_quantized_with_qsgd():
    """exact_compression="qsgd:bits=8": the warm-up's gradient average is quantized (error feedback forced off, so
    it holds no state), identical on every rank, close to exact AdamW's and in fewer bytes than fp16's; codecs with
    state are refused."""
    mp.spawn(_quantized_exact_worker, args=(2, helpers.rendezvous()), nprocs=2, join=True)


# -- the arithmetic alone -----------------------------------------------------------------------------------------------
def _collected_worker(rank, world, url):
    _init(rank, world, url)
    for make in (lambda m: hvd.CompressedAdam(m.parameters(), lr=1e-2, compression="onebit", warmup=1,
                                              named_parameters=m.named_parameters()),
                 lambda m: hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-2),
                                                    named_parameters=m.named_parameters(), compression="topk")):
        model = helpers.make_model()
        opt = make(model)
        for step in range(2):
            opt.zero_grad()
            helpers.loss_of(model, helpers.make_batch(step, rank)).backward()
            opt.step()
        ref = weakref.ref(opt)
        del opt
        gc.collect()
        assert ref() is None, f"{type(ref()).__name__} outlived its last reference: its gradient hooks hold it"
        helpers.loss_of(model, helpers.make_batch(9, rank)).backward()   # the hooks of a collected optimizer do nothing
    hvd.shutdown()


def test_dropped_optimizer_is_collected():
    """The gradient hooks (grad_hooks.register) hold their optimizer weakly: held strongly, the cycle parameter ->
    hook -> optimizer -> parameter runs through torch's C++ hook tables, which the garbage collector cannot see."""
    mp.spawn(_collected_worker, args=(1, helpers.rendezvous()), nprocs=1, join=True)


def test_variance_schedule_doubles_its_interval():
    s = adam_math.VarianceSchedule("refresh", kappa=2, max_interval=4)
    s.start(10)
    exact = []
    for step in range(10, 60):
        if s.is_refresh(step):
            exact.append(step)
            s.refreshed(step)
    # intervals of compressed steps between exact ones: 1, 1, 2, 2, 4, 4, 4, ... (capped at 4)
    assert exact[:7] == [11, 13, 16, 19, 24, 29, 34]
    frozen = adam_math.VarianceSchedule("frozen")
    frozen.start(10)
    assert not any(frozen.is_refresh(step) for step in range(10, 100))


def test_auto_warmup_ends_when_v_settles():
    auto = adam_math.AutoWarmup(window=2, tol=0.1, min_steps=4)
    snapshot, ends = [], []
    for step, value in enumerate([1.0, 2.0, 3.0, 3.5, 3.6, 3.62, 3.63, 3.63], start=1):
        ends.append(auto.check(step, [torch.full((4,), value)], snapshot))
    assert ends == [False, False, False, False, False, True, False, True]  # checks at 2, 4, 6, 8; settles at 6
    assert [round(c, 3) for _, c in auto.history] == [round(1.5 / 3.5, 3), round(0.12 / 3.62, 3), round(0.01 / 3.63, 3)]


def test_guard_mask_and_momentum_spec():
    v = torch.tensor([1e-4, 1e-4, 0.0, 1e-30, 1e-13])
    mask = adam_math.guard_mask(v, 1.0, 1e-8, 1e-3)
    assert mask.tolist() == [True, True, False, False, False]
    assert adam_math.guard_mask(torch.full((3,), 1e-4), 1.0, 1e-8, 1e-3) is None
    assert adam_math.momentum_spec("dgc:ratio=0.01") == "dgc:ratio=0.01,momentum=0"
    assert adam_math.momentum_spec("topk:ratio=0.01") == "topk:ratio=0.01"
