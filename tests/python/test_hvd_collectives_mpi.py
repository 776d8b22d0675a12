"""Horovod API parity checks of gradcomp.torch's collectives, topology, process sets and utilities (issue 19). Each
call's values are compared with a plain reference computed here from every rank's (deterministic) input.

Run under mpirun on the mpi / runtime backends (GRADCOMP_BACKEND), exits non-zero on failure:
    mpirun -np 4 python tests/python/test_hvd_collectives_mpi.py
test_hvd_collectives.py runs the same checks on the torch backend (mp.spawn + gloo)."""
import sys

import os

import torch

import gradcomp
import gradcomp.torch as hvd


def _x(r, dtype=torch.float32, shape=(3, 4)):
    """Rank r's input: small integers (exact in every dtype and order of summation)."""
    n = 1
    for s in shape:
        n *= s
    v = (torch.arange(n, dtype=torch.int64).view(shape) % 5) + r - 1
    return v.to(dtype)


def _eq(a, b, what):
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}: {a} != {b}"


def check_allreduce(rank, size):
    xs = {dt: [_x(r, dt) for r in range(size)] for dt in (torch.float32, torch.float64, torch.int32, torch.int64)}
    for dt, parts in xs.items():
        total = parts[0].clone()
        prod = parts[0].clone()
        for p in parts[1:]:
            total += p
            prod *= p
        mine = parts[rank]
        _eq(hvd.allreduce(mine, op=hvd.Sum), total, f"Sum {dt}")
        _eq(hvd.allreduce(mine, op=hvd.Min), torch.stack(parts).amin(0), f"Min {dt}")
        _eq(hvd.allreduce(mine, op=hvd.Max), torch.stack(parts).amax(0), f"Max {dt}")
        _eq(hvd.allreduce(mine, op=hvd.Product), prod, f"Product {dt}")
        if dt.is_floating_point:
            _eq(hvd.allreduce(mine), total / size, f"Average {dt}")
            _eq(hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0),
                ((total.double() * 0.5) * 4.0).to(dt), f"scaled Sum {dt}")
        else:  # Horovod: the sum times (postscale / size), truncated toward zero
            _eq(hvd.allreduce(mine, op=hvd.Average), (total.double() * (1.0 / size)).to(dt), f"Average {dt}")
            _eq(hvd.allreduce(mine, op=hvd.Average, postscale_factor=3.0),
                (total.double() * (3.0 / size)).to(dt), f"scaled Average {dt}")
    # Past comm_ops.GATHER_MAX_BYTES the reduce-scatter + allgather path (an odd length: the last chunk padded).
    for dt in (torch.float64, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32):
        parts = torch.stack([_x(r, torch.float64, (7, 151)) for r in range(size)])
        mine = parts[rank].to(dt)
        _eq(hvd.allreduce(mine, op=hvd.Sum), parts.sum(0).to(dt), f"Sum {dt} (7, 151)")
        _eq(hvd.allreduce(mine, op=hvd.Min), parts.amin(0).to(dt), f"Min {dt} (7, 151)")
        _eq(hvd.allreduce(mine, op=hvd.Max), parts.amax(0).to(dt), f"Max {dt} (7, 151)")
        _eq(hvd.allreduce(mine, op=hvd.Product), parts.prod(0).to(dt), f"Product {dt} (7, 151)")
    x, total = xs[torch.float32][rank], sum(xs[torch.float32][1:], xs[torch.float32][0].clone())
    h = hvd.allreduce_async(x, op=hvd.Sum)
    assert hvd.poll(h)
    _eq(hvd.synchronize(h), total, "allreduce_async")
    y = x.clone()
    _eq(hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum)), total, "allreduce_async_")
    _eq(y, total, "allreduce_async_ in place")
    y = x.clone()
    hvd.allreduce_(y, average=False)
    _eq(y, total, "allreduce_")
    outs = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)
    _eq(outs[0], total, "grouped_allreduce[0]")
    _eq(outs[1], 2 * total, "grouped_allreduce[1]")
    outs = hvd.synchronize(hvd.grouped_allreduce_async([x, 2 * x], op=hvd.Sum))
    _eq(outs[1], 2 * total, "grouped_allreduce_async")
    ys = [x.clone(), 2 * x]
    hvd.synchronize(hvd.grouped_allreduce_async_(ys, op=hvd.Sum))
    _eq(ys[1], 2 * total, "grouped_allreduce_async_")
    ys = [x.clone()]
    hvd.grouped_allreduce_(ys, op=hvd.Sum)
    _eq(ys[0], total, "grouped_allreduce_")
    # Differentiable: d/dx sum(allreduce(x, Sum) * w) = allreduce(w, Sum) (w the same on every rank: size * w).
    w = torch.arange(12, dtype=torch.float32).view(3, 4)
    xg = x.clone().requires_grad_()
    (hvd.allreduce(xg, op=hvd.Sum) * w).sum().backward()
    _eq(xg.grad, w * size, "allreduce gradient")
    xg = x.clone().requires_grad_()
    (hvd.allreduce(xg) * w).sum().backward()
    _eq(xg.grad, w * size / size, "allreduce Average gradient")


