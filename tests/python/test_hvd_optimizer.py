"""Issue 19, the optimizer half of Horovod parity, on the torch backend (gloo ranks via torch.multiprocessing), each
value against a plain reference computed here: Adasum (adasum_allreduce_ in every dtype on 2, 4 and 8 ranks, and
DistributedOptimizer(op=Adasum) as start + the Adasum of the local steps' deltas, against adasum_truth.py, the paper's
definition written in the tests, on non-orthogonal vectors of unequal norms; 3 ranks raise), gradient_predivide_factor,
groups / num_groups (launch order and values), sparse gradients (Embedding(sparse=True), allgather and
sparse_as_dense), set_backward_passes_per_step, a Horovod-style compressor class passed as compression=,
Compression.none/fp16 as Horovod compressors, process_set=, and SyncBatchNorm vs a BatchNorm over the concatenated
batch."""
import os

import pytest
import torch
import torch.multiprocessing as mp

import adasum_truth
import gradcomp
import gradcomp.torch as hvd
import helpers
import sparse_check
from gradcomp.torch import adasum


def _init(rank, world, url):
    helpers.watchdog()
    os.environ.update(GRADCOMP_INIT_METHOD=url, RANK=str(rank), WORLD_SIZE=str(world), GRADCOMP_TORCH_PG="gloo")
    hvd.init(backend="torch")
    torch.set_num_threads(1)


def _per_rank(world, numel, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g).to(dtype) for _ in range(world)]


def _close(got, want, tol, what):
    scale = float(want.double().abs().max()) + 1e-12
    err = float((got.double() - want.double()).abs().max()) / scale
    assert err <= tol, f"{what}: relative error {err:.3g}"


# -- Adasum ---------------------------------------------------------------------------------------------------------
_ADASUM_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _adasum_worker(rank, world, url):
    """adasum_allreduce_ and DistributedOptimizer(op=Adasum) against adasum_truth (the paper's definition, written in
    the test) on random non-orthogonal vectors of unequal norms, every dtype; a non-power-of-two count raises."""
    _init(rank, world, url)
    if world & (world - 1):
        with pytest.raises(NotImplementedError, match=f"{world} ranks"):
            adasum.adasum_allreduce_(torch.ones(4))
        with pytest.raises(NotImplementedError, match="power-of-two"):
            hvd.DistributedOptimizer(torch.optim.SGD(helpers.make_model().parameters(), lr=0.1), op=hvd.Adasum)
        hvd.shutdown()
        return
    for dtype in _ADASUM_DTYPES:
        for numel in (1, 2, 3, 7, 64, 1001):
            xs = adasum_truth.inputs(world, numel, seed=numel, dtype=dtype)
            t = xs[rank].clone()
            assert adasum.adasum_allreduce_(t) is t
            assert t.dtype == dtype
            adasum_truth.check(t, xs, dtype, f"adasum {dtype} numel {numel} rank {rank} of {world}")
    # a zero vector on one rank leaves the other's (coefficient 1 below the 1e-8 norm threshold)
    xs = adasum_truth.inputs(world, 16, seed=5)
    xs[0].zero_()
    t = xs[rank].clone()
    adasum.adasum_allreduce_(t)
    assert adasum_truth.relative_error(t, adasum_truth.adasum(xs)) <= 1e-6, "adasum with a zero vector"
    # a 2-D tensor keeps its shape
    xs = adasum_truth.inputs(world, 48, seed=6, dtype=torch.float16)
    t = xs[rank].clone().view(6, 8)
    adasum.adasum_allreduce_(t)
    assert t.shape == (6, 8)
    adasum_truth.check(t.view(-1), xs, torch.float16, "adasum float16 2-D")
    with pytest.raises(ValueError):
        adasum.adasum_allreduce_(torch.ones(3, dtype=torch.int64))
    _check_adasum_optimizer(rank, world)
    hvd.shutdown()


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_adasum_allreduce_matches_pairwise_reference(world):
    mp.spawn(_adasum_worker, args=(world, helpers.rendezvous()), nprocs=world, join=True)


