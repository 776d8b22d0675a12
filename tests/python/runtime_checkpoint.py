"""Checkpoint/resume of DistributedOptimizer on the "runtime" backend (gradcomp's C++ fusion runtime), under mpirun.

    mpirun -np 2 python tests/python/runtime_checkpoint.py

Per rank: run A trains 6 steps uninterrupted; run B trains 3 steps and saves {model, optimizer} (the optimizer's
state_dict() carries this rank's state of the optimizer's own compressor, which the runtime runs in its scope); run C starts from a fresh runtime (shutdown() + init()), loads the
checkpoint and trains steps 3..5. C must equal A bit for bit; run D, which loads a fresh compressor state, must differ (so
the test can fail). Each run gets a fresh runtime. Fusion is off (GRADCOMP_FUSION_THRESHOLD=0, set below) so the
grouping cannot depend on when backward produced each gradient; fused buffers are covered by the C++ tests.
Exits non-zero on failure.
"""
import io
import os
import sys

os.environ["GRADCOMP_FUSION_THRESHOLD"] = "0"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gradcomp.torch as hvd  # noqa: E402
from gradcomp import _state  # noqa: E402

SPECS = ["topk:ratio=0.1", "qsgd:bits=4", "dgc:ratio=0.05"]


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    return model


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(16, 20, generator=g), torch.randint(0, 10, (16,), generator=g)


def train(model, opt, first, last, rank):
    for step in range(first, last):
        x, y = batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def fresh(spec):
    hvd.shutdown()
    hvd.init(backend="runtime")
    model = make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression=spec)
    return model, opt


def main():
    hvd.init(backend="runtime")
    rank = hvd.rank()
    ok = True
    for spec in SPECS:
        model_a, opt_a = fresh(spec)
        train(model_a, opt_a, 0, 6, rank)

        model_b, opt_b = fresh(spec)
        train(model_b, opt_b, 0, 3, rank)
        buf = io.BytesIO()
        torch.save({"model": model_b.state_dict(), "opt": opt_b.state_dict()}, buf)  # this rank's own file
        raw = buf.getvalue()
        # The optimizer owns its compressor on the runtime backend too: its residuals are in its own checkpoint.
        assert len(_state.fields(opt_b.state_dict()["gradcomp"])["state"]) > 0, "the compressor state is missing from the checkpoint"

        model_c, opt_c = fresh(spec)
        ckpt = torch.load(io.BytesIO(raw))
        model_c.load_state_dict(ckpt["model"])
        opt_c.load_state_dict(ckpt["opt"])
        train(model_c, opt_c, 3, 6, rank)
        if not torch.equal(flat(model_a), flat(model_c)):
            print(f"rank {rank} {spec}: resumed run differs from the uninterrupted one by "
                  f"{float((flat(model_a) - flat(model_c)).abs().max())}", flush=True)
            ok = False

        model_d, opt_d = fresh(spec)
        ckpt = torch.load(io.BytesIO(raw))
        model_d.load_state_dict(ckpt["model"])
        ckpt["opt"]["gradcomp"] = opt_d.state_dict()["gradcomp"]  # a fresh optimizer's (empty) compressor state
        opt_d.load_state_dict(ckpt["opt"])
        train(model_d, opt_d, 3, 6, rank)
        if torch.equal(flat(model_a), flat(model_d)):
            print(f"rank {rank} {spec}: dropping the runtime state changed nothing (the test cannot fail)",
                  flush=True)
            ok = False

        # Another rank's checkpoint is refused (checkpoints are per rank).
        if hvd.size() > 1:
            ckpt = torch.load(io.BytesIO(raw))
            gc = _state.fields(ckpt["opt"]["gradcomp"])
            ckpt["opt"]["gradcomp"] = _state.seal(gc["kind"], gc["spec"], gc["state"], (rank + 1) % hvd.size(),
                                                  gc["world_size"], gc["step"])
            try:
                opt_d.load_state_dict(ckpt["opt"])
                print(f"rank {rank}: another rank's compressor state was accepted", flush=True)
                ok = False
            except hvd.InvalidArgument:
                pass
        if rank == 0:
            print(f"{spec}: resume bit-identical: {ok}", flush=True)
    hvd.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
