"""gradcomp.torch.elastic's pieces without torchrun (issue 18): the state objects' commit / restore / sync and @run's
re-entry on 2 gloo ranks, commits on disk and the resume from them (each rank's own residual, the step counter, the
previous commit when a file is damaged, InvalidArgument naming the parameter for another spec or model), the commit
store (atomic files, keep-last-N, CorruptPayload), the codec-state reader, the rank matching, the ElasticSampler."""
import os
import pickle

import pytest
import torch
import torch.multiprocessing as mp

import gradcomp
import gradcomp.torch as hvd
import helpers
from gradcomp._codec_state import read_records
from gradcomp.torch.elastic import membership, sampler as sampler_mod
from gradcomp.torch.elastic.store import CommitStore

WORLD = 2


def test_codec_state_reader_gives_residual_norm():
    c = gradcomp.compressor("topk", ratio=0.1)
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    payload = c.compress(g, name="w", step=0)
    sent = torch.zeros_like(g)
    c.decompress(payload, sent)
    (rec,) = read_records(c._state_bytes())
    assert rec.name == "w" and rec.numel == 1000 and rec.residual_bytes == 4000
    assert rec.residual_norm == pytest.approx(float((g - sent).norm()), rel=1e-5)
    assert read_records(b"") == []
    with pytest.raises(gradcomp.CorruptPayload):
        read_records(c._state_bytes()[:-7])


def test_assign_by_identity_then_by_rank():
    old = {0: "a", 1: "b", 2: "c"}
    assert membership.assign(old, ["c", "a"], 3) == [2, 0]  # survivors keep their own, whatever their new rank
    assert membership.assign(old, ["b", "x", "a"], 3) == [1, None, 0]  # x joined
    assert membership.assign(old, ["x", "y", "z"], 3) == [0, 1, 2]  # a whole job restarted at the same size
    assert membership.assign(old, ["x", "y"], 3) == [None, None]  # restarted smaller: nothing to match


def test_store_atomic_keep_last_n_and_corruption(tmp_path):
    store = CommitStore(str(tmp_path), keep=2)
    for seq in range(4):
        store.write(seq, 0, 1, {"seq": seq, "t": torch.arange(4.0)})
    assert store.seqs() == [3, 2]
    open(store.path(3, 0) + ".tmp999", "wb").write(b"half a file")  # a writer killed before the rename
    assert list(store.files(3)) == [0]
    rank, world, seq, payload = store.read(store.path(3, 0))
    assert (rank, world, seq, payload["seq"]) == (0, 1, 3, 3)
    raw = bytearray(open(store.path(3, 0), "rb").read())
    raw[len(raw) // 2] ^= 0x10
    open(store.path(3, 0), "wb").write(bytes(raw))
    with pytest.raises(gradcomp.CorruptPayload, match="rank-0.gcstate"):
        store.read(store.path(3, 0))
    open(store.path(2, 0), "wb").write(bytes(raw[:100]))
    with pytest.raises(gradcomp.CorruptPayload):
        store.read(store.path(2, 0))


def test_elastic_sampler_repartitions_the_rest_of_the_epoch(monkeypatch):
    world = {"size": 2, "rank": 0}
    monkeypatch.setattr(sampler_mod, "size", lambda: world["size"])
    monkeypatch.setattr(sampler_mod, "rank", lambda: world["rank"])
    data = list(range(23))
    seen = set()
    for r in range(2):
        world["rank"] = r
        s = sampler_mod.ElasticSampler(data, seed=3)
        list(iter(s))
        s.record_batch(0, 4)
        seen |= s.processed_indices
    assert len(seen) == 8
    world["size"] = 3
    rest = []
    for r in range(3):
        world["rank"] = r
        s = sampler_mod.ElasticSampler(data, seed=3)
        s.load_state_dict({"epoch": 0, "processed_indices": seen})
        rest += list(iter(s))
    assert set(rest) == set(data) - seen and len(rest) == 15  # 15 left, split 5/5/5


def _make(spec="topk:ratio=0.1", width=64):
    model = helpers.make_model(0) if width == 64 else torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=spec)
    return model, opt


