"""torch.distributed under gradcomp's C++ collectives.

`ProcessGroupAdapter` is what the C++ `TorchCommunicator` (python/src/torch_communicator.cc) calls for each
`Communicator` operation: it receives zero-copy torch views of the C++ buffers and runs torch.distributed collectives
on one process group. `allreduce_async` is the one entry of the DDP hook and of DistributedOptimizer's torch backend:
it hands the tensor to the process group's C++ `ExchangeWorker`, which runs `gradcomp::compressed_allreduce` (dense,
sparse with the dense switch, scatter-reduce-allgather, allgather: picked from the codec's traits) off the caller's
thread, in submission order, and completes a torch Future.

What gloo needs and the C++ algorithms cannot know is kept here: gloo sums float16 element by element in software
(10x slower than float32 on a 2-core machine) and cannot sum bfloat16, so half-precision sums go through float32
(`_sum_half`): a split sum (all_to_all of 1/world chunks, float32 sum in rank order, one rounding, all_gather) for
buffers of at least GRADCOMP_SPLIT_SUM_MIN_BYTES (1 MiB), a float32 all_reduce for smaller ones; bit-identical on every
rank either way.
"""
import atexit
import contextlib
import datetime
import os
import threading

import torch
import torch.distributed as dist

from .. import _gradcomp as _C
from .lifetimes import keep_for_torch

SPLIT_SUM_MIN_BYTES = int(os.environ.get("GRADCOMP_SPLIT_SUM_MIN_BYTES", 1 << 20))