def check_gathers(rank, size):
    # allgather with different first dimensions: rank r has r+1 rows.
    parts = [torch.full((r + 1, 2), float(r)) + torch.arange(2.0) for r in range(size)]
    _eq(hvd.allgather(parts[rank]), torch.cat(parts), "allgather")
    _eq(hvd.synchronize(hvd.allgather_async(parts[rank].long())), torch.cat(parts).long(), "allgather_async int64")
    g = hvd.grouped_allgather([parts[rank], parts[rank].double()])
    _eq(g[1], torch.cat(parts).double(), "grouped_allgather")
    _eq(hvd.synchronize(hvd.grouped_allgather_async([parts[rank]]))[0], torch.cat(parts), "grouped_allgather_async")
    xg = parts[rank].clone().requires_grad_()
    w = torch.arange(float(sum(r + 1 for r in range(size)) * 2)).view(-1, 2)
    (hvd.allgather(xg) * w).sum().backward()
    off = sum(r + 1 for r in range(rank))
    _eq(xg.grad, w[off:off + rank + 1], "allgather gradient")
    # broadcast (out of place, in place, async), with the gradient: averaged on the root, zeros elsewhere.
    root = size - 1
    x = _x(rank)
    _eq(hvd.broadcast(x, root), _x(root), "broadcast")
    _eq(x, _x(rank), "broadcast leaves the input")
    y = _x(rank, torch.int64)
    hvd.broadcast_(y, root)
    _eq(y, _x(root, torch.int64), "broadcast_ int64")
    _eq(hvd.synchronize(hvd.broadcast_async(x, 0)), _x(0), "broadcast_async")
    y = x.clone()
    hvd.synchronize(hvd.broadcast_async_(y, 0))
    _eq(y, _x(0), "broadcast_async_")
    xg = x.clone().requires_grad_()
    hvd.broadcast(xg, root).sum().backward()
    _eq(xg.grad, torch.ones(3, 4) if rank == root else torch.zeros(3, 4), "broadcast gradient")
    # alltoall with splits: rank r sends d+1 rows to rank d, each row (r, d).
    splits = [d + 1 for d in range(size)]
    send = torch.cat([torch.tensor([[rank, d]] * (d + 1)) for d in range(size)])
    out, recv = hvd.alltoall(send, splits=torch.tensor(splits, dtype=torch.int32))
    _eq(out, torch.cat([torch.tensor([[s, rank]] * (rank + 1)) for s in range(size)]), "alltoall splits")
    _eq(recv, torch.full((size,), rank + 1, dtype=torch.int32), "alltoall received splits")
    even = torch.arange(2 * size, dtype=torch.float64).view(-1, 1) + 100 * rank
    expect = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float64).view(-1, 1) + 100 * s
                        for s in range(size)])
    _eq(hvd.alltoall(even), expect, "alltoall equal")
    _eq(hvd.synchronize(hvd.alltoall_async(even)), expect, "alltoall_async")
    xg = send.float().requires_grad_()
    o, _ = hvd.alltoall(xg, splits=splits)
    (o * (rank + 1)).sum().backward()
    _eq(xg.grad, torch.cat([torch.full((d + 1, 2), float(d + 1)) for d in range(size)]), "alltoall gradient")
    # reducescatter: 2*size+1 rows; the first (n % size) ranks get one more row.
    rows = 2 * size + 1
    parts = [torch.arange(rows * 3, dtype=torch.float32).view(rows, 3) * (r + 1) for r in range(size)]
    total = sum(parts[1:], parts[0].clone())
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    mine = total[start:start + base + (rank < extra)]
    _eq(hvd.reducescatter(parts[rank], op=hvd.Sum), mine, "reducescatter Sum")
    _eq(hvd.reducescatter(parts[rank]), mine / size, "reducescatter Average")
    _eq(hvd.synchronize(hvd.reducescatter_async(parts[rank], op=hvd.Sum)), mine, "reducescatter_async")
    _eq(hvd.grouped_reducescatter([parts[rank]], op=hvd.Sum)[0], mine, "grouped_reducescatter")
    _eq(hvd.synchronize(hvd.grouped_reducescatter_async([parts[rank]], op=hvd.Sum))[0], mine,
        "grouped_reducescatter_async")
    for dt in (torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64):
        mine_dt = total.double()[start:start + base + (rank < extra)]
        _eq(hvd.reducescatter(parts[rank].to(dt), op=hvd.Sum), mine_dt.to(dt), f"reducescatter Sum {dt}")
        if dt.is_floating_point:
            _eq(hvd.reducescatter(parts[rank].to(dt), op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0),
                (mine_dt * 2.0).to(dt), f"reducescatter scaled Sum {dt}")
        else:  # Horovod: the sum times (postscale / size), truncated toward zero
            _eq(hvd.reducescatter(parts[rank].to(dt), op=hvd.Average, postscale_factor=3.0),
                (mine_dt * (3.0 / size)).to(dt), f"reducescatter scaled Average {dt}")
    few = torch.ones(size - 1, 2) * (rank + 1)  # fewer rows than ranks: the last rank owns none
    got = hvd.reducescatter(few, op=hvd.Sum)
    _eq(got, torch.full((1 if rank < size - 1 else 0, 2), float(size * (size + 1) // 2)), "reducescatter few rows")
    # sparse_allreduce_async: the allgathered (uncoalesced) COO tensor, averaged.
    sp = [torch.sparse_coo_tensor(torch.tensor([[r % 3, 4]]), torch.tensor([1.0 + r, 2.0]), (6,))
          for r in range(size)]
    dense = sum((s.to_dense() for s in sp[1:]), sp[0].to_dense()) / size
    _eq(hvd.synchronize(hvd.sparse_allreduce_async(sp[rank], "sp", hvd.Average)).to_dense(), dense, "sparse")


def check_objects(rank, size):
    assert hvd.allgather_object({"r": rank}) == [{"r": r} for r in range(size)]
    assert hvd.broadcast_object({"r": rank, "l": [rank] * 3}, root_rank=1) == {"r": 1, "l": [1, 1, 1]}
    # What only cloudpickle serializes (Horovod's serializer): a lambda closing over the root's rank, a class defined
    # in this function, and a list of rank-local lambdas gathered from every rank.
    scale = rank + 2
    f = hvd.broadcast_object(lambda v: v * scale, root_rank=1)
    assert f(10) == 30, f(10)

    class Local:
        def __init__(self, r):
            self.r = r

        def twice(self):
            return 2 * self.r
    got = hvd.broadcast_object(Local(rank), root_rank=size - 1)
    assert got.twice() == 2 * (size - 1) and type(got).__name__ == "Local", got
    fns = hvd.allgather_object(lambda: rank * 7)
    assert [fn() for fn in fns] == [r * 7 for r in range(size)], [fn() for fn in fns]

    class Unpicklable:
        def __reduce__(self):
            raise TypeError("cannot pickle this")
    try:
        hvd.broadcast_object(Unpicklable() if rank == 0 else None, root_rank=0)
        raise AssertionError("broadcast_object of an unpicklable object did not raise")
    except gradcomp.InvalidArgument as e:
        assert "cannot pickle this" in str(e), e
    model = torch.nn.Linear(3, 2)
    torch.nn.init.constant_(model.weight, float(rank))
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    _eq(model.weight.detach(), torch.zeros(2, 3), "broadcast_parameters(list)")
    torch.nn.init.constant_(model.bias, float(rank))
    hvd.broadcast_parameters(model.named_parameters(), root_rank=1)
    _eq(model.bias.detach(), torch.ones(2), "broadcast_parameters(named)")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert len(opt.state) == 2, "broadcast_optimizer_state created no state on a fresh optimizer"
    opt.param_groups[0]["lr"] = 0.1 * (rank + 1)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.1


def check_join(rank, size):
    x = _x(rank)
    if rank == 0:
        last = hvd.join()
    else:
        avg = hvd.allreduce(x)
        total = sum((_x(r) for r in range(2, size)), _x(1))
        _eq(avg, total / size, "allreduce while rank 0 is joined")
        isum = hvd.allreduce(_x(rank, torch.int64), op=hvd.Sum)
        _eq(isum, sum((_x(r, torch.int64) for r in range(2, size)), _x(1, torch.int64)), "int Sum while joined")
        # allreduce(compression=...): on the mpi and torch backends (and for a codec the runtime does not negotiate)
        # the joined rank learns codec, name and shape from the control round; a lost shape fails PowerSGD's check.
        for spec in ("fp16", "topk:ratio=1.0"):
            got = hvd.allreduce(x, compression=spec, name=f"joined.{spec}", op=hvd.Sum)
            _eq(got, sum((_x(r) for r in range(2, size)), _x(1)), f"allreduce(compression={spec!r}) while joined")
        low = hvd.allreduce(_x(rank, shape=(6, 4)), compression="powersgd:rank=1", name="joined.powersgd")
        assert low.shape == (6, 4) and bool(torch.isfinite(low).all()), "powersgd allreduce while joined"
        last = hvd.join()
    assert last != 0, f"join() returned {last}, the first rank to join"
    assert hvd.join() == size - 1  # every rank joins at once: the highest


def check_join_rows(rank, size):
    """A control round that was not one (a rank ran a collective join() does not serve) is named, not an IndexError."""
    from gradcomp.torch import join_protocol
    rows = torch.zeros(size, 5, dtype=torch.int64)
    rows[:, 0] = join_protocol.ALLREDUCE
    rows[size - 1] = torch.tensor([7, 123, -4, 99, 5])
    try:
        join_protocol.check_agreement(rows, "probe")
    except gradcomp.InvalidArgument as e:
        assert f"rank {size - 1}'s control row [7, 123, -4, 99, 5]" in str(e) and "does not serve" in str(e), str(e)
    else:
        raise AssertionError("a row of an unknown kind passed the join protocol's check")


def _join_batch(step, r):
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)


def _join_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def check_join_optimizer(rank, size):
    """Uneven data: rank r takes 2 + r steps, then join(). The others' steps go on with the joined ranks' zeros: each
    step's update is the sum of the gradients of the ranks still stepping / size (Horovod's join). Each rank's
    parameters after its own steps equal a reference computed here from every rank's batches; with fp16 compression
    the same within fp16 rounding."""
    for compression, tol in ((hvd.Compression.none, 1e-6), (hvd.Compression.fp16, 2e-3)):
        model = _join_model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), compression=compression)
        for step in range(2 + rank):
            x, y = _join_batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        last = hvd.join()
        assert last == size - 1, f"join() returned {last}; rank {size - 1} steps longest"
        ref = _join_model()
        for step in range(2 + rank):
            grads = [torch.zeros_like(p) for p in ref.parameters()]
            for r in range(size):
                if step < 2 + r:
                    ref.zero_grad()
                    x, y = _join_batch(step, r)
                    torch.nn.functional.mse_loss(ref(x), y).backward()
                    for g, p in zip(grads, ref.parameters()):
                        g += p.grad
            with torch.no_grad():
                for g, p in zip(grads, ref.parameters()):
                    p -= 0.1 * g / size
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            err = (p.detach() - q).abs().max().item()
            assert err <= tol, f"rank {rank}, {compression}: '{name}' after {2 + rank} steps with joined ranks: " \
                f"off by {err} (tolerance {tol})"
        hvd.barrier()


