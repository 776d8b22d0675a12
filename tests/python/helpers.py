"""Shared pieces of the Python tests: a Horovod-shaped Python codec, the list of codecs to cover, a small model."""
import socket

import torch

import gradcomp

# Codecs exercised wherever they are registered (every built-in that exists in this build is covered).
WANTED_SPECS = ["none", "fp16", "bf16", "topk:ratio=0.05", "randomk:ratio=0.05", "blocktopk", "dgc", "qsgd",
                "terngrad", "onebit"]


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


def expected_grads(ref_comps, model, batches, step, world):
    """Reference aggregation: each rank's local gradient through that rank's own compressor (its own residuals),
    decoded and averaged, exactly as the DDP hook and the optimizer's torch.distributed backend define it."""
    import copy
    local = []
    for r in range(world):
        m = copy.deepcopy(model)
        m.zero_grad()
        loss_of(m, batches[r]).backward()
        local.append({n: p.grad.detach().clone().view(-1) for n, p in m.named_parameters()})
    expected = {}
    for name, p in model.named_parameters():
        acc = torch.zeros(p.numel())
        summable = True
        for r in range(world):
            c = ref_comps[r]
            if c.is_python:
                payload, ctx = c.compress(local[r][name], name=name)
                acc += c.decompress(payload / world, ctx)
                continue
            summable = c.traits["summable"]
            payload = c.compress(local[r][name], name=name, step=step, rank=r, world_size=world,
                                 prescale=1.0 / world if summable else 1.0)
            out = torch.zeros(p.numel())
            c.decompress(payload, out)
            acc += out
        expected[name] = acc if summable else acc / world
    return expected


def tolerance(spec):
    name = spec.split(":")[0]
    if name in ("fp16", "pyhalf"):
        return 2e-3
    if name == "bf16":
        return 2e-2
    return 1e-5


def assert_grads_match(model, expected, spec, rank, step):
    for name, p in model.named_parameters():
        got = p.grad.view(-1)
        scale = float(expected[name].abs().max()) + 1e-12
        err = float((got - expected[name]).abs().max()) / scale
        assert err <= tolerance(spec), f"rank {rank} spec {spec} step {step} param {name}: relative error {err:.3g}"


def stateful_specs():
    """Codecs whose checkpoint matters (residuals, momenta), among those registered."""
    names = {c["name"] for c in gradcomp.list_compressors()}
    return [s for s in ["topk:ratio=0.05", "dgc", "qsgd", "onebit"] if s.split(":")[0] in names]