def _train(model, opt, state, steps):
    helpers.elastic_train(model, opt, state, steps, hvd.rank())


def _memory_worker(rank, url):
    helpers.init_gloo(rank, WORLD, url)
    hvd.init()
    model, opt = _make()
    state = hvd.elastic.TorchState(model, opt, step=0, note="x")
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    entries = []

    @hvd.elastic.run
    def train(state):
        entries.append(state.step)
        _train(model, opt, state, 2)
        state.commit()
        if len(entries) == 1:
            committed = (helpers.model_values(model), opt._compressor._state_bytes(), opt._step_count_gc)
            _train(model, opt, state, 1)
            state.note = "changed"
            assert not helpers.same_values(committed[0], helpers.model_values(model))
            train.committed = committed
            raise hvd.HorovodInternalError("injected: a peer died")
        return state.step

    assert train(state) == 4 and entries == [0, 2] and resets == [WORLD]
    # After the failure the state was back at the commit (step 2) when the function was entered again.
    params, codec, gc_step = train.committed
    assert hvd.is_initialized() and hvd.size() == WORLD

    # restore() returns to the last commit: parameters, residuals, step counter, plain values.
    state.commit()
    at_commit = (helpers.model_values(model), opt._compressor._state_bytes(), opt._step_count_gc)
    _train(model, opt, state, 1)
    state.note = "again"
    state.restore()
    assert helpers.same_values(at_commit[0], helpers.model_values(model)) and opt._compressor._state_bytes() == at_commit[1]
    assert opt._step_count_gc == at_commit[2] and state.step == 4 and state.note == "x"
    assert len(codec) > 0 and gc_step == 2

    # sync(): rank 0's model, optimizer step counter and values on every rank; residuals stay per rank.
    own_residual = opt._compressor._state_bytes()
    if rank == 1:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        state.step = 99
        opt._step_count_gc = 77
    state.sync()
    gathered = hvd.allgather_object((helpers.model_values(model), state.step, opt._step_count_gc))
    assert helpers.same_values(gathered[0][0], gathered[1][0]) and gathered[0][1:] == gathered[1][1:] == (4, 4)
    assert opt._compressor._state_bytes() == own_residual

    # A host update seen by one rank interrupts the commit on every rank; run re-enters without restoring.
    state2 = hvd.elastic.TorchState(model, opt, step=0)
    calls = []

    @hvd.elastic.run
    def train2(s):
        calls.append(s.step)
        s.step += 1
        if len(calls) == 1 and rank == 1:
            s.on_hosts_updated(1)
        s.commit()
        return len(calls)

    assert train2(state2) == 2 and calls == [0, 1]
    hvd.shutdown()


def test_commit_restore_sync_and_run_2_ranks():
    mp.spawn(_memory_worker, args=(helpers.rendezvous(),), nprocs=WORLD, join=True)


def _resume(directory, spec="topk:ratio=0.1", width=64):
    model, opt = _make(spec, width)
    state = hvd.elastic.TorchState(model, opt, step=0)
    state.set_commit_dir(directory)

    @hvd.elastic.run
    def enter(s):
        return s

    enter(state)
    return model, opt, state