def check_join_cost(rank, size):
    """What join support costs while no rank is joined: no control round (join_protocol.rounds) and no note
    (join_notes.notes_sent) for a DistributedOptimizer step on any backend (a joined rank learns of each exchange from
    notes the others send it only once it has joined); the agreement round of a global-set allreduce (none for a
    float32 Average or Sum on the runtime backend, which negotiates it) and no note."""
    from gradcomp.torch import join_notes, join_protocol
    notes_before = join_notes.notes_sent
    model = _join_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=hvd.Compression.fp16)
    before = join_protocol.rounds
    for step in range(5):
        x, y = _join_batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    per_step = (join_protocol.rounds - before) / 5
    assert per_step == 0, f"{hvd.backend()} backend: {per_step} control rounds per step, expected none"
    before = join_protocol.rounds
    hvd.allreduce(_x(rank), name="join_cost")
    expected = 0 if hvd.backend() == "runtime" else 1
    assert join_protocol.rounds - before == expected, \
        f"{hvd.backend()} backend: a float32 Average allreduce ran {join_protocol.rounds - before} control rounds"
    before = join_protocol.rounds
    ys = hvd.grouped_allreduce_([_x(rank), 2 * _x(rank), _x(rank, shape=(7,))], op=hvd.Sum, name="join_cost.grouped")
    _eq(ys[1], 2 * sum(_x(r) for r in range(size)), "grouped_allreduce_ through the runtime")
    assert join_protocol.rounds - before == (0 if hvd.backend() == "runtime" else 3), \
        f"{hvd.backend()} backend: a grouped allreduce of three float32 tensors ran {join_protocol.rounds - before} " \
        "control rounds"
    before = join_protocol.rounds
    hvd.allreduce(_x(rank, torch.int64), op=hvd.Sum, name="join_cost.int")
    assert join_protocol.rounds - before == 1, "an integer allreduce runs one control round"
    assert join_notes.notes_sent == notes_before, f"{join_notes.notes_sent - notes_before} notes while no rank joined"


