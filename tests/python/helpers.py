"""Shared pieces of the Python tests: a Horovod-shaped Python codec, the list of codecs to cover, a small model."""
import os
import socket

import torch

import gradcomp

# Codecs exercised wherever they are registered (every built-in that exists in this build is covered).
WANTED_SPECS = ["none", "fp16", "bf16", "topk:ratio=0.05", "randomk:ratio=0.05", "blocktopk", "dgc", "qsgd",
                "terngrad", "onebit", "powersgd:rank=2"]


def available_specs():
    names = {c["name"] for c in gradcomp.list_compressors()}
    return [s for s in WANTED_SPECS if s.split(":")[0] in names]


class HalfPrecision:
    """Horovod's FP16 compressor shape, written in Python; counts its calls so tests can see it was used."""
    calls = 0

    @staticmethod
    def compress(tensor):
        HalfPrecision.calls += 1
        return tensor.to(torch.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)


def register_python_codec():
    if "pyhalf" not in {c["name"] for c in gradcomp.list_compressors()}:
        gradcomp.register_compressor("pyhalf", HalfPrecision)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous():
    """A file:// init_method: no TCP port that another job on a busy machine could take between choice and use."""
    import tempfile
    import uuid
    return "file://" + os.path.join(tempfile.gettempdir(), f"gradcomp-test-{os.getpid()}-{uuid.uuid4().hex}")


def watchdog(seconds=100):
    """A rank that hangs prints every thread's stack and exits (so a hang fails fast, with a trace)."""
    import faulthandler
    faulthandler.dump_traceback_later(int(os.environ.get("GRADCOMP_TEST_WATCHDOG", seconds)), exit=True)


def init_gloo(rank, world, url):
    import datetime
    watchdog()
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=90))


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def make_batch(step, rank, n=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, 32, generator=g)
    y = torch.randn(n, 4, generator=g)
    return x, y


