"""Resuming from the commits on disk after torchrun restarted the workers (a rank left or joined, or the whole job
was restarted), and what becomes of each rank's compressor state.

On the first entry of @run every rank takes part in `resume()`:
1. rank 0 picks the newest commit that every rank finished writing (else the newest with files missing: ranks
   killed while committing); a damaged file raises CorruptPayload, which is reported, and the previous commit is
   used. It loads that commit's model, optimizer, schedulers, samplers and values (sync() then gives them to every
   rank);
2. the new ranks are matched to the commit's old ranks by identity (host and torchrun agent: a survivor keeps its
   own residual); when no identity matches (a job restarted whole) and the size is unchanged, by rank;
3. each matched rank loads its old rank's compressor state (residuals, momenta) after checking that it fits
   (another codec spec, or a residual whose tensor the model lacks or has another size: InvalidArgument naming the
   parameter); an unmatched (joining) rank starts from a zero residual. The owner residuals of scatter-reduce-
   allgather ("<parameter>#sra<i>", kept by rank i for piece i of a world's partition) are kept only by the same rank
   of a world of the same size: on any other rank or world they belong to no piece and are dropped;
4. rank 0 reports every old rank's residual that no new rank took (its bytes and norm, as a fraction of the gradient
   norm at the commit), and every owner residual dropped: that part of the compression error is lost.
Errors on one rank are raised on every rank (no rank is left waiting in a collective)."""
import math
import re
import sys
import warnings

from ... import _state
from ..._codec_state import read_records, without_records
from ..._compressors import InvalidArgument
from ..._gradcomp import CorruptPayload, Error
from ..context import _ctx
from ..objects import allgather_object, broadcast_object
from .commits import identity


def _log(msg):
    print(f"gradcomp.elastic: {msg}", file=sys.stderr, flush=True)


def choose_commit(store, skipped):
    """On rank 0: (seq, {old rank: payload}, world size, newest seq on disk) of the newest complete commit (a file
    from every rank of its world, all intact), else of the newest intact one with files missing (ranks killed before
    they wrote it), or (None, {}, None, newest) when there is none. A commit with a damaged file is skipped (its
    CorruptPayload message appended to `skipped`)."""
    seqs = store.seqs()
    newest = seqs[0] if seqs else -1
    partial = None
    for seq in seqs:
        files = store.files(seq)
        if not files:
            continue
        payloads, world, bad = {}, None, None
        for old_rank, path in sorted(files.items()):
            try:
                _, world, _, payloads[old_rank] = store.read(path)
            except CorruptPayload as e:
                bad = e
                break
        if bad is not None:
            skipped.append(f"CorruptPayload: {bad}")
            warnings.warn(f"gradcomp.elastic: {bad}; using the commit before {seq}")
            _log(f"CorruptPayload: {bad}; using the commit before {seq}")
            continue
        if len(payloads) == world:
            return seq, payloads, world, newest
        if partial is None:
            partial = (seq, payloads, world, newest)
    return partial if partial is not None else (None, {}, None, newest)


def assign(old_identities, new_identities, old_world):
    """[old rank or None for each new rank]: by identity; when none matches and the size is unchanged, by rank."""
    by_identity = {}
    for old_rank, ident in sorted(old_identities.items()):
        by_identity.setdefault(ident, []).append(old_rank)
    result = [by_identity[i].pop(0) if by_identity.get(i) else None for i in new_identities]
    if all(r is None for r in result) and len(new_identities) == old_world:
        result = [r if r in old_identities else None for r in range(old_world)]
    return result


_OWNER_RECORD = re.compile(r"^(.*)#sra(\d+)$")


def _owner_piece(record_name):
    """(parameter, piece) of a scatter-reduce-allgather owner residual's record name, else None."""
    m = _OWNER_RECORD.match(record_name)
    return (m.group(1), int(m.group(2))) if m else None


def _owner_record_kept(record_name, committed, rank, size):
    """Whether rank `rank` of `size` keeps a committed record: a parameter's residual always; an owner residual only
    when it is this rank's own piece of a partition of the same world size."""
    piece = _owner_piece(record_name)
    return piece is None or (committed["world_size"] == size and piece[1] == rank)