def test_adasum_reference_and_non_power_of_two():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0])
    # identical vectors: a.b = |a|^2 -> both coefficients 1/2 -> the vector itself (Adasum's defining property)
    assert torch.allclose(adasum.adasum_combine(a, b), a)
    # orthogonal vectors add
    assert torch.allclose(adasum.adasum_combine(a, torch.tensor([0.0, 2.0])), torch.tensor([1.0, 2.0]))
    # unequal norms, not orthogonal: the library's pairwise combine and reference against the definition
    for dtype in _ADASUM_DTYPES:
        xs = adasum_truth.inputs(8, 33, seed=3, dtype=dtype)
        adasum_truth.check(adasum.adasum_combine(xs[0], xs[1]), xs[:2], dtype, f"adasum_combine {dtype}")
        adasum_truth.check(adasum.adasum_reference(xs), xs, dtype, f"adasum_reference {dtype}")
    # closed form: a = (1, 0), b = (1, 1): a.b = 1, |a|^2 = 1, |b|^2 = 2 -> a/2 + 3b/4 = (1.25, 0.75)
    got = adasum.adasum_combine(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 1.0],
                                                                                            dtype=torch.float64))
    assert torch.allclose(got, torch.tensor([1.25, 0.75], dtype=torch.float64), rtol=0, atol=1e-15), got
    for n in (3, 5, 6, 12):
        with pytest.raises(NotImplementedError, match="power-of-two"):
            adasum.check_size(n)
        with pytest.raises(NotImplementedError):
            adasum.adasum_reference([a] * n)


# -- DistributedOptimizer options -------------------------------------------------------------------------------------
CountingHalf = helpers.HalfPrecision  # a Horovod-style compressor class (static methods), counting its calls


def _local_grads(model, batches):
    out = []
    for batch in batches:
        clone = helpers.make_model()
        clone.load_state_dict(model.state_dict())
        helpers.loss_of(clone, batch).backward()
        out.append({n: p.grad.clone() for n, p in clone.named_parameters()})
    return out


def _average(grads, world):
    return {n: sum(g[n] for g in grads) / world for n in grads[0]}


def _check_dense_option(rank, world, make_opt, what, tol=1e-6, passes=1):
    model = helpers.make_model(seed=0)
    opt = make_opt(model)
    batches = [[helpers.make_batch(k, r) for r in range(world)] for k in range(passes)]
    opt.zero_grad()
    for k in range(passes):
        helpers.loss_of(model, batches[k][rank]).backward()
    opt.synchronize()
    local = [_local_grads(model, [batches[k][r] for k in range(passes)]) for r in range(world)]
    # each rank's local gradient accumulated over the passes, divided by their count, then averaged
    acc = [{n: sum(l[k][n] for k in range(passes)) / passes for n in l[0]} for l in local]
    want = _average(acc, world)
    for n, p in model.named_parameters():
        _close(p.grad, want[n], tol, f"{what}: {n} rank {rank}")
    with opt.skip_synchronize():
        opt.step()
    if hasattr(opt, "_remove_hooks"):
        opt._remove_hooks()
    return opt


def _launch_order(opt):
    """Records the names the optimizer launches allreduces for, in order."""
    order = []
    reduce_dense = opt._reduce_dense

    def spy(grad, name):
        order.append(name)
        return reduce_dense(grad, name)
    opt._reduce_dense = spy
    return order


