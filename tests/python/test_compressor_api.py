"""gradcomp's Python compressor API: round trips through DLPack (torch and NumPy), error classes, helpful messages for
bad specs, state_dict checkpoints, Python-registered codecs and the Horovod-style Compression names."""
import numpy as np
import pytest
import torch

import gradcomp
import helpers


def test_list_compressors_has_builtins_with_traits():
    infos = gradcomp.list_compressors()
    names = [c["name"] for c in infos]
    assert "none" in names
    for c in infos:
        assert set(c["traits"]) >= {"summable", "gatherable", "requantizable", "lossy", "wire_dtype"}


@pytest.mark.parametrize("spec", helpers.available_specs())
def test_round_trip_torch_and_numpy_agree(spec):
    x = torch.randn(5000)
    c_t, c_n = gradcomp.compressor(spec), gradcomp.compressor(spec)
    p_t = c_t.compress(x, name="w", step=3)
    p_n = c_n.compress(x.numpy(), name="w", step=3)
    assert isinstance(p_t, torch.Tensor) and p_t.dtype == torch.uint8
    assert isinstance(p_n, np.ndarray) and p_n.dtype == np.uint8
    assert bytes(p_t.numpy()) == bytes(p_n), "torch and NumPy inputs must give the same payload"
    out = torch.zeros(5000)
    c_t.decompress(p_t, out)
    out2 = np.zeros(5000, dtype=np.float32)
    c_n.decompress(bytes(p_n), out2)  # payload as bytes works too
    assert np.array_equal(out.numpy(), out2)
    if not c_t.traits["lossy"]:
        assert torch.equal(out, x)
    # accumulate adds
    c_t.decompress(p_t, out, accumulate=True)
    assert np.allclose(out.numpy(), 2 * out2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_zero_copy_dtypes(dtype):
    c = gradcomp.compressor("none")
    x = torch.randn(300).to(dtype)
    out = torch.zeros(300, dtype=dtype)
    c.decompress(c.compress(x, name="x"), out)
    assert torch.equal(out, x)


def test_decompress_writes_into_the_callers_memory():
    c = gradcomp.compressor("none")
    big = torch.zeros(10)
    view = big[2:7]  # a contiguous view with an offset
    c.decompress(c.compress(torch.ones(5), name="v"), view)
    assert big.tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0, 0]


def test_bad_spec_messages_are_helpful():
    with pytest.raises(gradcomp.InvalidArgument, match="registered: .*none"):
        gradcomp.compressor("nosuchcodec")
    with pytest.raises(gradcomp.InvalidArgument) as info:
        gradcomp.compressor("none:bogus=1")
    assert "bogus" in str(info.value) and "nonfinite" in str(info.value)
    with pytest.raises(gradcomp.InvalidArgument, match="nonfinite"):
        gradcomp.compressor("none", nonfinite="sometimes")
    with pytest.raises(ValueError):  # InvalidArgument is also a ValueError
        gradcomp.compressor("")


def test_error_classes_map_and_subclass():
    for cls in (gradcomp.InvalidArgument, gradcomp.CorruptPayload, gradcomp.CommError, gradcomp.Timeout,
                gradcomp.CudaError):
        assert issubclass(cls, gradcomp.Error)
    assert issubclass(gradcomp.Timeout, TimeoutError)
    c = gradcomp.compressor("none")
    p = c.compress(torch.randn(100), name="t")
    out = torch.full((100,), 7.0)
    with pytest.raises(gradcomp.CorruptPayload, match="shorter|truncated|bytes"):
        c.decompress(p[:40], out)
    bad = p.clone()
    bad[0] ^= 0xFF  # magic
    with pytest.raises(gradcomp.CorruptPayload):
        c.decompress(bad, out)
    assert torch.all(out == 7.0), "a rejected payload must leave the output untouched"
    with pytest.raises(gradcomp.InvalidArgument, match="not contiguous"):
        c.compress(torch.randn(10, 10).t(), name="nc")
    with pytest.raises(gradcomp.InvalidArgument, match="element type"):
        c.compress(torch.arange(10, dtype=torch.float64), name="f64")
    with pytest.raises(gradcomp.InvalidArgument):
        c.load_state_dict(gradcomp.compressor("fp16").state_dict())
    with pytest.raises(gradcomp.CorruptPayload):
        c.load_state_dict({"spec": c.spec, "state": b"\x01garbage"})  # no envelope (test_state_files.py: the rest)


