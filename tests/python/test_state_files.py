"""State files of every state-bearing Python object (issue 15, item 4): a Compressor, a Python codec, the DDP hook's
state and DistributedOptimizer on the torch backend (2 gloo ranks). Saved with torch.save and loaded back: a flipped
byte in the file or in the state, truncated state bytes and a missing field raise gradcomp.CorruptPayload; another
rank's or world size's state and another codec's raise gradcomp.InvalidArgument; every failed load leaves the object
exactly as it was (its next state_dict() is unchanged). Before the envelope, flipped bytes loaded silently (a
residual of ~2e37) and another rank's state loaded silently."""
import copy
import io
import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import gradcomp
from gradcomp import _state
import gradcomp.torch as hvd
import helpers

WORLD = 2


class Counting:
    """A Python codec with state (a call counter)."""

    def __init__(self):
        self.calls = 0

    def compress(self, t):
        self.calls += 1
        return t.half(), t.dtype

    def decompress(self, t, ctx):
        return t.to(ctx)

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, sd):
        self.calls = sd["calls"]


def _flip_in_file(state, marker):
    """torch.save(state), one bit of the state bytes flipped in the file (torch's zip reader checks no CRC: this is
    what loaded silently), torch.load of the result. pickle keeps bytes as latin-1 text, so an ASCII `marker` of the
    state bytes (a tensor name) is found verbatim in the file."""
    assert marker in _state.fields(_envelope(state))["state"]
    raw = bytearray(_saved(state))
    at = raw.find(marker)
    assert at >= 0 and raw.find(marker, at + 1) < 0, "the marker must occur once in the file"
    raw[at + 1] ^= 0x01
    return torch.load(io.BytesIO(bytes(raw)))