def _options_worker(rank, world, url):
    _init(rank, world, url)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    # gradient_predivide_factor: the same average (prescale 1/f, sum, postscale f/size)
    for f in (2.0, 0.5):
        _check_dense_option(rank, world, lambda m: hvd.DistributedOptimizer(
            sgd(m), m.named_parameters(), gradient_predivide_factor=f), f"predivide {f}")
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(sgd(helpers.make_model()), op=hvd.Sum, gradient_predivide_factor=2.0)
    # a fp16 codec with predivide: float16 sums of g/f
    _check_dense_option(rank, world, lambda m: hvd.DistributedOptimizer(
        sgd(m), m.named_parameters(), compression=hvd.Compression.fp16, gradient_predivide_factor=2.0),
        "predivide fp16", tol=2e-3)

    # groups: lists of parameters -> the group's allreduces launched together, in the group's order
    model = helpers.make_model(seed=0)
    w0, b0, w2, b2 = model[0].weight, model[0].bias, model[2].weight, model[2].bias
    opt = hvd.DistributedOptimizer(sgd(model), model.named_parameters(), groups=[[w0, w2]])
    order = _launch_order(opt)
    opt.zero_grad()
    helpers.loss_of(model, helpers.make_batch(0, rank)).backward()
    assert order.index("2.weight") == order.index("0.weight") + 1, order  # w2 waited for w0
    assert order.index("2.bias") < order.index("0.weight"), order
    opt.synchronize()
    opt._remove_hooks()
    plain = hvd.DistributedOptimizer(sgd(model), model.named_parameters())
    order = _launch_order(plain)
    plain.zero_grad()
    helpers.loss_of(model, helpers.make_batch(0, rank)).backward()
    assert order.index("2.weight") < order.index("0.weight"), order  # without groups: as gradients arrive
    plain.synchronize()
    plain._remove_hooks()
    # the values with groups, and num_groups (Horovod's older name) split like split_list
    _check_dense_option(rank, world, lambda m: hvd.DistributedOptimizer(
        sgd(m), m.named_parameters(), groups=[[m[0].weight, m[2].weight]]), "groups list")
    opt = _check_dense_option(rank, world, lambda m: hvd.DistributedOptimizer(
        sgd(m), m.named_parameters(), num_groups=3), "num_groups 3")
    sizes = sorted({id(g): len(g) for g in opt._p_to_group.values()}.values())
    assert sizes == [1, 1, 2], sizes  # 4 parameters in 3 groups: [2, 1, 1]
    for bad in (-1, [[torch.zeros(1)], 3], "two"):
        with pytest.raises(ValueError):
            hvd.DistributedOptimizer(sgd(helpers.make_model()), groups=bad)
    m = helpers.make_model()
    with pytest.raises(ValueError, match="once"):
        hvd.DistributedOptimizer(sgd(m), groups=[[m[0].weight], [m[0].weight]])

    # set_backward_passes_per_step: two passes accumulated, then one reduction
    def two_passes(m):
        o = hvd.DistributedOptimizer(sgd(m), m.named_parameters())
        o.set_backward_passes_per_step(2)
        assert o.backward_passes_per_step == 2
        return o
    _check_dense_option(rank, world, two_passes, "set_backward_passes_per_step(2)", passes=2)

    # a Horovod-style compressor class passed directly; Compression.none/fp16 are Horovod compressors too
    calls = CountingHalf.calls
    _check_dense_option(rank, world, lambda m: hvd.DistributedOptimizer(
        sgd(m), m.named_parameters(), compression=CountingHalf), "Horovod-style class", tol=2e-3)
    assert CountingHalf.calls > calls
    _check_dense_option(rank, world, lambda m: hvd.DistributedOptimizer(
        sgd(m), m.named_parameters(), compression=CountingHalf()), "Horovod-style instance", tol=2e-3)
    t = torch.randn(5)
    c, ctx = hvd.Compression.fp16.compress(t)
    assert c.dtype == torch.float16 and hvd.Compression.fp16.decompress(c, ctx).dtype == torch.float32
    c, ctx = hvd.Compression.none.compress(t)
    assert c is t and hvd.Compression.none.decompress(c, ctx) is t
    assert hvd.Compression.topk(0.01).spec == "topk:ratio=0.01"

    # process_set: the global set works, another raises clearly
    _check_dense_option(rank, world, lambda m: hvd.DistributedOptimizer(
        sgd(m), m.named_parameters(), process_set=getattr(hvd, "global_process_set", None)), "global process set")

    _check_process_set_optimizer(rank, world, sgd)

    class OtherSet:
        process_set_id = 3
        ranks = [0]
    with pytest.raises(ValueError, match="not registered"):
        hvd.DistributedOptimizer(sgd(helpers.make_model()), process_set=OtherSet())

    sparse_check.check_sparse(rank, world, sparse_as_dense=False)
    sparse_check.check_sparse(rank, world, sparse_as_dense=True)
    hvd.shutdown()


def _check_process_set_optimizer(rank, world, sgd):
    """A registered subset (the even ranks): its members' gradients are averaged over the set alone; the others do
    not build the optimizer (as in Horovod), and building it there raises."""
    members = list(range(0, world, 2))  # [0] on 2 ranks (a set of one), [0, 2] on 4
    ps = hvd.add_process_set(members)
    model = helpers.make_model(seed=0)
    batches = [helpers.make_batch(3, r) for r in range(world)]
    if rank in members:
        opt = hvd.DistributedOptimizer(sgd(model), model.named_parameters(), process_set=ps)
        opt.zero_grad()
        helpers.loss_of(model, batches[rank]).backward()
        opt.synchronize()
        local = [_local_grads(model, [batches[r]])[0] for r in members]
        for n, p in model.named_parameters():
            want = sum(l[n] for l in local) / len(members)
            _close(p.grad, want, 1e-6, f"process set {members}: {n} rank {rank}")
        opt._remove_hooks()
    else:
        with pytest.raises(ValueError, match="not a member"):
            hvd.DistributedOptimizer(sgd(model), model.named_parameters(), process_set=ps)
    hvd.remove_process_set(ps)


