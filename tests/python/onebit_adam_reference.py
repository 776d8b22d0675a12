"""A NumPy reference of 1-bit Adam (Tang et al. 2021) as gradcomp's CompressedAdam runs it with "onebit" on
scatter-reduce-allgather, written from the algorithm, not from gradcomp's code:

- warm-up: exact AdamW steps on the average of the ranks' gradients;
- then v is frozen; each rank r forms m_r = beta1 * m + (1 - beta1) * g_r from the shared m; every tensor is cut into
  `world` pieces (piece i = elements [i*n//W, (i+1)*n//W)); each rank compresses piece i of m_r plus its worker
  error: per bucket of `bucket` values from the piece's start, scale = mean |x|, each value sent as +-scale by its
  sign bit, the worker error keeps x - sent; rank i (the owner of piece i) averages the ranks' pieces, adds its
  server error, compresses the same way and keeps the server error; every rank decodes the owner's piece: that is
  the new m, the same on every rank;
- the tiny-variance guard: coordinates with sqrt(v_hat) <= eps or below `guard` times their tensor's mean
  sqrt(v_hat) get m = 0;
- the tensors named in `exact` take exact AdamW steps throughout (CompressedAdam's exact_below);
- mode "increment" (0/1 Adam's feed): each rank compresses (1 - beta1) * g_r alone, and the new m is
  beta1 * m + the decoded average;
- the AdamW update p = p * (1 - lr * wd) - lr / (1 - beta1^t) * m / (sqrt(v_hat) + eps), v_hat with the bias
  correction of v's last update.
Everything is float32."""
import numpy as np

F32 = np.float32


def onebit(x, bucket):
    """(decoded, error) of sign compression of x with one scale (mean |x|) per bucket of `bucket` values."""
    out = np.empty_like(x)
    for b in range(0, x.size, bucket):
        part = x[b:b + bucket]
        scale = F32(np.abs(part).sum(dtype=F32) / F32(part.size))
        out[b:b + bucket] = np.where(np.signbit(part), -scale, scale)
    return out, x - out


class OneBitAdam:
    """The reference over named float32 parameters {name: flat array}."""

    def __init__(self, params, world, lr, betas, eps, weight_decay, warmup, bucket=512, guard=1e-2, exact=(),
                 mode="momentum"):
        self.p = {n: v.astype(F32).copy() for n, v in params.items()}
        self.m = {n: np.zeros_like(v) for n, v in self.p.items()}
        self.v = {n: np.zeros_like(v) for n, v in self.p.items()}
        self.worker = [{n: np.zeros_like(v) for n, v in self.p.items()} for _ in range(world)]
        self.server = {n: np.zeros_like(v) for n, v in self.p.items()}  # piece i held by rank i
        self.world, self.lr, self.eps, self.wd = world, F32(lr), F32(eps), F32(weight_decay)
        self.b1, self.b2 = F32(betas[0]), F32(betas[1])
        self.warmup, self.bucket, self.guard, self.exact = warmup, bucket, guard, set(exact)
        self.mode = mode
        self.t = 0
        self.mask = {}

    def step(self, grads):
        """grads: one {name: flat array} per rank."""
        self.t += 1
        exact = self.p if self.t <= self.warmup else self.exact
        self._exact(grads, exact)
        if self.t > self.warmup:
            self._compressed(grads, [n for n in self.p if n not in self.exact])
        if self.t == self.warmup:
            self._guard([n for n in self.p if n not in self.exact])

    def _denom(self, n):
        bc2 = 1.0 - float(self.b2) ** (self.t if n in self.exact else min(self.t, self.warmup))
        return (np.sqrt(self.v[n]) / F32(np.sqrt(bc2))).astype(F32) + self.eps

    def _apply(self, n, m):
        bc1 = 1.0 - float(self.b1) ** self.t
        self.p[n] = self.p[n] * (F32(1) - self.lr * self.wd)
        self.p[n] = self.p[n] - F32(self.lr / bc1) * (m / self._denom(n))

    def _exact(self, grads, names):
        for n in names:
            g = grads[0][n].astype(F32)
            for r in range(1, self.world):
                g = g + grads[r][n]
            g = g / F32(self.world)
            self.m[n] = self.b1 * self.m[n] + (F32(1) - self.b1) * g
            self.v[n] = self.b2 * self.v[n] + (F32(1) - self.b2) * g * g
            self._apply(n, self.m[n])

    def _guard(self, names):
        for n in names:
            root = self._denom(n) - self.eps
            keep = root > self.eps
            if self.guard:
                keep &= root >= F32(self.guard) * root.mean()
            self.mask[n] = keep
            self.m[n] = self.m[n] * keep

    def _compressed(self, grads, names):
        for n in names:
            shared = self.b1 * self.m[n] if self.mode == "momentum" else F32(0)
            local = [(shared + (F32(1) - self.b1) * grads[r][n]) * self.mask[n] for r in range(self.world)]
            size = self.p[n].size
            new_m = np.empty_like(self.m[n])
            for i in range(self.world):
                a, b = i * size // self.world, (i + 1) * size // self.world
                total = np.zeros(b - a, F32)
                for r in range(self.world):
                    sent, self.worker[r][n][a:b] = onebit(local[r][a:b] + self.worker[r][n][a:b], self.bucket)
                    total = total + sent
                sent, self.server[n][a:b] = onebit(total / F32(self.world) + self.server[n][a:b], self.bucket)
                new_m[a:b] = sent
            self.m[n] = (new_m if self.mode == "momentum" else self.b1 * self.m[n] + new_m) * self.mask[n]
            self._apply(n, self.m[n])