def _expect_disagreement(fn, needles, what):
    try:
        fn()
    except gradcomp.InvalidArgument as e:
        text = str(e)
        for needle in needles:
            assert needle in text, f"{what} on the {hvd.backend()} backend: {needle!r} not in: {text}"
        return
    raise AssertionError(f"{what} on the {hvd.backend()} backend: a shape mismatch across ranks was not refused")


def check_shape_mismatch(rank, size):
    """A shape mismatch across ranks in a global-set allreduce is refused on every rank by the control round, naming
    the tensor and the ranks of both sides (a gradient's: runtime_test's negotiation, allreduce_local_test's
    compressed_allreduce check, test_hook_agreement's exchange worker check)."""
    numel = 12 if rank == 0 else 10
    _expect_disagreement(lambda: hvd.allreduce(torch.ones(numel), name="shape.probe"),
                         ["'shape.probe'", "rank 0 has", "[12]", "[10]", "rank 1 has"], "allreduce")
    hvd.barrier()


# Registered by init(process_sets=[INIT_SET]) (Horovod's argument) in both launchers of these checks (a set of every
# rank would duplicate the global set, and check_process_sets adds the even ranks).
_WORLD = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 2)
INIT_SET = hvd.ProcessSet([1, 2] if _WORLD > 2 else [1])