def _disk_worker(rank, url, directory):
    helpers.init_gloo(rank, WORLD, url)
    hvd.init()
    model, opt = _make()
    state = hvd.elastic.TorchState(model, opt, step=0)
    state.set_commit_dir(directory, keep=3)

    @hvd.elastic.run
    def train(s):
        for _ in range(3):
            _train(model, opt, s, 1)
            s.commit()
            if s.step == 2:
                train.at2 = (helpers.model_values(model), opt._compressor._state_bytes())

    train(state)
    saved = (helpers.model_values(model), opt._compressor._state_bytes(), opt._step_count_gc)

    # A fresh process's view: the newest commit, this rank's own residual, the step counter, the values.
    model2, opt2, state2 = _resume(directory)
    assert helpers.same_values(saved[0], helpers.model_values(model2)) and opt2._compressor._state_bytes() == saved[1]
    assert opt2._step_count_gc == 3 and state2.step == 3
    assert state2._disk.seq == 3  # the next commit continues the numbering

    # A damaged file of the newest commit: CorruptPayload reported, the commit before it is used.
    hvd.barrier()
    if rank == 1:
        path = state._disk.store.path(2, 1)
        raw = bytearray(open(path, "rb").read())
        raw[len(raw) // 3] ^= 0x01
        open(path, "wb").write(bytes(raw))
    hvd.barrier()
    model3, opt3, state3 = _resume(directory)
    (skipped,) = state3._disk.resumed["skipped"]
    assert "CorruptPayload" in skipped and "commit-000000002/rank-1.gcstate" in skipped, skipped
    assert state3._disk.resumed["seq"] == 1 and state3.step == 2 and helpers.same_values(train.at2[0], helpers.model_values(model3))
    assert opt3._compressor._state_bytes() == train.at2[1]

    # Another codec, another model: InvalidArgument naming the parameter, on every rank.
    spec_error = r"parameter '0\.(bias|weight)'.*'topk:.*ratio=0.1.*'qsgd:bits=4"
    with pytest.raises(gradcomp.InvalidArgument, match=spec_error):
        _resume(directory, spec="qsgd:bits=4")
    with pytest.raises(gradcomp.InvalidArgument, match=r"parameter '0\.weight'"):
        _resume(directory, width=48)
    hvd.shutdown()


def test_disk_commits_resume_corrupt_and_mismatch_2_ranks(tmp_path):
    mp.spawn(_disk_worker, args=(helpers.rendezvous(), str(tmp_path)), nprocs=WORLD, join=True)


def _hook_worker(rank, url, directory):
    from torch.nn.parallel import DistributedDataParallel as DDP
    helpers.init_gloo(rank, WORLD, url)
    hvd.init()

    def make():
        model = helpers.make_model(0)
        ddp = DDP(model)
        hook_state, hook = hvd.ddp_comm_hook("topk:ratio=0.1", model=model)
        ddp.register_comm_hook(hook_state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        state = hvd.elastic.TorchState(model, opt, hook=hook_state, step=0)
        state.set_commit_dir(directory)
        return model, ddp, hook_state, opt, state

    model, ddp, hook_state, opt, state = make()

    @hvd.elastic.run
    def train(s):
        for _ in range(3):
            opt.zero_grad()
            helpers.loss_of(ddp, helpers.make_batch(s.step, rank)).backward()
            opt.step()
            s.step += 1
            s.commit()

    train(state)
    saved = (helpers.model_values(model), hook_state.compressor._state_bytes(), hook_state.step)
    assert len(saved[1]) > 100 and saved[2] == 3
    # restore(): the hook's residuals and step go back to the commit with the model.
    opt.zero_grad()
    helpers.loss_of(ddp, helpers.make_batch(9, rank)).backward()
    assert hook_state.compressor._state_bytes() != saved[1]
    state.restore()
    assert hook_state.compressor._state_bytes() == saved[1] and hook_state.step == 3
    # A restarted process: this rank's own hook residual and the step counter come back from disk.
    model2, ddp2, hook2, opt2, state2 = make()

    @hvd.elastic.run
    def enter(s):
        return s.step

    assert enter(state2) == 3
    assert helpers.same_values(saved[0], helpers.model_values(model2)) and hook2.compressor._state_bytes() == saved[1] and hook2.step == 3
    hvd.shutdown()


def test_ddp_hook_state_commit_and_resume_2_ranks(tmp_path):
    mp.spawn(_hook_worker, args=(helpers.rendezvous(), str(tmp_path)), nprocs=WORLD, join=True)
