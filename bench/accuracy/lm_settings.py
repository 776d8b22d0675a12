"""The benchmark's own settings inside an LM row's spec (`run.py --task lm --compressors ...`), kept apart from the
codec's parameters before the spec reaches gradcomp:

- `dense_steps=N`: gradient compression with the first N steps sent uncompressed (adapters.GradcompOptimizer);
- `exchange=momentum`: the row compresses AdamW's momentum instead of the gradient, through
  DistributedOptimizer(AdamW, exchange="momentum") = gradcomp.torch.CompressedAdam (docs/adam.md), with
  - `warmup=` exact steps before compressing: a count, a fraction of the run's steps (`0.15`), or `auto`;
  - `variance=refresh|frozen`, `kappa=` (refreshes per interval level), `max_interval=` (cap on the interval);
  - `exact=none|fp16|bf16|qsgdN`: the codec of the exact steps (warm-up and refreshes; `qsgd8` is
    `qsgd:bits=8`, error feedback off);
  - `compress=momentum|increment` (1-bit Adam's or 0/1 Adam's feed of the momentum);
  - `precondition=on|off`, `guard=` (relative threshold, `off` for none), `exact_below=` (tensors of fewer values
    always exact; default 0).

`onebit:exchange=momentum,warmup=0.15` thus runs 1-bit Adam with 15% warm-up; the codec sees `onebit`."""
from __future__ import annotations

MOMENTUM_KEYS = ("warmup", "variance", "kappa", "max_interval", "exact", "precondition", "guard", "exact_below",
                 "compress")
BENCH_KEYS = ("dense_steps", "exchange") + MOMENTUM_KEYS


def split(spec: str) -> tuple[str, dict]:
    """(codec spec, {bench key: value}) of an LM row's spec; keys not listed in BENCH_KEYS stay in the codec spec."""
    name, _, rest = spec.partition(":")
    kept, bench = [], {}
    for kv in filter(None, rest.split(",")):
        key, _, value = kv.partition("=")
        if key in BENCH_KEYS:
            bench[key] = value
        else:
            kept.append(kv)
    exchange = bench.get("exchange", "gradient")
    if exchange not in ("gradient", "momentum"):
        raise ValueError(f"'{spec}': exchange must be gradient or momentum, not '{exchange}'")
    momentum_only = [k for k in MOMENTUM_KEYS if k in bench]
    if exchange == "gradient" and momentum_only:
        raise ValueError(f"'{spec}': {', '.join(momentum_only)} apply to exchange=momentum only")
    if exchange == "momentum" and "dense_steps" in bench:
        raise ValueError(f"'{spec}': dense_steps is the gradient rows' warm-up; exchange=momentum uses warmup=")
    return name + (":" + ",".join(kept) if kept else ""), bench


def dense_steps(bench: dict) -> int:
    return int(bench.get("dense_steps", 0))


def momentum_options(bench: dict, total_steps: int) -> dict | None:
    """CompressedAdam's keywords for an exchange=momentum row (None for a gradient row). Defaults: warm-up 15% of
    the steps, variance refresh, exact steps uncompressed."""
    if bench.get("exchange") != "momentum":
        return None
    import gradcomp.torch as gct
    warmup = bench.get("warmup", "0.15")
    if warmup == "auto":
        warm = "auto"
    elif "." in warmup:
        warm = max(1, round(float(warmup) * total_steps))
    else:
        warm = int(warmup)
    variance = bench.get("variance", "refresh")
    if "kappa" in bench or "max_interval" in bench:
        cap = bench.get("max_interval")
        variance = gct.VarianceSchedule(variance, kappa=int(bench.get("kappa", 16)),
                                        max_interval=None if cap is None else int(cap))
    guard = bench.get("guard", "1e-2")
    options = {"warmup": warm, "variance": variance, "exact_compression": _exact_spec(bench.get("exact", "none")),
               "precondition": bench.get("precondition", "off") == "on",
               "guard": None if guard == "off" else float(guard)}
    if "exact_below" in bench:
        options["exact_below"] = int(bench["exact_below"])
    if "compress" in bench:
        options["compress"] = bench["compress"]
    return options


def _exact_spec(value: str) -> str:
    """`qsgd8` -> `qsgd:bits=8` (a spec's parameters cannot nest); other names pass through."""
    if value.startswith("qsgd") and value[4:].isdigit():
        return f"qsgd:bits={value[4:]}"
    return value
