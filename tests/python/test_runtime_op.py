"""The fusion runtime's per-request op through the binding (issue 16): Runtime.allreduce_async(op="sum") on 3
in-process ranks is exactly the sum of the ranks' values (float32 added in rank order, as comm/local does), which the
average scaled back by 3 (how the runtime backend once faked Sum) is not; "average" and the runtime's default op
(None) average, in the same cycles, and an unknown op raises InvalidArgument."""
import numpy as np
import pytest

import gradcomp
import helpers

_C = gradcomp._gradcomp
pytestmark = pytest.mark.skipif(not getattr(_C, "has_runtime", False), reason="built without the fusion runtime")

WORLD = 3


def values(rank, tensor):
    return np.random.default_rng(100 * rank + tensor).standard_normal(300 + 50 * tensor).astype(np.float32)


def rank_order(world, tensor, scale=None):
    acc = values(0, tensor) if scale is None else values(0, tensor) * scale
    for r in range(1, world):
        acc = acc + (values(r, tensor) if scale is None else values(r, tensor) * scale)
    return acc


def test_sum_is_exact_and_ops_stay_apart_on_3_ranks():
    ops = ["sum", "average", None, "sum", "sum", None]

    def rank(r, comm):
        rt = _C.Runtime(comm, default_spec="none", op="average", cycle_time_ms=20)
        data = [values(r, t) for t in range(len(ops))]
        handles = [rt.allreduce_async(f"t{t}", data[t], "none", op=op) for t, op in enumerate(ops)]
        for h in handles:
            rt.wait(h)
        with pytest.raises(gradcomp.InvalidArgument):
            rt.allreduce_async("bad", data[0], "none", op="max")
        rt.shutdown()
        return data

    results = helpers.on_local_ranks(WORLD, rank)
    third = np.float32(1.0) / np.float32(WORLD)
    for t, op in enumerate(ops):
        want = rank_order(WORLD, t) if op == "sum" else rank_order(WORLD, t, third)
        for r in range(WORLD):
            assert results[r][t].tobytes() == want.tobytes(), (t, op, r)
        if op == "sum":
            assert (rank_order(WORLD, t, third) * np.float32(WORLD) != want).any()  # what a faked Sum would lose
