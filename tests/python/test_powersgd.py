"""PowerSGD against a NumPy reference written here (float64, PyTorch's powerSGD_hook semantics): one step and several
with warm start and error feedback, without warm start, without error feedback, and the sum op; on 1 and 3 ranks
(gradcomp's C++ compressed_allreduce over in-process communicators, one thread per rank: the rounds algorithm), with
two matrices and a vector fused in one call, as the hook and the runtime hand them over."""

import numpy as np
import pytest

import gradcomp
import helpers

_C = gradcomp._gradcomp
MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF


def fnv1a64(text):
    h = 0xcbf29ce484222325
    for byte in text.encode():
        h = ((h ^ byte) * 0x100000001b3) & MASK64
    return h


def philox_block(counter, key):
    """Philox 4x32-10 (Salmon et al. 2011) of one 128-bit counter under a 64-bit key."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & MASK32, p1 & MASK32, ((p0 >> 32) ^ c3 ^ k1) & MASK32, p0 & MASK32
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return c0, c1, c2, c3


def initial_q(name, rank, cols, step=0, seed=0):
    """The codec's documented start: Q^T[j][c] = uniform01(bits(j * cols + c)) - 0.5 of the Philox stream keyed by
    (seed, fnv1a64(name), step), uniform01(b) = (b >> 8) / 2^24."""
    mixed = (seed ^ ((fnv1a64(name) * 0x9E3779B97F4A7C15) & MASK64)) & MASK64
    key = (mixed & MASK32, mixed >> 32)
    n = rank * cols
    out = np.empty(n)
    for block in range((n + 3) // 4):
        words = philox_block((block & MASK32, block >> 32, step & MASK32, step >> 32), key)
        for k in range(4):
            if 4 * block + k < n:
                out[4 * block + k] = np.float32(words[k] >> 8) * np.float32(1.0 / 16777216.0) - np.float32(0.5)
    return out.reshape(rank, cols)


class Reference:
    """PowerSGD over all ranks at once: M_i = G_i + e_i; P = sum_i M_i Q; P orthonormalized (Gram-Schmidt);
    Q = sum_i M_i^T P / n; result = P Q^T (times n for sum); e_i = M_i - P Q^T; Q kept when warm_start."""

    def __init__(self, name, rows, cols, rank, ranks, ef=True, warm_start=True):
        self.name, self.rows, self.cols, self.rank, self.ranks = name, rows, cols, rank, ranks
        self.ef, self.warm_start = ef, warm_start
        self.residual = [np.zeros((rows, cols)) for _ in range(ranks)]
        self.q = None

    def step(self, grads, step, average=True):
        if not self.warm_start or self.q is None:
            self.q = initial_q(self.name, self.rank, self.cols, 0 if self.warm_start else step).T  # cols x rank
        mats = [g.reshape(self.rows, self.cols).astype(np.float64) + (e if self.ef else 0)
                for g, e in zip(grads, self.residual)]
        p = sum(m @ self.q for m in mats)
        for j in range(self.rank):
            for k in range(j):
                p[:, j] -= (p[:, k] @ p[:, j]) * p[:, k]
            norm = np.linalg.norm(p[:, j])
            p[:, j] = p[:, j] / norm if norm > 0 else 0
        q = sum(m.T @ p for m in mats) / self.ranks
        approx = p @ q.T
        if self.ef:
            self.residual = [m - approx for m in mats]
        self.q = q
        return (approx if average else approx * self.ranks).reshape(-1)


def run_ranks(spec, tensors, name, step, segments=None, op="average", comps=None):
    """compressed_allreduce of tensors[r] on in-process rank r (threads); returns the stats of rank 0."""
    return helpers.on_local_ranks(len(tensors), lambda r, comm: _C.compressed_allreduce(
        comm, comps[r]._impl, tensors[r], name, op, step, 0, segments, "auto", False))[0]


def gradient(rows, cols, rank, step, salt):
    rng = np.random.default_rng([rank, step, salt])
    return (rng.standard_normal((rows, cols)) * rng.uniform(0.1, 2.0)).astype(np.float32)


def assert_close(got, want, what):
    scale = np.abs(want).max()
    err = np.abs(got.astype(np.float64) - want).max()
    assert err <= 2e-5 * max(scale, 1e-30) * 4, f"{what}: max error {err} vs scale {scale}"


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("params", ["", ",warm_start=off", ",ef=off"])
def test_fused_steps_match_numpy(world, params):
    """Two matrices and a vector in one fused call over 5 steps (warm start and error feedback carry over)."""
    spec = f"powersgd:rank=2{params}"
    comps = [gradcomp.compressor(spec) for _ in range(world)]
    ef, warm = "ef=off" not in params, "warm_start=off" not in params
    ref_a = Reference("layer1.weight", 24, 40, 2, world, ef, warm)
    ref_b = Reference("layer2.weight", 16, 30, 2, world, ef, warm)
    segments = [("layer1.weight", 0, 960, 24), ("layer1.bias", 960, 7, 0), ("layer2.weight", 967, 480, 16)]
    for step in range(5):
        a = [gradient(24, 40, r, step, 1) for r in range(world)]
        v = [gradient(1, 7, r, step, 2) for r in range(world)]
        b = [gradient(16, 30, r, step, 3) for r in range(world)]
        tensors = [np.concatenate([a[r].ravel(), v[r].ravel(), b[r].ravel()]) for r in range(world)]
        stats = run_ranks(spec, tensors, "bucket", step, segments, comps=comps)
        assert stats["algorithm"] == "rounds"
        # Round one: P of both matrices and the vector; round two: Q of both; float32 each.
        assert stats["payload_bytes"] == 4 * (2 * (24 + 40) + 2 * (16 + 30) + 7)
        for r in range(world):
            assert np.array_equal(tensors[r], tensors[0]), f"rank {r} differs from rank 0 at step {step}"
        out = tensors[0]
        assert_close(out[:960], ref_a.step(a, step), f"{spec} layer1.weight step {step}")
        assert_close(out[960:967], np.mean([x.ravel() for x in v], axis=0), f"{spec} bias step {step}")
        assert_close(out[967:], ref_b.step(b, step), f"{spec} layer2.weight step {step}")


def test_sum_op_and_matrix_shape_from_the_array():
    """A 2-D array is its own matrix (rows from its shape, no segments); op sum gives n times the average."""
    world = 2
    comps = [gradcomp.compressor("powersgd:rank=3") for _ in range(world)]
    ref = Reference("w", 32, 20, 3, world)
    for step in range(3):
        grads = [gradient(32, 20, r, step, 4) for r in range(world)]
        tensors = [g.copy() for g in grads]
        run_ranks("powersgd:rank=3", tensors, "w", step, op="sum", comps=comps)
        assert_close(tensors[0].ravel(), ref.step(grads, step, average=False), f"sum step {step}")


def test_rank_not_below_min_dimension_raises_naming_the_tensor():
    comps = [gradcomp.compressor("powersgd:rank=6,min_compression_rate=0")]
    with pytest.raises(gradcomp.InvalidArgument, match="'thin.weight'"):
        run_ranks("", [np.ones((5, 200), np.float32)], "thin.weight", 0, comps=comps)


def test_state_round_trip_continues_bit_identically():
    spec = "powersgd:rank=2"
    a = [gradcomp.compressor(spec)]
    for step in range(3):
        run_ranks(spec, [gradient(24, 40, 0, step, 5)], "w", step, comps=a)
    b = [gradcomp.compressor(spec)]
    b[0].load_state_dict(a[0].state_dict())
    x, y = gradient(24, 40, 0, 3, 5), gradient(24, 40, 0, 3, 5)
    run_ranks(spec, [x], "w", 3, comps=a)
    run_ranks(spec, [y], "w", 3, comps=b)
    assert np.array_equal(x, y)