def _check_adasum_optimizer(rank, world):
    """DistributedOptimizer(op=Adasum): start + the Adasum (adasum_truth) of the ranks' local SGD deltas, each rank's
    batch scaled by its own factor so the deltas have unequal norms."""
    model = helpers.make_model(seed=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                   op=hvd.Adasum)
    assert isinstance(opt, torch.optim.SGD)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = [tuple(adasum_truth.SCALES[r] * v for v in helpers.make_batch(7, r)) for r in range(world)]
    local = [_local_grads(model, [b])[0] for b in batches]
    opt.zero_grad()
    helpers.loss_of(model, batches[rank]).backward()
    opt.step()
    for n, p in model.named_parameters():
        deltas = [-0.1 * local[r][n] for r in range(world)]
        want = adasum_truth.adasum(deltas)
        # the delta's tolerance plus one float32 rounding of start + delta
        allowed = 1e-5 * float(want.abs().max()) + 2.0 ** -23 * float((start[n].double() + want).abs().max())
        err = float((p.detach().double() - start[n].double() - want).abs().max())
        assert err <= allowed, f"Adasum optimizer {n} rank {rank} of {world}: error {err:.3g} > {allowed:.3g}"
        swapped = float((adasum_truth.adasum(deltas, swap_norms=True) - want).abs().max())
        assert swapped > 10 * allowed, f"Adasum optimizer {n}: the deltas cannot tell swapped norms apart"
    with pytest.raises(AssertionError):
        with opt.skip_synchronize():
            pass
    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum,
                                 compression=hvd.Compression.topk(0.1))


@pytest.mark.parametrize("world", [2, 4])
def test_optimizer_horovod_options(world):
    mp.spawn(_options_worker, args=(world, helpers.rendezvous()), nprocs=world, join=True)


def test_compression_specs_still_work():
    assert hvd.Compression.none.spec == "none" and hvd.Compression.fp16.spec == "fp16"
    assert hvd.Compression.none == hvd.CompressionSpec("none")
    assert gradcomp.compressor(hvd.Compression.fp16).spec.startswith("fp16")
    assert gradcomp.compressor(CountingHalf).is_python
    assert hvd.Compression.fp16(prescale=0.5).spec.startswith("fp16")


# -- SyncBatchNorm ----------------------------------------------------------------------------------------------------
def _sbn_worker(rank, world, url):
    _init(rank, world, url)
    for shape, affine, momentum in (((5, 3), True, 0.1), ((4, 3, 2, 5), True, None), ((3, 2, 7), False, 0.3)):
        g = torch.Generator().manual_seed(1)
        xs = [torch.randn(*shape, generator=g) * (r + 1) + r for r in range(world)]
        ws = [torch.randn(*shape, generator=g) for _ in range(world)]  # upstream gradient per rank
        ref_cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)]
        ref = ref_cls(shape[1], affine=affine, momentum=momentum)
        sbn = hvd.SyncBatchNorm(shape[1], affine=affine, momentum=momentum)
        if affine:
            with torch.no_grad():
                for m in (ref, sbn):
                    m.weight.copy_(torch.linspace(0.5, 1.5, shape[1]))
                    m.bias.copy_(torch.linspace(-1, 1, shape[1]))
        for step in range(2):
            xr = torch.cat(xs).requires_grad_()
            yr = ref(xr)
            (yr * torch.cat(ws)).sum().backward()
            x = xs[rank].clone().requires_grad_()
            y = sbn(x)
            (y * ws[rank]).sum().backward()
            n = shape[0]
            what = f"SyncBatchNorm {shape} step {step} rank {rank}"
            _close(y.detach(), yr.detach()[rank * n:(rank + 1) * n], 1e-5, what + " output")
            _close(x.grad, xr.grad[rank * n:(rank + 1) * n], 1e-5, what + " input grad")
            if affine:  # each rank's parameter gradient is its share: their sum is the reference
                for name in ("weight", "bias"):
                    got = hvd.allreduce(getattr(sbn, name).grad, op=hvd.Sum)
                    _close(got, getattr(ref, name).grad, 1e-5, what + f" {name} grad")
                    getattr(sbn, name).grad = None
                    getattr(ref, name).grad = None
            _close(sbn.running_mean, ref.running_mean, 1e-5, what + " running_mean")
            _close(sbn.running_var, ref.running_var, 1e-5, what + " running_var")
        sbn.eval()
        ref.eval()
        _close(sbn(xs[rank]), ref(xs[rank]), 1e-5, "SyncBatchNorm eval")
    hvd.shutdown()


def test_sync_batch_norm_matches_batch_norm_over_concatenated_batch():
    mp.spawn(_sbn_worker, args=(2, helpers.rendezvous()), nprocs=2, join=True)
