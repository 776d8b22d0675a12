"""Edges of the Python boundary (issue 15, item 5): a tensor of a dtype gradcomp does not take (torch.bool, which
torch 1.13 cannot even export through DLPack; int64; NumPy bool) raises gradcomp.InvalidArgument naming the tensor
and the accepted dtypes at every entry that takes a tensor, never nanobind's TypeError listing signatures; Python
codec names follow the documented [a-z0-9_]+ (ASCII) rule."""
import numpy as np
import pytest
import torch

import gradcomp

BAD = [torch.zeros(8, dtype=torch.bool), torch.zeros(8, dtype=torch.int64), np.zeros(8, dtype=bool)]
ACCEPTED = "float32, float16 or bfloat16"


def _check(err, *words):
    text = str(err.value)
    assert isinstance(err.value, gradcomp.InvalidArgument), repr(err.value)
    assert "incompatible function arguments" not in text, text
    assert ACCEPTED in text, text
    for w in words:
        assert w in text, text


@pytest.mark.parametrize("bad", BAD, ids=["torch.bool", "torch.int64", "numpy.bool"])
def test_compress_and_decompress_refuse_unsupported_dtypes(bad):
    c = gradcomp.compressor("topk:ratio=0.5")
    with pytest.raises(gradcomp.InvalidArgument) as err:
        c.compress(bad, name="fc1.weight")
    _check(err, "fc1.weight", "bool" if bad.dtype in (torch.bool, np.bool_) else "int64")
    payload = c.compress(torch.randn(8), name="w")
    with pytest.raises(gradcomp.InvalidArgument) as err:
        c.decompress(payload, bad)
    _check(err, "decompress() output")
    with pytest.raises(gradcomp.InvalidArgument) as err:  # the extension itself, past the Python wrapper
        c._impl.compress_into(bad, torch.zeros(64, dtype=torch.uint8), "fc2.weight")
    _check(err, "fc2.weight")


def test_collective_entries_refuse_torch_bool():
    C = gradcomp._gradcomp
    if not C.has_collectives:
        pytest.skip("no collectives in this build")
    comm = C.make_local_communicators(1, 5.0)[0]
    with pytest.raises(gradcomp.InvalidArgument) as err:
        C.compressed_allreduce(comm, gradcomp.compressor("none")._impl, BAD[0], "mask", "average", 0)
    _check(err, "mask")
    with pytest.raises(gradcomp.InvalidArgument) as err:
        comm.allreduce(BAD[0], "sum")
    _check(err, "allreduce")


def test_python_codec_names_are_ascii():
    class Half:
        @staticmethod
        def compress(t):
            return t.half(), t.dtype

        @staticmethod
        def decompress(t, ctx):
            return t.to(ctx)

    for bad in ["ñame", "Name", "a-b", "", "ａ"]:
        with pytest.raises(gradcomp.InvalidArgument, match=r"\[a-z0-9_\]\+"):
            gradcomp.register_compressor(bad, Half)