@pytest.mark.parametrize("spec", helpers.available_specs())
def test_state_dict_resume_is_bit_identical(spec):
    torch.manual_seed(1)
    grads = [torch.randn(20000) for _ in range(6)]
    a = gradcomp.compressor(spec)
    uninterrupted = [bytes(a.compress(g, name="w", step=i).numpy()) for i, g in enumerate(grads)]
    b = gradcomp.compressor(spec)
    for i in range(3):
        b.compress(grads[i], name="w", step=i)
    saved = b.state_dict()
    c = gradcomp.compressor(spec)
    c.load_state_dict(saved)
    resumed = [bytes(c.compress(grads[i], name="w", step=i).numpy()) for i in range(3, 6)]
    assert resumed == uninterrupted[3:]


def test_python_registered_codec():
    helpers.register_python_codec()
    assert "pyhalf" in [c["name"] for c in gradcomp.list_compressors()]
    c = gradcomp.compressor("pyhalf")
    assert c.is_python
    x = torch.randn(10)
    payload, ctx = c.compress(x)
    assert payload.dtype == torch.float16
    assert torch.allclose(c.decompress(payload, ctx), x, atol=1e-2)
    with pytest.raises(gradcomp.InvalidArgument, match="already registered"):
        gradcomp.register_compressor("pyhalf", helpers.HalfPrecision)
    with pytest.raises(gradcomp.InvalidArgument, match="already registered"):
        gradcomp.register_compressor("none", helpers.HalfPrecision)
    with pytest.raises(gradcomp.InvalidArgument, match="decompress"):
        gradcomp.register_compressor("broken", type("Broken", (), {"compress": staticmethod(lambda t: t)}))


def test_compression_names():
    C = gradcomp.Compression
    assert C.topk(0.01).spec == "topk:ratio=0.01"
    assert C.qsgd(4).spec == "qsgd:bits=4"
    assert C.dgc(ratio=0.001).spec == "dgc:ratio=0.001"
    assert C.fp16.spec == "fp16"
    assert C.topk(0.01, ef=False).spec == "topk:ratio=0.01,ef=off"
    # Every registered compressor is a name of Compression (the list lives once, in the registry), Python ones too.
    helpers.register_python_codec()
    for info in gradcomp.list_compressors():
        assert isinstance(getattr(C, info["name"]), gradcomp.CompressionSpec), info["name"]
    assert C.powersgd(4).spec == "powersgd:rank=4"
    assert C.pyhalf.spec == "pyhalf"
    with pytest.raises(AttributeError, match="registered: none"):
        C.tpok
    assert gradcomp.compressor(C.none).spec.startswith("none")


def test_one_spec_parser_and_the_codec_tables_positional_parameters():
    """Specs are parsed by the C++ parser only; equivalent spellings are one canonical spec; the parameter a
    positional argument sets comes from the codec table (list_compressors()["positional"])."""
    C = gradcomp.Compression
    canonical = gradcomp._gradcomp.canonical_spec
    assert canonical("topk") == canonical("topk:ratio=0.01") == canonical(" topk : ef=true , ratio=0.010 ")
    assert canonical("topk") != canonical("topk:ratio=0.02")
    positional = {c["name"]: c["positional"] for c in gradcomp.list_compressors() if not c.get("python")}
    assert positional["topk"] == "ratio" and positional["qsgd"] == "bits" and positional["fp16"] == ""
    assert C.randomk(0.05).spec == "randomk:ratio=0.05"
    with pytest.raises(gradcomp.InvalidArgument, match="by keyword"):
        C.fp16(0.5)
    with pytest.raises(gradcomp.InvalidArgument, match="not key=value"):
        gradcomp.compressor("topk:ratio")
    # "topk" and "topk:ratio=0.01" load each other's state.
    a, b = gradcomp.compressor("topk"), gradcomp.compressor("topk:ratio=0.01")
    a.compress(torch.randn(1000), name="w", step=0)
    b.load_state_dict(a.state_dict())
