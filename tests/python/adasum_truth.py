"""Adasum written from its definition alone, for tests (no gradcomp code): Maleki et al., "Scaling Distributed
Training with Adaptive Summation" (MLSys 2021), eq. (5) and the recursive tree of section 4:

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
    adasum(g_0 .. g_{n-1}) = adasum(adasum(g_0 .. g_{n/2-1}), adasum(g_{n/2} .. g_{n-1}))     (n a power of two)

in float64 with math.fsum dot products. A coefficient is 1 where its vector's squared norm is below 1e-8 (Horovod's
guard against 0/0; the paper leaves a zero vector undefined). Also: the data every Adasum test uses (random,
non-orthogonal, unequal norms) and a check that the data tells the formula from its norm-swapped twin."""
import math

import torch

NORM_EPS = 1e-8


def _flat(t):
    return [float(v) for v in t.detach().double().reshape(-1).tolist()]


def _dot(x, y):
    return math.fsum(a * b for a, b in zip(x, y))


def pair(a, b, swap_norms=False):
    """adasum(a, b) as a list of floats; swap_norms: the wrong formula (each coefficient over the other's norm)."""
    x, y = (a, b) if isinstance(a, list) else (_flat(a), _flat(b))
    dot, xx, yy = _dot(x, y), _dot(x, x), _dot(y, y)
    if swap_norms:
        xx, yy = yy, xx
    cx = 1.0 - dot / (2.0 * xx) if xx >= NORM_EPS else 1.0
    cy = 1.0 - dot / (2.0 * yy) if yy >= NORM_EPS else 1.0
    return [cx * u + cy * v for u, v in zip(x, y)]


def adasum(tensors, swap_norms=False):
    """The Adasum of the ranks' tensors (a power-of-two count), as a float64 tensor of the first one's shape."""
    n = len(tensors)
    assert n >= 1 and n & (n - 1) == 0, f"adasum_truth: {n} tensors, the definition needs a power of two"

    def tree(vs):
        if len(vs) == 1:
            return vs[0]
        half = len(vs) // 2
        return pair(tree(vs[:half]), tree(vs[half:]), swap_norms)
    out = tree([_flat(t) for t in tensors])
    return torch.tensor(out, dtype=torch.float64).view(tensors[0].shape)


# Per-rank scales: unequal norms (ratios up to 24), so a formula with the norms swapped gives another result.
SCALES = (1.0, 6.0, 0.5, 2.0, 0.25, 5.0, 1.5, 0.7)


def inputs(world, numel, seed, dtype=torch.float32):
    """Rank r's tensor for `world` ranks: SCALES[r] * (0.6 * common + own noise), rounded to `dtype`; every rank
    rebuilds every rank's tensor from the seed. Non-orthogonal (the common part) with unequal norms."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(numel, generator=g, dtype=torch.float64)
    return [(SCALES[r % len(SCALES)] * (0.6 * common + torch.randn(numel, generator=g, dtype=torch.float64)))
            .to(dtype) for r in range(world)]


# Largest error relative to the result's largest magnitude that each dtype may show: float64 and float32 from the
# dot products' order; float16 and bfloat16 combine in float32 and round to the dtype after every level: at most
# log2(8) = 3 roundings of unit u (2^-11, 2^-8) relative to that level's values, allowed 4u (measured: at most 1.3u).
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def relative_error(got, want):
    want = want.double().reshape(-1)
    scale = float(want.abs().max()) + 1e-300
    return float((got.double().reshape(-1) - want).abs().max()) / scale


def check(got, tensors, dtype, what):
    """Asserts `got` is the Adasum of `tensors` within the dtype's tolerance, and that the same data would fail the
    norm-swapped formula by at least 10x that tolerance (the data discriminates)."""
    tol = TOLERANCE[dtype]
    want = adasum(tensors)
    err = relative_error(got, want)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"
    if len(tensors) > 1 and tensors[0].numel() > 1:
        swapped = relative_error(adasum(tensors, swap_norms=True), want)
        assert swapped > 10 * tol, f"{what}: the test data cannot tell swapped norms apart ({swapped:.3g})"