def check_init_process_sets(rank, size):
    assert INIT_SET.process_set_id is not None, "init(process_sets=[...]) did not register the set"
    if rank in INIT_SET.ranks:
        _eq(hvd.allreduce(_x(rank), op=hvd.Sum, process_set=INIT_SET), sum(_x(r) for r in INIT_SET.ranks),
            "allreduce on init's set")
    hvd.barrier()
    assert hvd.remove_process_set(INIT_SET)
    for bad in (dict(process_sets="all"), dict(comm=[0])):  # checked before init() sees it is initialized
        try:
            hvd.init(**bad)
            raise AssertionError(f"init({bad}) did not raise")
        except gradcomp.InvalidArgument as e:
            assert "init(" in str(e), e


def check_process_sets(rank, size):
    members = list(range(0, size, 2))
    ps = hvd.add_process_set(members)
    assert ps.process_set_id is not None and ps.ranks == members and ps.included() == (rank in members)
    if rank in members:
        assert ps.size() == len(members) and ps.rank() == members.index(rank)
        total = sum((_x(r) for r in members[1:]), _x(members[0]))
        _eq(hvd.allreduce(_x(rank), op=hvd.Sum, process_set=ps), total, "allreduce process set")
        _eq(hvd.allreduce(_x(rank, torch.int64), op=hvd.Max, process_set=ps),
            torch.stack([_x(r, torch.int64) for r in members]).amax(0), "Max process set")
        _eq(hvd.broadcast(_x(rank), members[-1], process_set=ps), _x(members[-1]), "broadcast process set")
        _eq(hvd.allgather(torch.tensor([rank]), process_set=ps), torch.tensor(members), "allgather process set")
        assert hvd.allgather_object(rank, process_set=ps) == members
        # DistributedOptimizer over the set: a lossy C++ codec through the set's communicator (on the runtime
        # backend too, whose fusion runtime runs on the world), gradients averaged over the members alone.
        weight = torch.nn.Parameter(torch.zeros(4, 6))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), [("set.weight", weight)],
                                       compression="topk:ratio=1.0", process_set=ps)
        opt.zero_grad()
        (weight * (rank + 1)).sum().backward()
        want = torch.full((4, 6), sum(r + 1 for r in members) / len(members))
        opt.synchronize()
        _eq(weight.grad, want, "DistributedOptimizer process set")
        opt._remove_hooks()
        hvd.barrier(process_set=ps)
    else:
        try:
            hvd.allreduce(_x(rank), process_set=ps)
            raise AssertionError("a non-member's collective on a process set did not raise")
        except ValueError:
            pass
    hvd.barrier()
    try:
        hvd.add_process_set(members)
        raise AssertionError("a duplicate process set was added")
    except ValueError:
        pass
    assert hvd.remove_process_set(ps) and ps.process_set_id is None
    assert not hvd.remove_process_set(hvd.global_process_set)
    assert hvd.global_process_set.size() == size and hvd.global_process_set.rank() == rank


