"""CompressedAdam's checkpoint: what its state_dict() adds to torch's (m, v, LAMB's trust ratio and the guard mask per
parameter are torch's "state"):

- "gradcomp": this rank's codec state (worker and server errors, DGC/PowerSGD buffers, step counters) in the
  envelope of gradcomp._state, kind "optimizer" as DistributedOptimizer's (so gradcomp.torch.elastic moves it by the
  same rules): checksummed, and refused on another rank, world size or codec;
- "gradcomp_adam": the optimizer's progress, identical on every rank: steps, v's updates, compressed steps, the step
  the warm-up ended, the variance schedule, the automatic warm-up's history and v snapshot, the byte counters.

A load checks everything first and changes nothing when it fails."""
from .. import _state
from .._compressors import InvalidArgument

KIND = "optimizer"
FORMAT = 1


def save(opt, torch_state, ctx):
    """torch's state_dict() of `opt` plus the two gradcomp entries."""
    if opt._handles:
        raise InvalidArgument("CompressedAdam.state_dict(): exchanges are still in flight; call step() first")
    sd = dict(torch_state)
    sd["gradcomp"] = _state.seal(KIND, opt._compressor.spec, opt._compressor._state_bytes(), ctx.rank, ctx.size,
                                 opt._step_count_gc)
    sd["gradcomp_adam"] = {
        "format": FORMAT, "rule": opt.rule, "exact_spec": opt._exact.spec, "steps": opt._step_count_gc,
        "v_updates": opt._v_updates, "compressed_steps": opt._compressed_steps, "switched_at": opt.switched_at,
        "schedule": opt._schedule.state(),
        "auto_history": list(opt._auto().history),
        "snapshot": [t.clone() for t in opt._snapshot],
        "bytes": {k: list(v) for k, v in opt._bytes.items()},
    }
    return sd


def load(opt, state_dict, ctx, load_torch):
    """Loads this rank's own state_dict() of a CompressedAdam with the same rule and codecs; `load_torch(sd)` is
    torch's Optimizer.load_state_dict. Without the "gradcomp" entry (broadcast_optimizer_state and the elastic
    commits leave it out: it is per rank) the codec state is left as it is."""
    where = "CompressedAdam.load_state_dict"
    sd = dict(state_dict)
    envelope, adam = sd.pop("gradcomp", None), sd.pop("gradcomp_adam", None)
    if not isinstance(adam, dict):
        raise InvalidArgument(f"{where}: not a CompressedAdam state_dict (no 'gradcomp_adam' entry)")
    data, step = None, adam.get("steps")
    if envelope is not None:
        data, step = _state.open_state(envelope, KIND, opt._compressor.spec, ctx.rank, ctx.size, where=where)
    if adam.get("format") != FORMAT:
        raise InvalidArgument(f"{where}: gradcomp_adam format {adam.get('format')!r}, this gradcomp reads {FORMAT}")
    for key, mine in (("rule", opt.rule), ("exact_spec", opt._exact.spec)):
        if adam[key] != mine:
            raise InvalidArgument(f"{where}: the state was saved with {key} '{adam[key]}', this optimizer has "
                                  f"'{mine}'")
    if int(step) != int(adam["steps"]):
        raise InvalidArgument(f"{where}: the codec state is of step {step} but the optimizer's of {adam['steps']}")
    if opt._handles:
        raise InvalidArgument(f"{where}: exchanges are still in flight; call step() first")
    saved = opt._compressor._state_bytes()
    try:
        if data is not None:
            opt._compressor._load_state_bytes(data)
        groups = opt.param_groups
        load_torch(sd)
        for mine, loaded in zip(groups, opt.param_groups):  # keep the group dicts (a scheduler may hold them)
            mine.update({k: v for k, v in loaded.items() if k != "params"})
        opt.param_groups = groups
    except BaseException:
        opt._compressor._load_state_bytes(saved)
        raise
    opt._step_count_gc, opt._v_updates = int(adam["steps"]), int(adam["v_updates"])
    opt._compressed_steps, opt.switched_at = int(adam["compressed_steps"]), adam["switched_at"]
    opt._schedule.load(adam["schedule"])
    opt._auto().history = [tuple(h) for h in adam["auto_history"]]
    opt._snapshot = [t.clone() for t in adam["snapshot"]]
    opt._bytes = {k: list(v) for k, v in adam["bytes"].items()}
    opt._denoms, opt._keep = {}, {}
    if opt.switched_at is not None:
        opt._prepare_compressed()