def _check_codec(name, handler, envelope):
    """InvalidArgument naming the parameter when the committed compressor state cannot go into `handler`'s owner
    (a DistributedOptimizer, CompressedAdam or HookState)."""
    committed = _state.fields(envelope, f"committed compressor state of '{name}'")
    records = read_records(committed["state"], f"committed compressor state of '{name}'")
    spec = handler.codec_compressor().spec
    if committed["spec"] != spec:
        first = records[0].name if records else "(none)"
        raise InvalidArgument(f"elastic restore of '{name}': the residual of parameter '{first}' was committed by "
                              f"compressor '{committed['spec']}', this {handler.codec_kind} compresses with "
                              f"'{spec}'")
    numels = handler.codec_params()
    for rec in records if numels is not None else ():
        piece = _owner_piece(rec.name)
        if piece is not None:
            if piece[0] not in numels:
                raise InvalidArgument(f"elastic restore of '{name}': the commit holds an owner residual of parameter "
                                      f"'{piece[0]}', which this model does not have")
            continue  # a piece of the old world's partition: kept or dropped by load_codecs
        if rec.name not in numels:
            raise InvalidArgument(f"elastic restore of '{name}': the commit holds a residual of parameter "
                                  f"'{rec.name}', which this model does not have")
        if rec.numel != numels[rec.name]:
            raise InvalidArgument(f"elastic restore of '{name}': parameter '{rec.name}' has {numels[rec.name]} "
                                  f"values, its committed residual {rec.numel}")
    return records


def _codec_handler(state, name):
    handler = state._handlers.get(name)
    if handler is None or getattr(handler, "codec_compressor", lambda: None)() is None:
        raise InvalidArgument(f"elastic restore: the commit has the compressor state of '{name}', which this "
                              "TorchState does not have as a DistributedOptimizer or HookState")
    return handler


def load_codecs(state, payload):
    """Loads the committed compressor state of every DistributedOptimizer and HookState of `state` from `payload`
    (one old rank's commit) into this rank, after checking all of them."""
    loads = []
    for name, envelope in payload["codecs"].items():
        handler = _codec_handler(state, name)
        _check_codec(name, handler, envelope)
        data, _ = _state.open_state(envelope, handler.codec_kind, handler.codec_compressor().spec,
                                    where=f"elastic restore of '{name}'")
        committed = _state.fields(envelope, f"committed compressor state of '{name}'")
        data = without_records(data, lambda n: not _owner_record_kept(n, committed, _ctx.rank, _ctx.size),
                               f"committed compressor state of '{name}'")
        loads.append((handler.codec_compressor(), data))
    for comp, data in loads:
        comp._load_state_bytes(data)


def _load_rank0(state, payload):
    for name, saved in payload["handlers"].items():
        if name not in state._handlers:
            raise InvalidArgument(f"elastic restore: the commit has '{name}', which this TorchState does not track")
        state._handlers[name].load_committed(saved, name)
    missing = [n for n in state._handlers if n not in payload["handlers"]]
    if missing:
        raise InvalidArgument(f"elastic restore: '{missing[0]}' of this TorchState is not in the commit")
    for name, envelope in payload["codecs"].items():
        step = _state.fields(envelope, f"committed compressor state of '{name}'")["step"]
        if step is not None:
            _codec_handler(state, name).set_codec_step(step)  # sync() gives it to every rank
    state._saved_state = dict(payload["objects"])
    state._set_attrs()