def _build_config():
    """{GRADCOMP_WITH_X: 0|1} from the build tree's generated config.h (the tests run against the build tree), or
    None when the package is not a build tree's."""
    path = os.path.join(os.path.dirname(gradcomp.__file__), "..", "..", "generated", "include", "gradcomp",
                        "config.h")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        words = [line.split() for line in f]
    return {w[1]: int(w[2]) for w in words if len(w) == 3 and w[1].startswith("GRADCOMP_WITH")}


def check_topology(rank, size):
    assert hvd.cross_size() * hvd.local_size() >= size and 0 <= hvd.cross_rank() < hvd.cross_size()
    # Nodes of k ranks (GRADCOMP_LOCAL_SIZE, read on each call): homogeneous exactly when k divides the world.
    saved = os.environ.get("GRADCOMP_LOCAL_SIZE")
    try:
        for k in (1, 2, 3, size):
            os.environ["GRADCOMP_LOCAL_SIZE"] = str(k)
            assert hvd.is_homogeneous() == (size % k == 0), (k, size)
            assert (hvd.cross_rank(), hvd.cross_size()) == (rank // k, (size + k - 1) // k), (k, size)
    finally:
        if saved is None:
            os.environ.pop("GRADCOMP_LOCAL_SIZE", None)
        else:
            os.environ["GRADCOMP_LOCAL_SIZE"] = saved
    # Build flags against the build's own configuration and what gradcomp never has.
    config = _build_config()
    if config is not None:
        assert hvd.mpi_built() == bool(config["GRADCOMP_WITH_MPI"])
        assert hvd.nccl_built() == bool(config["GRADCOMP_WITH_NCCL"])
        assert hvd.cuda_built() == bool(config["GRADCOMP_WITH_CUDA"] or config["GRADCOMP_WITH_NCCL"])
    assert hvd.gloo_built() == torch.distributed.is_gloo_available()
    assert (hvd.rocm_built(), hvd.ddl_built(), hvd.ccl_built()) == (False, False, False)
    assert hvd.mpi_threads_supported() == hvd.mpi_enabled()
    assert hvd.mpi_enabled() == (hvd.backend() in ("mpi", "runtime"))
    assert hvd.gloo_enabled() == (hvd.backend() == "torch")
    assert issubclass(hvd.HorovodInternalError, gradcomp.CommError)
    try:
        hvd.start_timeline("/nonexistent/timeline_{rank}.json")  # no runtime, or a file that cannot be opened
        raise AssertionError("start_timeline of /nonexistent did not raise")
    except gradcomp.InvalidArgument:
        pass
    hvd.stop_timeline()
    if hvd.backend() == "runtime":
        # The runtime's timeline, started and stopped while it runs: the exchange in between is in the file.
        import json
        import tempfile
        folder = hvd.broadcast_object(tempfile.mkdtemp() if rank == 0 else None)
        pattern = os.path.join(folder, "timeline_{rank}.json")
        hvd.start_timeline(pattern)
        hvd.allreduce(torch.ones(64), name="timeline.probe", compression="topk:ratio=0.5")
        hvd.stop_timeline()
        with open(pattern.replace("{rank}", str(rank))) as f:
            names = {event["name"] for event in json.load(f)["traceEvents"]}
        assert "timeline.probe" in names and "compress" in names, sorted(names)


def run_all():
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    for check in (check_allreduce, check_gathers, check_objects, check_join, check_join_rows, check_join_optimizer, check_join_cost,
                  check_init_process_sets, check_process_sets, check_topology, check_shape_mismatch):
        check(rank, size)
        hvd.barrier()
    return True


if __name__ == "__main__":
    hvd.init(process_sets=[INIT_SET])
    try:
        run_all()
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        import os
        os._exit(1)
    print(f"rank {hvd.rank()}: hvd collectives OK on backend {hvd.backend()}")
    hvd.shutdown()
