"""DistributedOptimizer's checkpoint: the gradcomp part of its state_dict() (gradcomp.torch keeps the optimizer, this
file what its state_dict()/load_state_dict() add to the wrapped optimizer's), in the envelope of gradcomp._state."""
import warnings

from . import _state
from ._gradcomp import InvalidArgument


def save(opt, ctx):
    """The "gradcomp" entry of `opt`'s state_dict(): this rank's compressor state and step in a checksummed envelope
    (kind "optimizer", spec, rank, world size). The optimizer owns its compressor on every backend (on the runtime
    backend too: the runtime runs the optimizer's instance in the optimizer's scope), so this is all of its state and
    nothing of any other optimizer's. `ctx`: gradcomp.torch's process context (rank, size, runtime)."""
    if opt._handles:
        raise InvalidArgument("DistributedOptimizer.state_dict(): gradients are still being reduced; call "
                              "step() or synchronize() first")
    return _state.seal("optimizer", opt._compressor.spec, opt._compressor._state_bytes(), ctx.rank, ctx.size,
                       opt._step_count_gc)


def load(opt, gc, ctx, load_wrapped):
    """Loads the "gradcomp" entry `gc` into `opt`, and the wrapped optimizer's state with `load_wrapped()`. The entry
    is checked before anything changes (flipped or truncated bytes: CorruptPayload; another rank's, world size's or
    codec's: InvalidArgument); if anything fails later, the compressor and the runtime are restored, so a failed
    load changes nothing."""
    data, step = _state.open_state(gc, "optimizer", opt._compressor.spec, ctx.rank, ctx.size,
                                   where="DistributedOptimizer.load_state_dict")
    rt = _runtime_state(opt, gc.get("runtime") if isinstance(gc, dict) else None, ctx)
    saved = opt._compressor._state_bytes()
    saved_rt = ctx.runtime.save_state() if rt is not None else None
    try:
        opt._compressor._load_state_bytes(data)
        if rt is not None:
            ctx.runtime.load_state(rt)
        load_wrapped()
    except BaseException:
        opt._compressor._load_state_bytes(saved)
        if saved_rt is not None:
            ctx.runtime.load_state(saved_rt)
        raise
    opt._step_count_gc = int(step)


def _runtime_state(opt, rt, ctx):
    """The runtime's state bytes in a checkpoint's gradcomp entry (a version-2 envelope written by gradcomp before
    optimizers owned their compressor on the runtime backend), or None."""
    if rt is None:
        return None
    if ctx.runtime is None:
        warnings.warn("DistributedOptimizer.load_state_dict(): the checkpoint holds the fusion runtime's state but "
                      f"the backend '{ctx.impl.name}' has no runtime; the runtime's residuals are dropped")
        return None
    if (rt["rank"], rt["size"]) != (ctx.rank, ctx.size):
        raise InvalidArgument(f"DistributedOptimizer.load_state_dict() on rank {ctx.rank} of {ctx.size}: the runtime "
                              f"state was saved by rank {rt['rank']} of {rt['size']} (checkpoints are per rank: load "
                              "each rank's own file)")
    if opt._handles:
        raise InvalidArgument("DistributedOptimizer.load_state_dict(): gradients are still being reduced; call "
                              "step() or synchronize() first")
    return bytes(rt["state"])