def dropped_report(seq, payloads, old_world, assignment, new_size):
    """Lines saying what each old rank's compressor state became: taken by a new rank, dropped (bytes, norm as a
    fraction of the gradient norm) or lost with a file that was never written."""
    taken = {old: new for new, old in enumerate(assignment) if old is not None}
    lines = [f"resumed commit {seq} of {old_world} rank(s) on {new_size} rank(s)"]
    for old in range(old_world):
        if old in taken:
            lines.append(f"  old rank {old}: residual kept by rank {taken[old]}")
            lines += _dropped_owner_lines(old, payloads.get(old), taken[old], new_size)
            continue
        if old not in payloads:
            lines.append(f"  old rank {old}: wrote no file for commit {seq} (killed before it); its residual is lost")
            continue
        for name, envelope in payloads[old]["codecs"].items():
            records = read_records(_state.fields(envelope, f"committed compressor state of '{name}'")["state"])
            nbytes = sum(r.residual_bytes for r in records)
            norm = math.sqrt(sum(r.residual_norm ** 2 for r in records))
            gnorm = payloads[old]["stats"].get(name, {}).get("grad_norm", 0.0)
            frac = f"{100.0 * norm / gnorm:.2f}% of" if gnorm > 0 else "(no gradient norm)"
            lines.append(f"  old rank {old} ({payloads[old]['identity']}): residual of '{name}' dropped: {nbytes} "
                         f"bytes, norm {norm:.6g} = {frac} the gradient norm {gnorm:.6g}")
    for new, old in enumerate(assignment):
        if old is None:
            lines.append(f"  rank {new}: starts from a zero residual (joined)")
    return lines


def _dropped_owner_lines(old, payload, new_rank, new_size):
    """Lines for the owner residuals of old rank `old` that its new rank `new_rank` of `new_size` does not keep."""
    lines = []
    for name, envelope in (payload or {}).get("codecs", {}).items():
        committed = _state.fields(envelope, f"committed compressor state of '{name}'")
        owned = [r for r in read_records(committed["state"]) if _owner_piece(r.name) is not None
                 and not _owner_record_kept(r.name, committed, new_rank, new_size)]
        if owned:
            nbytes = sum(r.residual_bytes for r in owned)
            norm = math.sqrt(sum(r.residual_norm ** 2 for r in owned))
            lines.append(f"  old rank {old}: owner residual of '{name}' dropped (scatter-reduce-allgather pieces of "
                         f"{committed['world_size']} rank(s), now rank {new_rank} of {new_size}): {len(owned)} "
                         f"piece(s), {nbytes} bytes, norm {norm:.6g}")
    return lines


def resume(state, disk):
    """Collective on the first entry of @run: restores `state` from the newest intact commit of `disk` (a
    DiskCommits) and sets its next commit number. Returns the resumed commit's number, or None (nothing on disk);
    disk.resumed says the same on every rank: {"seq", "world_size", "skipped": [damaged commits' messages]}."""
    choice = None
    if _ctx.rank == 0:
        skipped = []
        seq, payloads, old_world, newest = choose_commit(disk.store, skipped)
        choice = {"seq": seq, "world": old_world, "newest": newest, "skipped": skipped,
                  "identities": {r: p["identity"] for r, p in payloads.items()}}
    choice = broadcast_object(choice, 0, name="elastic.resume")
    disk.seq = choice["newest"] + 1
    disk.resumed = {"seq": choice["seq"], "world_size": choice["world"], "skipped": choice["skipped"]}
    if choice["seq"] is None:
        return None
    assignment = assign(choice["identities"], allgather_object(identity(), name="elastic.identity"),
                        choice["world"])
    error = None
    try:
        if _ctx.rank == 0:
            source = assignment[0] if assignment[0] is not None else min(payloads)
            _load_rank0(state, payloads[source])
        mine = assignment[_ctx.rank]
        if mine is not None:
            payload = payloads[mine] if _ctx.rank == 0 else disk.store.read(disk.store.path(choice["seq"], mine))[3]
            load_codecs(state, payload)
    except Exception as e:  # noqa: BLE001 - raised on every rank below, so that none waits in a collective
        error = (type(e).__name__ if isinstance(e, Error) else "InvalidArgument",
                 f"rank {_ctx.rank}: {e}" if isinstance(e, Error) else f"rank {_ctx.rank}: {type(e).__name__}: {e}")
    errors = [e for e in allgather_object(error, name="elastic.resume_errors") if e is not None]
    if errors:
        kind, msg = errors[0]
        raise (CorruptPayload if kind == "CorruptPayload" else InvalidArgument)(msg)
    if _ctx.rank == 0:
        for line in dropped_report(choice["seq"], payloads, choice["world"], assignment, _ctx.size):
            _log(line)
    return choice["seq"]