def loss_of(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def local_grads(model, batches, world):
    """Each rank's local gradient ({parameter name: flat tensor} per rank), computed on copies of `model`."""
    import copy
    local = []
    for r in range(world):
        m = copy.deepcopy(model)
        m.zero_grad()
        loss_of(m, batches[r]).backward()
        local.append({n: p.grad.detach().clone().view(-1) for n, p in m.named_parameters()})
    return local


def reference_allreduce(ref_comps, flats, name, step, segments=None, op="average", hierarchical=False):
    """What gradcomp's C++ compressed_allreduce gives when rank r holds flats[r] and compresses with ref_comps[r]:
    the same algorithms run over in-process communicators (comm/local, one thread per rank), independent of
    torch.distributed. Returns every rank's result."""
    outs = [f.clone() for f in flats]
    on_local_ranks(len(flats), lambda r, comm: gradcomp._gradcomp.compressed_allreduce(
        comm, ref_comps[r]._impl, outs[r], name, op, step, 0, segments, "auto", hierarchical))
    return outs


def on_local_ranks(world, fn):
    """Calls fn(rank, communicator) on `world` in-process ranks (comm/local, one thread each); returns the results in
    rank order and re-raises the first rank's exception."""
    import threading
    comms = gradcomp._gradcomp.make_local_communicators(world, 60.0)
    results, errors = [None] * world, []

    def run(r):
        try:
            results[r] = fn(r, comms[r])
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def expected_grads(ref_comps, model, batches, step, world):
    """Reference of per-parameter exchanges (DistributedOptimizer): C++ codecs through reference_allreduce under each
    parameter's name; Python codecs with Horovod semantics (each rank's payload averaged, decoded with its ctx)."""
    local = local_grads(model, batches, world)
    expected = Expected(local, world)
    for name, p in model.named_parameters():
        if not ref_comps[0].is_python:
            # As the optimizer hands a parameter over: a matrix of its first dimension's rows when it has two or
            # more dimensions (what shape-aware codecs such as powersgd compress).
            shape = (p.shape[0], -1) if p.dim() >= 2 else (-1,)
            flats = [local[r][name].view(shape) for r in range(world)]
            expected[name] = reference_allreduce(ref_comps, flats, name, step)[0].view(-1)
            continue
        acc = torch.zeros(p.numel())
        for r in range(world):
            payload, ctx = ref_comps[r].compress(local[r][name], name=name)
            acc += ref_comps[r].decompress(payload / world, ctx)
        expected[name] = acc
    return expected


def expected_bucket_grads(ref_comps, local, buckets, world, hierarchical=False):
    """Reference of the DDP hook: every recorded bucket (name, [(parameter, offset, numel)], step) exchanged whole by
    reference_allreduce with its segments, as the hook hands it to the C++ algorithms; {parameter: gradient}."""
    expected = Expected(local, world)
    for name, segments, step in buckets:
        flats = [torch.cat([local[r][s[0]] for s in segments]) for r in range(world)]
        out = reference_allreduce(ref_comps, flats, name, step, segments, hierarchical=hierarchical)[0]
        for n, offset, numel, *_ in segments:
            expected[n] = out[offset:offset + numel]
    return expected


class Expected(dict):
    """{parameter: expected gradient}, with `magnitude`: {parameter: sum over ranks of |local gradient| / world}, the
    size of the terms a dense sum adds for each element."""

    def __init__(self, local, world):
        super().__init__()
        self.world = world
        self.magnitude = {n: sum(local[r][n].double().abs() for r in range(world)) / world for n in local[0]}


# Unit roundoff of the half-precision codecs' wire dtype (dense sums, bounded per element in assert_grads_match).
HALF_UNIT = {"fp16": 2.0 ** -11, "pyhalf": 2.0 ** -11, "bf16": 2.0 ** -8}


def tolerance(spec):
    """Largest error relative to the expected tensor's largest magnitude (assert_grads_match bounds the half-precision
    codecs per element instead)."""
    name = spec.split(":")[0]
    if name in ("fp16", "pyhalf"):
        return 2e-3
    if name == "bf16":
        return 2e-2
    if name == "powersgd":
        return 1e-4  # sums in another order, then orthonormalized
    return 1e-5


def half_sum_bounds(spec, magnitude, world):
    """Per-element bound of a half-precision dense sum against the reference's sum of the same terms (its own rounding
    too): each is within gamma_{n-1} = (n-1)u / (1-(n-1)u) of the terms' magnitude of the exact sum (Higham, eq. 4.4),
    plus two roundings of each input (the codec's, and the order in which prescale and rounding apply, which may
    differ between the two sides), plus the error-feedback residual carried into the terms (at most one rounding of
    an earlier value: 4u of the largest magnitude) and half a subnormal per rounding (tests/comm/sum_bound.h in C++)."""
    u = HALF_UNIT[spec.split(":")[0]]
    k = world - 1
    gamma = k * u / (1 - k * u)
    tiny = 2.0 ** -24 if u == 2.0 ** -11 else 2.0 ** -133
    floor = 4 * u * float(magnitude.max()) if magnitude.numel() else 0.0
    return (2 * gamma + 2 * u) * (magnitude + floor) + 2 * world * tiny


def assert_grads_match(model, expected, spec, rank, step):
    for name, p in model.named_parameters():
        got = p.grad.view(-1)
        want = expected[name].view(-1)
        if spec.split(":")[0] in HALF_UNIT and isinstance(expected, Expected):
            bound = half_sum_bounds(spec, expected.magnitude[name].view(-1), expected.world)
            outside = ((got.double() - want.double()).abs() > bound).nonzero().view(-1)
            assert outside.numel() == 0, (f"rank {rank} spec {spec} step {step} param {name}: {outside.numel()} "
                                          f"elements outside their bound, first {int(outside[0])}: got "
                                          f"{float(got[outside[0]])}, want {float(want[outside[0]])}")
            continue
        scale = float(want.abs().max()) + 1e-12
        err = float((got - want).abs().max()) / scale
        assert err <= tolerance(spec), f"rank {rank} spec {spec} step {step} param {name}: relative error {err:.3g}"


def stateful_specs():
    """Codecs whose checkpoint matters (residuals, momenta), among those registered."""
    names = {c["name"] for c in gradcomp.list_compressors()}
    return [s for s in ["topk:ratio=0.05", "dgc", "qsgd", "onebit"] if s.split(":")[0] in names]


def release(*ddps):
    """Tears DDP objects down while their process group is still alive (a Reducer destroyed after
    destroy_process_group() can hang in torch 1.13), after a barrier so no rank is still communicating."""
    import gc
    import torch.distributed as dist
    dist.barrier()
    for d in ddps:
        d.__dict__.pop("reducer", None)
    del ddps
    gc.collect()
    dist.barrier()


class FakeBucket:
    """The parts of DDP's GradBucket the gradcomp hook reads: a flat buffer and the parameters laid out in it."""

    def __init__(self, buffer, params):
        self._buffer, self._params = buffer, params

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params

    def is_last(self):
        return True

    def index(self):
        return 0


def elastic_train(model, opt, state, steps, rank):
    """`steps` steps of `opt` on this rank's batches, counting them in the elastic `state.step`."""
    for _ in range(steps):
        opt.zero_grad()
        loss_of(model, make_batch(state.step, rank)).backward()
        opt.step()
        state.step += 1


def model_values(model):
    """Copies of every entry of the model's state_dict, in order."""
    return [p.detach().clone() for p in model.state_dict().values()]


def same_values(a, b):
    """Whether two model_values() lists are equal bit for bit."""
    return all(torch.equal(x, y) for x, y in zip(a, b))