def _saved(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _envelope(state):
    return state["gradcomp"] if isinstance(state, dict) and "gradcomp" in state else state


def _with_envelope(state, envelope):
    if isinstance(state, dict) and "gradcomp" in state:
        return {**state, "gradcomp": envelope}
    return envelope


def legacy(envelope, **extra):
    """The version-2 envelope (a dict, gradcomp's Python-only format before the one C++ envelope) of the same state."""
    f = _state.fields(envelope)
    old = {"format": "gradcomp.state", "version": 2, **{k: f[k] for k in ("kind", "spec", "rank", "world_size",
                                                                         "step", "state")}}
    old["checksum"] = _state._legacy_checksum(old, old["state"])
    return {**old, **extra}


def _damaged(state, marker):
    """(what, damaged copy) pairs, each one a CorruptPayload."""
    env = _envelope(state)
    f = _state.fields(env)
    restepped = _state.seal(f["kind"], f["spec"], f["state"], f["rank"], f["world_size"], (f["step"] or 0) + 1)
    flipped = bytearray(env)
    flipped[16 + (len(env) - 16) * 2 // 3] ^= 1
    version4 = bytearray(env)
    version4[4] = 4
    old = legacy(env)
    return [("flipped byte in the file", _flip_in_file(state, marker)),
            ("flipped state byte", _with_envelope(state, bytes(flipped))),
            ("truncated state", _with_envelope(state, env[:-5])),
            ("empty state", _with_envelope(state, b"")),
            ("changed step", _with_envelope(state, restepped[:8] + env[8:16] + restepped[16:])),
            ("zeroed checksum", _with_envelope(state, env[:8] + bytes(8) + env[16:])),
            ("another version", _with_envelope(state, bytes(version4))),
            ("a flipped byte in a version-2 envelope", _with_envelope(state, {**old, "state": old["state"][:-1]})),
            ("missing checksum", _with_envelope(state, {k: v for k, v in old.items() if k != "checksum"})),
            ("old format", _with_envelope(state, {k: v for k, v in old.items() if k != "format"}))]


def _check_refusals(obj, state, marker, foreign, snapshot):
    """Every damaged copy of `state` raises CorruptPayload, every (what, state) in `foreign` InvalidArgument; after
    each, snapshot() equals what it was."""
    before = snapshot()
    for what, bad in _damaged(state, marker):
        with pytest.raises(gradcomp.CorruptPayload):
            obj.load_state_dict(bad)
        assert snapshot() == before, f"a failed load ({what}) changed the state"
    for what, bad in foreign:
        with pytest.raises(gradcomp.InvalidArgument) as err:
            obj.load_state_dict(bad)
        assert snapshot() == before, f"a failed load ({what}) changed the state"
        yield what, str(err.value)


def _comp_bytes(c):
    return c._state_bytes()


def test_one_envelope_and_checksum_for_cpp_and_python_states():
    """Python states are the C++ envelope's bytes (what Runtime.save_state() writes), sealed with the runtime's
    checksum (FNV-1a 64: the published test vectors) over everything after the header; version-2 envelopes (dicts)
    still load."""
    from gradcomp import _gradcomp
    assert _gradcomp.state_checksum(b"") == 0xcbf29ce484222325
    assert _gradcomp.state_checksum(b"a") == 0xaf63dc4c8601ec8c
    assert _gradcomp.state_checksum(b"foobar") == 0x85944171f73967e8
    env = _state.seal("compressor", "topk:ratio=0.1", b"\x01\x02", rank=0, world_size=2, step=3)
    assert env[:4] == b"GCRS" and int.from_bytes(env[4:8], "little") == 3
    assert int.from_bytes(env[8:16], "little") == _gradcomp.state_checksum(env[16:])
    assert _state.open_state(env, "compressor", "topk:ratio=0.1", 0, 2) == (b"\x01\x02", 3)
    assert _state.open_state(legacy(env), "compressor", "topk:ratio=0.1", 0, 2) == (b"\x01\x02", 3)
    with pytest.raises(gradcomp.CorruptPayload, match="version 4, this build reads 3"):
        _state.fields(env[:4] + (4).to_bytes(4, "little") + env[8:])


@pytest.mark.skipif(not getattr(gradcomp._gradcomp, "has_runtime", False), reason="built without the fusion runtime")
def test_runtime_and_python_states_share_the_envelope():
    """Runtime.save_state() opens through the Python API and re-seals there bit-identically; a state sealed in Python
    loads into a runtime; damage is refused the same way by both; another kind's state is refused by the runtime."""
    from gradcomp import _gradcomp as C
    data = np.arange(64, dtype=np.float32)
    comm = C.make_local_communicators(1, 30.0)[0]
    rt = C.Runtime(comm, default_spec="topk:ratio=0.1", op="sum")
    rt.wait(rt.allreduce_async("w", data))
    rt.synchronize()
    saved = rt.save_state()
    rt.shutdown()
    f = _state.fields(saved)
    assert (f["kind"], f["spec"], f["rank"], f["world_size"]) == ("runtime", "", 0, 1) and b"w" in f["state"]
    assert _state.seal("runtime", "", f["state"], 0, 1) == saved
    assert _state.open_state(saved, "runtime", "", 0, 1) == (f["state"], None)
    fresh = C.Runtime(comm, default_spec="topk:ratio=0.1", op="sum")
    fresh.load_state(_state.seal("runtime", "", f["state"], 0, 1))
    assert fresh.save_state() == saved
    damaged = bytearray(saved)
    damaged[len(damaged) // 2] ^= 1
    with pytest.raises(gradcomp.CorruptPayload, match="checksum mismatch"):
        fresh.load_state(bytes(damaged))
    with pytest.raises(gradcomp.CorruptPayload, match="checksum mismatch"):
        _state.fields(bytes(damaged))
    with pytest.raises(gradcomp.InvalidArgument, match="not of a runtime"):
        fresh.load_state(_state.seal("compressor", "topk:ratio=0.1", b"", 0, 1))
    fresh.shutdown()


def test_compressor_state_files():
    c = gradcomp.compressor("topk:ratio=0.1")
    for step in range(2):
        c.compress(torch.randn(1000), name="layer.weight", step=step)
    state = c.state_dict()
    other = gradcomp.compressor("topk:ratio=0.2")
    other.compress(torch.randn(1000), name="w")
    hook_state, _ = hvd.ddp_comm_hook("topk:ratio=0.1")
    foreign = [("another codec", other.state_dict()), ("a hook's state", hook_state.state_dict())]
    fresh = gradcomp.compressor("topk:ratio=0.1")
    fresh.compress(torch.randn(1000), name="v")
    msgs = dict(_check_refusals(fresh, state, b"layer.weight", foreign, lambda: _comp_bytes(fresh)))
    assert "ratio=0.2" in msgs["another codec"] and "ratio=0.1" in msgs["another codec"], msgs
    assert "not of a compressor" in msgs["a hook's state"], msgs
    fresh.load_state_dict(torch.load(io.BytesIO(_saved(state))))
    assert _comp_bytes(fresh) == _comp_bytes(c)


def test_python_codec_state_files():
    if "counting" not in {c["name"] for c in gradcomp.list_compressors()}:
        gradcomp.register_compressor("counting", Counting)
    c = gradcomp.compressor("counting")
    c.compress(torch.randn(10))
    c.compress(torch.randn(10))
    state = c.state_dict()
    fresh = gradcomp.compressor("counting")
    list(_check_refusals(fresh, state, b"calls", [("a C++ codec's", gradcomp.compressor("none").state_dict())],
                         lambda: fresh._object.calls))
    fresh.load_state_dict(state)
    assert fresh._object.calls == 2


def _worker(rank, url):
    helpers.watchdog()
    os.environ.update(GRADCOMP_INIT_METHOD=url, RANK=str(rank), WORLD_SIZE=str(WORLD), GRADCOMP_TORCH_PG="gloo")
    hvd.init(backend="torch")
    # The hook's state: residuals of one exchange, then every kind of bad file.
    state, hook = hvd.ddp_comm_hook("topk:ratio=0.1")
    params = [torch.zeros(300), torch.zeros(700)]

    class Bucket:
        buffer = staticmethod(lambda: torch.randn(1000, generator=torch.Generator().manual_seed(rank)))
        parameters = staticmethod(lambda: params)
        is_last = staticmethod(lambda: True)
        index = staticmethod(lambda: 0)
    hook(state, Bucket()).wait()
    saved = state.state_dict()
    everyone = hvd.broadcast_object(saved, root_rank=0), hvd.broadcast_object(saved, root_rank=1)
    theirs = everyone[1 - rank]
    f = _state.fields(saved)
    other_world = _state.seal(f["kind"], f["spec"], f["state"], f["rank"], 4, f["step"])
    fresh, _ = hvd.ddp_comm_hook("topk:ratio=0.1")
    msgs = dict(_check_refusals(fresh, saved, b"param1", [("another rank's", theirs),
                                                          ("another world size's", other_world)],
                                lambda: (fresh.step, _comp_bytes(fresh.compressor))))
    assert f"saved by rank {1 - rank} of 2" in msgs["another rank's"], msgs
    assert "of 4" in msgs["another world size's"], msgs
    fresh.load_state_dict(saved)
    assert fresh.step == 1 and _comp_bytes(fresh.compressor) == _comp_bytes(state.compressor)

    # DistributedOptimizer (torch backend): the same, and the wrapped optimizer's state is untouched by a failed load.
    model = helpers.make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), compression="topk:ratio=0.1")
    for step in range(2):
        opt.zero_grad()
        helpers.loss_of(model, helpers.make_batch(step, rank)).backward()
        opt.step()
    saved = opt.state_dict()
    theirs = hvd.broadcast_object(saved, root_rank=0), hvd.broadcast_object(saved, root_rank=1)
    theirs = theirs[1 - rank]
    model2 = helpers.make_model()
    opt2 = hvd.DistributedOptimizer(torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9),
                                    named_parameters=model2.named_parameters(), compression="topk:ratio=0.1")

    def snapshot():
        return (opt2._step_count_gc, _comp_bytes(opt2._compressor), repr(opt2.param_groups), len(opt2.state))
    msgs = dict(_check_refusals(opt2, saved, b"2.weight", [("another rank's", theirs)], snapshot))
    assert f"saved by rank {1 - rank} of 2" in msgs["another rank's"], msgs
    # A wrapped-optimizer state that torch refuses (another parameter count) after a valid gradcomp part: rolled back.
    bad_groups = copy.deepcopy(saved)
    bad_groups["param_groups"][0]["params"] = bad_groups["param_groups"][0]["params"][:1]
    before = snapshot()
    with pytest.raises(ValueError):
        opt2.load_state_dict(bad_groups)
    assert snapshot() == before, "a load that torch refused changed the compressor"
    opt2.load_state_dict(saved)
    assert opt2._step_count_gc == 2 and _comp_bytes(opt2._compressor) == _comp_bytes(opt._compressor)
    # A checkpoint that holds a fusion runtime's state, loaded on a backend without a runtime: warned, dropped.
    with_runtime = {**saved, "gradcomp": legacy(saved["gradcomp"], runtime={"rank": rank, "size": WORLD, "state": b""})}
    with pytest.warns(UserWarning, match="backend 'torch' has no runtime"):
        opt2.load_state_dict(with_runtime)
    opt._remove_hooks()
    opt2._remove_hooks()
    hvd.shutdown()


def test_hook_and_optimizer_state_files_2_ranks():
    mp.spawn(_worker, args=(helpers.rendezvous(),), nprocs=WORLD, join=True)
