"""gradcomp.torch.elastic with the owner residuals of scatter-reduce-allgather (issue 32): a CompressedAdam (onebit:
1-bit Adam's worker and server errors) and a DistributedOptimizer (qsgd) committed on 2 gloo ranks and resumed
- on the same ranks: everything comes back, and training goes on bit-identical to the uninterrupted run;
- with the ranks swapped, and on a world of 1: each rank keeps its old rank's worker residuals, the owner residuals
  ("<parameter>#sra<i>": a piece of the old world's partition) are dropped and reported, and training goes on.
Before the owner records were told apart, the resume refused them as residuals of unknown parameters."""
import contextlib
import io
import os
import pickle

import torch
import torch.multiprocessing as mp

import gradcomp.torch as hvd
import helpers
from gradcomp._codec_state import read_records

WORLD = 2
STEPS = 5


def _make(kind):
    model = helpers.make_model(0)
    if kind == "adam":
        opt = hvd.CompressedAdam(model.parameters(), lr=1e-2, betas=(0.9, 0.95), compression="onebit", warmup=2,
                                 variance="frozen", named_parameters=model.named_parameters(), verbose=False)
    else:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                       named_parameters=model.named_parameters(), compression="qsgd:bits=4")
    return model, opt


def _train(model, opt, state, steps):
    helpers.elastic_train(model, opt, state, steps, hvd.rank())


def _names(codec_bytes):
    return {r.name for r in read_records(codec_bytes)}


def _saved_codec(out, rank):
    with open(os.path.join(out, f"rank{rank}.codec"), "rb") as f:
        return pickle.load(f)


def _resume(kind, directory, ident):
    """A fresh process's model and optimizer resumed from `directory` as node `ident`; (model, opt, state, report)."""
    os.environ["GRADCOMP_ELASTIC_ID"] = ident
    model, opt = _make(kind)
    state = hvd.elastic.TorchState(model, opt, step=0)
    state.set_commit_dir(directory)
    report = io.StringIO()

    @hvd.elastic.run
    def enter(s):
        return s

    with contextlib.redirect_stderr(report):
        enter(state)
    return model, opt, state, report.getvalue()


def _commit_worker(rank, url, kind, directory, out):
    helpers.init_gloo(rank, WORLD, url)
    os.environ["GRADCOMP_ELASTIC_ID"] = f"node{rank}"
    hvd.init()
    model, opt = _make(kind)
    state = hvd.elastic.TorchState(model, opt, step=0)
    state.set_commit_dir(directory)

    @hvd.elastic.run
    def train(s):
        for _ in range(STEPS):
            _train(model, opt, s, 1)
            s.commit()

    train(state)
    codec = opt._compressor._state_bytes()
    names = _names(codec)
    assert f"0.weight#sra{rank}" in names and "0.weight" in names, names  # worker and owner (server) residuals
    with open(os.path.join(out, f"rank{rank}.codec"), "wb") as f:
        pickle.dump(codec, f)

    # Resumed on the same nodes: everything back, and the next steps are the uninterrupted run's, bit for bit.
    model2, opt2, state2, _ = _resume(kind, directory, f"node{rank}")
    assert opt2._compressor._state_bytes() == codec and state2.step == STEPS
    assert opt2._step_count_gc == opt._step_count_gc
    _train(model, opt, state, 2)
    _train(model2, opt2, state2, 2)
    assert helpers.same_values(helpers.model_values(model), helpers.model_values(model2))
    assert opt2._compressor._state_bytes() == opt._compressor._state_bytes()

    # Resumed with the nodes swapped: rank r takes old rank 1 - r's worker residuals; the old owner pieces are not
    # this rank's and are dropped (reported on rank 0); training goes on with identical parameters everywhere.
    model3, opt3, state3, report = _resume(kind, directory, f"node{1 - rank}")
    old = _saved_codec(out, 1 - rank)
    kept = _names(opt3._compressor._state_bytes())
    assert kept == {n for n in _names(old) if "#sra" not in n}, kept
    if rank == 0:
        assert "old rank 1: owner residual of 'optimizer' dropped" in report, report
    _train(model3, opt3, state3, 2)
    gathered = hvd.allgather_object(helpers.model_values(model3))
    assert helpers.same_values(gathered[0], gathered[1]) and all(torch.isfinite(p).all() for p in gathered[0])
    hvd.shutdown()


def _shrunk_worker(rank, url, kind, directory, out):
    helpers.init_gloo(rank, 1, url)
    hvd.init()
    model, opt, state, report = _resume(kind, directory, "node1")
    old = _saved_codec(out, 1)
    assert _names(opt._compressor._state_bytes()) == {n for n in _names(old) if "#sra" not in n}
    assert "old rank 0" in report and "owner residual of 'optimizer' dropped" in report, report
    assert "scatter-reduce-allgather pieces of 2 rank(s), now rank 0 of 1" in report, report
    _train(model, opt, state, 2)  # the old pieces' residuals would not fit the new partition
    assert all(torch.isfinite(p).all() for p in model.parameters())
    hvd.shutdown()


def _run(kind, tmp_path):
    directory, out = str(tmp_path / "commits"), str(tmp_path)
    mp.spawn(_commit_worker, args=(helpers.rendezvous(), kind, directory, out), nprocs=WORLD, join=True)
    mp.spawn(_shrunk_worker, args=(helpers.rendezvous(), kind, directory, out), nprocs=1, join=True)


def test_compressed_adam_onebit_resumes_same_swapped_and_smaller(tmp_path):
    _run("adam", tmp_path)


def test_distributed_optimizer_qsgd_resumes_same_swapped_and_smaller(tmp_path):
    _run("sgd", tmp_path)