_OPS = {"sum": dist.ReduceOp.SUM, "average": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_HALF = (torch.float16, torch.bfloat16)


def _group_timeout_s(group):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        return pg.options._timeout.total_seconds()  # torch 1.x: the group carries its options
    except AttributeError:
        pass
    for device in ("cpu", "cuda"):  # torch 2.x: the options sit on the group's backend for a device
        try:
            return pg._get_backend(torch.device(device)).options._timeout.total_seconds()
        except (AttributeError, RuntimeError):
            continue
    return dist.default_pg_timeout.total_seconds()  # a backend without options: torch's default


class ProcessGroupAdapter:
    """One torch.distributed process group seen as a gradcomp Communicator. Every method takes the C++ caller's
    timeout (seconds) last; a collective that misses it raises gradcomp.Timeout, any other failure gradcomp.CommError
    (the C++ side adds backend and rank). Called by one thread at a time (the group's exchange worker).

    `device`: the CUDA device whose memory the group takes (NCCL), else None; the C++ TorchCommunicator then hands
    the calls of a CUDA bucket device tensors with the `stream` that produced them (the collective runs ordered on
    it), and nothing is copied. Host tensors on such a group are copied to the device and back, counted in
    `staged_bytes`.

    `sent_bytes` counts the bytes this rank sends, in the model of AllreduceStats' wire_bytes (ring schedules):
    2(n-1)/n of the buffer for an all_reduce, (n-1) blocks for an all_gather, the blocks addressed to other ranks for
    an all_to_all, (n-1)/n of the buffer for a broadcast (each byte leaves n-1 ranks' worth once, on average)."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        self.timeout_s = _group_timeout_s(group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None
        self.split_sum_min_bytes = SPLIT_SUM_MIN_BYTES
        self.staged_bytes = 0
        self.sent_bytes = 0
        self._buffers = {}

    # -- the Communicator operations ----------------------------------------------------------------------------------
    def allreduce(self, t, op, timeout_s, stream=0):
        divisor = self.size if op == "average" else 1
        if t.dtype in _HALF and op in ("sum", "average") and self.backend == "gloo":
            self._sum_half(t, divisor, timeout_s)
            return
        with _on_stream(t, stream), self._on_device(t) as d:
            self._count_allreduce(d)
            self._run("allreduce", timeout_s, lambda: dist.all_reduce(d, op=_OPS[op], group=self.group, async_op=True),
                      d)
            if divisor != 1:
                d.div_(divisor)

    def allgather(self, send, recv, timeout_s, stream=0):
        m = send.numel()
        if m == 0:
            return
        with _on_stream(recv, stream), self._on_device(recv) as r:
            s = self._to_device(send)
            outs = list(r.view(self.size, m).unbind(0))
            self.sent_bytes += (self.size - 1) * _nbytes(s)
            self._run("allgather", timeout_s, lambda: dist.all_gather(outs, s, group=self.group, async_op=True),
                      outs, s)

    def allgatherv(self, send, counts, recv, timeout_s, stream=0):
        longest = max(counts)
        if longest == 0:
            return
        with _on_stream(recv, stream):
            if min(counts) == longest:
                self.allgather(send, recv, timeout_s)
                return
            # torch has no allgatherv: blocks padded to the longest (in the memory of `recv`), then packed.
            padded = self._buffer("agv_send", longest, torch.uint8, recv.device)
            padded[:send.numel()].copy_(send)
            gathered = self._buffer("agv_recv", self.size * longest, torch.uint8, recv.device)
            self.allgather(padded, gathered, timeout_s)
            offset = 0
            for r, count in enumerate(counts):
                recv[offset:offset + count].copy_(gathered[r * longest:r * longest + count])
                offset += count

    def alltoallv(self, send, send_counts, recv, recv_counts, timeout_s, stream=0):
        with _on_stream(recv, stream), self._on_device(recv) as r:
            s = self._to_device(send)
            self.sent_bytes += sum(send_counts) - send_counts[self.rank]
            self._run("alltoallv", timeout_s, lambda: dist.all_to_all_single(
                r, s, output_split_sizes=list(recv_counts), input_split_sizes=list(send_counts), group=self.group,
                async_op=True), r, s)

    def broadcast(self, buffer, root, timeout_s, stream=0):
        with _on_stream(buffer, stream), self._on_device(buffer) as b:
            self.sent_bytes += (self.size - 1) * _nbytes(b) // self.size
            self._run("broadcast", timeout_s,
                      lambda: dist.broadcast(b, self._global_rank(root), group=self.group, async_op=True), b)

    def barrier(self, timeout_s):
        self._run("barrier", timeout_s, lambda: dist.barrier(group=self.group, async_op=True))

    def split(self, color, key, timeout_s):
        """MPI_Comm_split over torch groups. torch builds every group collectively over the whole job and orders its
        ranks by global rank, so this works on a group that spans every process, with keys that keep the order."""
        if self.size != dist.get_world_size():
            raise _C.CommError(f"split: this group has {self.size} of the job's {dist.get_world_size()} processes; "
                               "torch.distributed can only create groups from a group that spans the whole job")
        mine = torch.tensor([color, key, self.rank], dtype=torch.int64)
        every = torch.zeros(3 * self.size, dtype=torch.int64)
        self.allgather(mine, every, timeout_s)
        triples = [tuple(x) for x in every.view(self.size, 3).tolist()]
        child = None
        for c in sorted({t[0] for t in triples if t[0] >= 0}):
            ranks = [r for _, r in sorted((k, r) for cc, k, r in triples if cc == c)]
            if ranks != sorted(ranks):
                raise _C.CommError(f"split: color {c} orders ranks {ranks} by key; torch.distributed groups keep the "
                                   "ranks' order (use keys that do)")
            group = dist.new_group(ranks=[self._global_rank(r) for r in ranks],
                                   timeout=datetime.timedelta(seconds=timeout_s), backend=self.backend)
            if c == color:
                child = ProcessGroupAdapter(group)
        return child

    # -- half-precision sums on gloo ----------------------------------------------------------------------------------
    def _sum_half(self, t, divisor, timeout_s):
        """t (float16/bfloat16) becomes the elementwise sum over ranks / divisor, computed in float32 and rounded once
        (nearest even); identical bits on every rank. The collectives move uint8 views (gloo in torch 1.13 has
        neither bfloat16 nor int16)."""
        n, world = t.numel(), self.size
        if world == 1 or n == 0:
            if divisor != 1:
                t.copy_(t.float().div_(divisor))
            return
        if 2 * n < self.split_sum_min_bytes:
            acc = t.float()
            self._count_allreduce(acc)
            self._run("allreduce", timeout_s, lambda: dist.all_reduce(acc, group=self.group, async_op=True), acc)
            t.copy_(acc.div_(divisor) if divisor != 1 else acc)
            return
        m = (n + world - 1) // world
        if n == world * m:
            padded = t  # divides evenly: the chunks are t's own, no copy in or out
        else:
            padded = self._buffer("half_padded", world * m, t.dtype)
            padded[:n].copy_(t)
            padded[n:].zero_()
        chunks = self._buffer("half_chunks", world * m, t.dtype)
        chunk_bytes, padded_bytes = chunks.view(torch.uint8), padded.view(torch.uint8)
        self.sent_bytes += (world - 1) * m * t.element_size()
        self._run("allreduce (all_to_all)", timeout_s, lambda: dist.all_to_all_single(
            chunk_bytes, padded_bytes, group=self.group, async_op=True), chunk_bytes, padded_bytes)
        acc = self._buffer("half_acc", m, torch.float32)
        acc.copy_(chunks[:m])
        for r in range(1, world):
            acc.add_(chunks[r * m:(r + 1) * m])
        if divisor != 1:
            acc.div_(divisor)
        summed = self._buffer("half_sum", m, t.dtype)
        summed.copy_(acc)
        self.allgather(summed.view(torch.uint8), padded.view(torch.uint8), timeout_s)
        if padded is not t:
            t.copy_(padded[:n])

    # -- plumbing -----------------------------------------------------------------------------------------------------
    def _count_allreduce(self, t):
        self.sent_bytes += 2 * (self.size - 1) * _nbytes(t) // self.size

    def _run(self, what, timeout_s, issue, *tensors):
        """Issues a collective (async) on `tensors` and waits for it at most timeout_s, as gradcomp errors. The
        tensors and the work stay referenced past the call (lifetimes.keep_for_torch)."""
        try:
            work = issue()
            keep_for_torch(work, tensors)
            work.wait(datetime.timedelta(seconds=timeout_s))
        except RuntimeError as e:
            text = str(e)
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise _C.Timeout(f"{what} did not complete within {timeout_s:g} s (torch: {text})") from None
            raise _C.CommError(f"{what} failed (torch: {text})") from None

    def _global_rank(self, group_rank):
        if self.group is None:
            return group_rank
        return dist.distributed_c10d._get_global_rank(self.group, group_rank)

    def _buffer(self, role, numel, dtype, device=None):
        """A reusable tensor of numel elements (grow-only per role and device): no page faults per step for large
        buckets."""
        device = torch.device("cpu") if device is None else device
        buf = self._buffers.get((role, dtype, device))
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[(role, dtype, device)] = buf
        return buf[:numel]

    def _to_device(self, t):
        """NCCL takes device memory only: host buffers (small control messages) are staged (copied) to the group's
        device, counted in staged_bytes."""
        if self.device is None or t.device == self.device:
            return t
        self.staged_bytes += t.numel() * t.element_size()
        return t.to(self.device)

    @contextlib.contextmanager
    def _on_device(self, t):
        d = self._to_device(t)
        yield d
        if d is not t:
            self.staged_bytes += t.numel() * t.element_size()
            t.copy_(d)


def _nbytes(t):
    return t.numel() * t.element_size()


@contextlib.contextmanager
def _on_stream(t, stream):
    """Runs a device call's torch work on `stream` (a cudaStream_t as an integer: where the C++ caller produced the
    buffers and reads them next); host calls (stream 0 on a CPU tensor) as they are."""
    if not stream or not t.is_cuda:
        yield
        return
    with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=t.device)):
        yield


class _Exchange:
    """The C++ TorchCommunicator of one process group and the ExchangeWorker thread that runs its jobs."""

    def __init__(self, group, pg):
        self.group, self.pg = group, pg
        self.comm = _C.TorchCommunicator(ProcessGroupAdapter(group))
        self.worker = _C.ExchangeWorker(self.comm)


_exchanges = {}
_lock = threading.Lock()


def exchange_for(group=None):
    """The communicator and worker of `group` (None: the default group), created on first use; a new default group
    (after destroy_process_group and init again) gets new ones."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    key = id(group) if group is not None else None
    with _lock:
        ex = _exchanges.get(key)
        if ex is not None and ex.pg is not pg:
            ex.worker.close()
            ex = None
        if ex is None:
            if not _exchanges:
                atexit.register(close_all)
            ex = _exchanges[key] = _Exchange(group, pg)
        return ex


