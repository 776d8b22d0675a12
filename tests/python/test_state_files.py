"""State files of every state-bearing Python object (issue 15, item 4): a Compressor, a Python codec, the DDP hook's
state and DistributedOptimizer on the torch backend (2 gloo ranks). Saved with torch.save and loaded back: a flipped
byte in the file or in the state, truncated state bytes and a missing field raise gradcomp.CorruptPayload; another
rank's or world size's state and another codec's raise gradcomp.InvalidArgument; every failed load leaves the object
exactly as it was (its next state_dict() is unchanged). Before the envelope, flipped bytes loaded silently (a
residual of ~2e37) and another rank's state loaded silently."""
import copy
import io
import os

import pytest
import torch
import torch.multiprocessing as mp

import gradcomp
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
    assert marker in bytes(_envelope(state)["state"])
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
    return state["gradcomp"] if "gradcomp" in state else state


def _damaged(state, marker):
    """(what, damaged copy) pairs, each one a CorruptPayload."""
    def edit(fn):
        s = copy.deepcopy(state)
        fn(_envelope(s))
        return s

    def flip(e):
        b = bytearray(e["state"])
        b[len(b) // 3] ^= 1
        e["state"] = bytes(b)
    return [("flipped byte in the file", _flip_in_file(state, marker)),
            ("flipped state byte", edit(flip)),
            ("truncated state", edit(lambda e: e.update(state=e["state"][:-5]))),
            ("empty state", edit(lambda e: e.update(state=b""))),
            ("changed step", edit(lambda e: e.update(step=(e["step"] or 0) + 1))),
            ("missing checksum", edit(lambda e: e.pop("checksum"))),
            ("old format", edit(lambda e: e.pop("format")))]


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


def test_one_checksum_for_cpp_and_python_states():
    """The Python envelope's checksum is the C++ runtime's state checksum (FNV-1a 64: the published test vectors),
    over the envelope's fields and bytes: a changed field or byte changes it."""
    from gradcomp import _gradcomp
    assert _gradcomp.state_checksum(b"") == 0xcbf29ce484222325
    assert _gradcomp.state_checksum(b"a") == 0xaf63dc4c8601ec8c
    assert _gradcomp.state_checksum(b"foobar") == 0x85944171f73967e8
    env = gradcomp._state.seal("compressor", "topk:ratio=0.1", b"\x01\x02", rank=0, world_size=2, step=3)
    assert env["version"] == 2 and len(env["checksum"]) == 16
    header = repr(("gradcomp.state", 2, "compressor", "topk:ratio=0.1", 0, 2, 3)).encode()
    assert int(env["checksum"], 16) == _gradcomp.state_checksum(len(header).to_bytes(8, "little") + header
                                                               + b"\x01\x02")
    assert gradcomp._state.open_state(env, "compressor", "topk:ratio=0.1", 0, 2) == (b"\x01\x02", 3)


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
    other_world = copy.deepcopy(saved)
    other_world.update(world_size=4)
    other_world.update(checksum=gradcomp._state._checksum(other_world, other_world["state"]))
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
    with_runtime = copy.deepcopy(saved)
    with_runtime["gradcomp"]["runtime"] = {"rank": rank, "size": WORLD, "state": b""}
    with pytest.warns(UserWarning, match="backend 'torch' has no runtime"):
        opt2.load_state_dict(with_runtime)
    opt._remove_hooks()
    opt2._remove_hooks()
    hvd.shutdown()


def test_hook_and_optimizer_state_files_2_ranks():
    mp.spawn(_worker, args=(helpers.rendezvous(),), nprocs=WORLD, join=True)
