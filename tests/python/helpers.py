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
