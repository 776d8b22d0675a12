"""Python codecs in the one C++ registry (issue 33): built by C++'s make_compressor from a spec with parameters,
reduced by compressed_allreduce and by the fusion runtime (its background thread calls into Python while the ranks'
threads wait with the GIL released) with Horovod's combination, fused results bit-identical to each tensor alone,
Python exceptions as gradcomp errors naming the codec, tensor and rank, and the codec's state through the C++
Compressor's save_state/load_state."""
import numpy as np
import pytest
import torch

import gradcomp
import helpers

_C = gradcomp._gradcomp
WORLD = 2


class Quant:
    """Scales to int8-range floats and rounds: a lossy codec with a parameter and a float payload."""

    def __init__(self, scale=127, fail_on=None):
        self.scale = float(scale)
        self.fail_on = fail_on
        self.calls = 0

    def compress(self, tensor):
        self.calls += 1
        if self.fail_on is not None and tensor.numel() == int(self.fail_on):
            raise ValueError("refusing this size")
        return torch.round(tensor * self.scale).to(torch.float16), tensor.dtype

    def decompress(self, payload, ctx):
        return (payload.to(torch.float32) / self.scale).to(ctx)

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


@pytest.fixture(scope="module", autouse=True)
def registered():
    gradcomp.register_compressor("quant", Quant)
    yield
    gradcomp.unregister_compressor("quant")


def values(rank, tensor, n=None):
    n = n or 200 + 37 * tensor
    return np.random.default_rng(10 * rank + tensor).standard_normal(n).astype(np.float32)


def horovod_reference(tensor, scale=127.0):
    """Horovod's combination in NumPy: float16 payloads summed in float32 in rank order, averaged, decoded."""
    acc = np.zeros_like(values(0, tensor))
    for r in range(WORLD):
        acc = acc + np.round(values(r, tensor) * np.float32(scale)).astype(np.float16).astype(np.float32)
    avg = (acc / np.float32(WORLD)).astype(np.float16).astype(np.float32)
    return avg / np.float32(scale)


def test_cpp_registry_builds_a_python_codec_with_parameters():
    impl = _C.make_compressor("quant:scale=63")
    obj = _C.python_codec_object(impl)
    assert isinstance(obj, Quant) and obj.scale == 63.0
    assert impl.spec == "quant:scale=63" and impl.traits["rounds"]
    assert _C.canonical_spec("quant:scale=63") == "quant:scale=63"
    assert any(c["name"] == "quant" and c.get("python") for c in gradcomp.list_compressors())
    c = gradcomp.compressor("quant", scale=31)
    assert c.is_python and c.spec == "quant:scale=31" and c._object.scale == 31.0
    with pytest.raises(gradcomp.InvalidArgument, match="quant"):
        _C.make_compressor("quant:bogus=1")
    with pytest.raises(gradcomp.InvalidArgument, match="not a Python-registered"):
        gradcomp.unregister_compressor("fp16")


def test_compressed_allreduce_is_horovods_combination_and_fusion_invariant():
    def rank(r, comm):
        alone = []
        for t in range(3):
            x = values(r, t)
            _C.compressed_allreduce(comm, _C.make_compressor("quant"), x, f"t{t}")
            alone.append(x)
        fused = np.concatenate([values(r, t) for t in range(3)])
        segments, offset = [], 0
        for t in range(3):
            segments.append((f"t{t}", offset, values(r, t).size))
            offset += values(r, t).size
        stats = _C.compressed_allreduce(comm, _C.make_compressor("quant"), fused, "fused", segments=segments)
        return alone, fused, stats

    results = helpers.on_local_ranks(WORLD, rank)
    for r in range(WORLD):
        alone, fused, stats = results[r]
        assert stats["algorithm"] == "rounds"
        for t in range(3):
            np.testing.assert_allclose(alone[t], horovod_reference(t), rtol=0, atol=1e-6)
        assert np.concatenate(alone).tobytes() == fused.tobytes()


def test_runtime_reduces_a_python_codec_with_fusion_and_owner_state():
    """The runtime's background thread calls the codec; each rank waits (GIL released) meanwhile. Two owners (scopes)
    with the same tensor names keep their own codec objects."""
    def rank(r, comm):
        rt = _C.Runtime(comm, default_spec="none", op="average", cycle_time_ms=20)
        owners = [_C.make_compressor("quant"), _C.make_compressor("quant")]
        data = {(o, t): values(r, t) for o in range(2) for t in range(3)}
        handles = [rt.allreduce_async(f"t{t}", data[o, t], compressor=owners[o], scope=f"owner{o}", step=0)
                   for o in range(2) for t in range(3)]
        by_spec = values(r, 0)
        handles.append(rt.allreduce_async("by_spec", by_spec, "quant"))
        for h in handles:
            rt.wait(h)
        rt.synchronize()
        stats = rt.stats()
        rt.shutdown()
        return data, by_spec, [_C.python_codec_object(o).calls for o in owners], stats

    results = helpers.on_local_ranks(WORLD, rank)
    for r in range(WORLD):
        data, by_spec, calls, stats = results[r]
        for (o, t), x in data.items():
            np.testing.assert_allclose(x, horovod_reference(t), rtol=0, atol=1e-6)
        assert by_spec.tobytes() == data[0, 0].tobytes()
        assert calls == [3, 3], calls  # each owner's own object compressed its own three tensors
    assert results[0][3]["tensors"] >= 7


def test_python_exception_names_codec_tensor_and_rank():
    def rank(r, comm):
        x = values(r, 0, n=5)
        with pytest.raises(gradcomp.InvalidArgument) as info:
            _C.compressed_allreduce(comm, _C.make_compressor("quant:fail_on=5"), x, "weights")
        return str(info.value)

    messages = helpers.on_local_ranks(1, rank)
    assert "quant" in messages[0] and "'weights'" in messages[0] and "rank 0" in messages[0]
    assert "refusing this size" in messages[0]


def test_state_round_trip_through_the_cpp_compressor():
    c = gradcomp.compressor("quant")
    c._object.calls = 7
    state = c.state_dict()
    d = gradcomp.compressor("quant")
    d.load_state_dict(state)
    assert d._object.calls == 7
    impl = _C.make_compressor("quant")
    impl.load_state(c._impl.save_state())
    assert _C.python_codec_object(impl).calls == 7
    with pytest.raises(gradcomp.CorruptPayload, match="quant"):
        impl.load_state(b"\x80not a pickle")


def test_single_payload_calls_refuse_clearly():
    impl = _C.make_compressor("quant")
    with pytest.raises(gradcomp.InvalidArgument, match="rounds"):
        impl.compress_into(np.ones(4, np.float32), np.empty(64, np.uint8), "x")
