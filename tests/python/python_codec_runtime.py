"""A Python-registered codec inside the fusion runtime (issue 33), under mpirun on the "runtime" backend:

    mpirun -np 2 python tests/python/python_codec_runtime.py

Two DistributedOptimizers (two owners) over models with the same parameter names and a stateful Python codec: the
runtime's background thread calls the codec while the ranks wait in synchronize() (the bindings release the GIL; a
wait that held it would deadlock here, caught by the watchdog). Each reduced gradient must equal, bit for bit, the
same codec run on that gradient alone (compressed_allreduce on the world communicator); the runtime must have fused
(copy_bytes > 0); each owner's codec object must have compressed only its own gradients. Exits non-zero on failure.
"""
import sys

import torch

import gradcomp
import gradcomp.torch as hvd
import helpers
from gradcomp.torch.context import _ctx

_C = gradcomp._gradcomp


class CountingHalf:
    """float16 payloads; counts the tensors it compressed (the codec's state)."""

    def __init__(self):
        self.calls = 0

    def compress(self, tensor):
        self.calls += 1
        return tensor.to(torch.float16), tensor.dtype

    def decompress(self, payload, ctx):
        return payload.to(ctx)

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def main():
    helpers.watchdog(100)
    hvd.init()
    assert hvd.backend() == "runtime", hvd.backend()
    gradcomp.register_compressor("counting_half", CountingHalf)
    rank = hvd.rank()
    models = [model(), model()]
    opts = [hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.0), named_parameters=m.named_parameters(),
                                     compression="counting_half") for m in models]
    failures = []
    for owner, (m, opt) in enumerate(zip(models, opts)):
        g = torch.Generator().manual_seed(100 * rank + owner)
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 10, (16,), generator=g)
        plain = model()  # the same weights without hooks: this rank's own gradients
        torch.nn.functional.cross_entropy(plain(x), y).backward()
        local = {n: p.grad.detach().clone() for n, p in plain.named_parameters()}
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.synchronize()
        for n, p in m.named_parameters():
            alone = local[n].reshape(-1).clone()
            _C.compressed_allreduce(_ctx.comm, _C.make_compressor("counting_half"), alone, n, "average")
            if p.grad.reshape(-1).numpy().tobytes() != alone.numpy().tobytes():
                failures.append(f"owner {owner} '{n}': runtime result differs from the codec run alone")
    calls = [opt._compressor._object.calls for opt in opts]
    params = len(list(models[0].parameters()))
    if calls != [params, params]:
        failures.append(f"each owner's codec should have compressed its {params} gradients, got {calls}")
    stats = _ctx.runtime.stats()
    if stats["copy_bytes"] <= 0:
        failures.append(f"the runtime fused nothing (copy_bytes {stats['copy_bytes']})")
    hvd.shutdown()
    gradcomp.unregister_compressor("counting_half")
    for f in failures:
        print(f"rank {rank}: {f}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