def close_all():
    """Finishes the queued exchanges and ends every worker thread (at exit, and from gradcomp.torch.shutdown()). A
    worker still alive at interpreter teardown would hold compressors and tensors that nanobind reports as leaked."""
    with _lock:
        exchanges = list(_exchanges.values())
        _exchanges.clear()
    for ex in exchanges:
        ex.worker.close()


def allreduce_async(compressor, tensor, name, step, op="average", segments=None, group=None, result=None,
                    stats=None, hierarchical=False):
    """Averages (op="average") or sums `tensor` (contiguous, 1-D, float32/16 or bfloat16) in place over `group` with
    `compressor` (a gradcomp Compressor or Python codec), off the caller's thread. `segments`: None or
    [(name, offset, numel)] or [(name, offset, numel, rows)], the named tensors `tensor` is made of (error feedback is
    kept per name; rows: the tensor's first dimension when it is a matrix, for shape-aware codecs such as powersgd).
    Returns a torch Future whose value is `result`; when `stats` is a dict it receives the AllreduceStats (algorithm,
    switched_to_dense, bytes, seconds) before the future completes. hierarchical: dense float32 sum inside each node
    (GRADCOMP_LOCAL_SIZE ranks per node), compressed allreduce between the node leaders; the group must span the
    whole job (the node groups are torch groups, built on the first such call).

    The ranks' agreement on the exchange (codec kind and spec, dtype, numel, op, hierarchical, the segments' names and
    sizes) is checked by the worker before the first exchange of each layout and cached per compressor (each hook
    state and optimizer has its own): a mismatch raises gradcomp.InvalidArgument on every rank, naming rank 0's
    layout and the differing rank's. Later exchanges of the layout run without the check."""
    ex = exchange_for(group)
    parts = segments if segments else [(name, 0, tensor.numel())]
    agreement = exchange_layout(compressor, tensor, name, op, parts, hierarchical)
    # The stream that produced the tensor (backward's, or the user's side stream), read here on the submitting thread:
    # the worker orders its work after it, on the tensor's device.
    producer = torch.cuda.current_stream(tensor.device) if tensor.is_cuda else None
    return ex.worker.submit(compressor._impl, tensor.detach(), name, op, step, "auto", segments, hierarchical, result,
                            stats, verify=False, agreement=agreement,
                            stream=producer.cuda_stream if producer is not None else 0)


def exchange_layout(compressor, tensor, name, op, parts, hierarchical):
    """(scope, description) of what this rank is about to exchange, for the worker's agreement check
    (python/src/agreement.h: gradcomp::check_agreement, the one every entry uses)."""
    kind = "python" if compressor.is_python else "c++"
    dtype = str(tensor.dtype).replace("torch.", "")
    segs = ", ".join(f"{s[0]}:{s[2]}" + (f"/{s[3]}rows" if len(s) > 3 and s[3] else "") for s in parts)
    description = (f"name='{name}' codec={kind} spec='{compressor.spec}' dtype={dtype} numel={tensor.numel()} "
                   f"op={op}{' hierarchical' if hierarchical else ''} segments=[{segs}]")
    return compressor.agreement_scope, description
