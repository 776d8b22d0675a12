"""Compressed averaging of a group of tensors over a torch.distributed process group, with the collective that suits
the codec's traits (used by the DDP comm hook and by DistributedOptimizer's torch.distributed backend).

- summable (none, fp16, bf16): each rank compresses with prescale 1/world and the dense wire-dtype bodies of every
  tensor's payload are packed into one buffer. f32 bodies, small buffers and NCCL groups: one allreduce. Half-precision
  bodies on gloo (>= SPLIT_SUM_MIN_BYTES): gloo sums float16 element by element in software (10x slower than float32
  on a 2-core machine, slower than the 1 Gbit/s link) and cannot sum bfloat16, so the sum is split instead: one
  all_to_all (each rank receives every rank's 1/world chunk), the chunk summed in float32 and rounded once to the wire
  dtype, one all_gather of the summed chunks; same bytes on the wire as a ring allreduce, and every rank ends with the
  same bits;
- gatherable / requantizable (top-k, random-k, block top-k, DGC, QSGD, TernGrad, 1-bit): every tensor's payload is
  packed behind a table of sizes, the buffers are all-gathered (padded to the largest rank's size) and every rank
  decodes all of them in rank order (decompress-and-add, then divide by world): bit-identical results on all ranks;
- Python codecs (Horovod shape): the payload tensors are averaged with allreduce and decoded with the local ctx.

On CPU tensors with more than one rank, compression, the collectives and decoding run in one worker thread per
process group (`_Worker`), in submission order: the caller (DDP's autograd thread) returns at once, multi-collective
exchanges need no blocking in the caller, every rank issues the collectives in the same order, and the worker reuses
its buffers between steps (no 100 MB allocation and page faults per step). CUDA tensors keep the direct path: the
collectives are issued by the caller and complete asynchronously on the device.
"""
import atexit
import os
import queue
import threading

import torch
import torch.distributed as dist

from ._compressors import PAYLOAD_HEADER_BYTES

_WIRE_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

# Half-precision buckets on gloo at least this large (wire bytes) use the split sum (all_to_all + all_gather);
# smaller ones one allreduce (they are latency-bound, and one collective is fewer round trips).
SPLIT_SUM_MIN_BYTES = int(os.environ.get("GRADCOMP_SPLIT_SUM_MIN_BYTES", 1 << 20))


def _align(nbytes, to=16):
    """Payloads are packed at 16-byte boundaries so their sections stay aligned for the decoders (CUDA included)."""
    return (nbytes + to - 1) // to * to


def _checked(fut):
    """Raises the collective's error (a failed allreduce must not decode stale data); True otherwise."""
    fut.value()
    return True


def _completed_future(value):
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut


class _Worker:
    """One daemon thread per process group that runs exchange jobs in submission order (so every rank issues the
    collectives in the same order) and completes a torch Future with each job's result or exception."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="gradcomp-exchange", daemon=True)
        self._thread.start()
        self.buffers = {}  # role -> grow-only tensor; used only by this thread, one job at a time

    def submit(self, job):
        fut = torch.futures.Future()
        self._queue.put((job, fut))
        return fut

    def stop(self, timeout_s=10.0):
        """Ends the thread after the jobs already queued (interpreter exit: a daemon thread still parked in
        `queue.get()` is never unwound, so whatever its frame references, e.g. the last job's compressor, would
        outlive the module and nanobind reports it as leaked)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)
        self.buffers.clear()

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, fut = item
            result = None
            try:
                result = job()
            except BaseException as e:  # noqa: BLE001 - the waiter re-raises it
                fut.set_exception(e)
            else:
                fut.set_result(result)
            # Drop the finished job before parking in get(): its closure holds the Exchanger and compressor.
            del item, job, fut, result

    def buffer(self, role, numel, dtype):
        """A reusable tensor of `numel` elements (a view of a cached one); valid until the next call with `role`."""
        key = (role, dtype)
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype)
            self.buffers[key] = buf
        return buf[:numel]


_workers = {}
_workers_lock = threading.Lock()


def _stop_workers():
    """atexit: stops every worker thread (registered on first use, so it runs before the atexit handlers that torch
    and gradcomp.torch registered earlier)."""
    with _workers_lock:
        workers = list(_workers.values())
        _workers.clear()
    for w in workers:
        w.stop()


def _worker_for(group):
    key = id(group) if group is not None else None
    with _workers_lock:
        w = _workers.get(key)
        if w is None:
            if not _workers:
                atexit.register(_stop_workers)
            w = _workers[key] = _Worker()
        return w


class Exchanger:
    """Averages (or sums) named flat tensors in place across a process group through one compressor.

    The compressor's calls are serialized by a lock: compress runs in the caller's thread (CUDA) or the worker (CPU),
    decompress in the worker or the collective's completion callback.
    """

    def __init__(self, compressor, group=None, average=True):
        self.compressor = compressor
        self.group = group
        self.average = average
        self.lock = threading.Lock()
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.split_sum_min_bytes = SPLIT_SUM_MIN_BYTES

    def run(self, items, step, result=None):
        """items: [(name, tensor)] of contiguous tensors, updated in place. Returns a torch Future whose value is
        `result` once every tensor holds the aggregate."""
        items = [(n, t) for n, t in items if t.numel() > 0]
        if not items:
            return _completed_future(result)
        c = self.compressor
        if self.world > 1 and not any(t.is_cuda for _, t in items):
            worker = _worker_for(self.group)
            return worker.submit(lambda: self._run_cpu(worker, items, step, result))
        if c.is_python:
            return self._run_python(items, result)
        traits = c.traits
        if traits["summable"]:
            wire_dtype = _WIRE_DTYPES[traits["wire_dtype"]]
            return self._run_summable(items, step, result, wire_dtype, self._sum_dtype(wire_dtype))
        return self._run_gather(items, step, result)

    def _sum_dtype(self, wire_dtype):
        """gloo cannot sum bfloat16 (torch 1.13: "Invalid scalar type"): bf16 bodies are summed in float32 there and
        rounded back to bf16 (nearest-even) before decoding."""
        if wire_dtype == torch.bfloat16 and dist.is_initialized() and dist.get_backend(self.group) == "gloo":
            return torch.float32
        return wire_dtype

    # -- CPU, more than one rank: everything in the process group's worker thread -----------------------------------
    def _run_cpu(self, worker, items, step, result):
        c = self.compressor
        if c.is_python:
            compressed = self._compress_python(items)
            for payload, _, _ in compressed:
                dist.all_reduce(payload, op=dist.ReduceOp.SUM, group=self.group)
            return self._finish_python(compressed, result)
        traits = c.traits
        if not traits["summable"]:
            recv = self._gather_sync(worker, items, step)
            return self._finish_gather(recv, items, result)
        wire_dtype = _WIRE_DTYPES[traits["wire_dtype"]]
        world = self.world
        total = sum(t.numel() for _, t in items)
        split = wire_dtype != torch.float32 and total * 2 >= self.split_sum_min_bytes
        m = (total + world - 1) // world
        padded = worker.buffer("wire", world * m if split else total, wire_dtype)
        wire, payloads = self._compress_summable(items, step, wire_dtype, worker, padded[:total])
        if split:
            padded[total:].zero_()
            self._split_sum(worker, padded, m)
        else:
            sum_dtype = self._sum_dtype(wire_dtype)
            if sum_dtype != wire_dtype:
                wire_sum = worker.buffer("sum", total, sum_dtype)
                wire_sum.copy_(wire)
                dist.all_reduce(wire_sum, op=dist.ReduceOp.SUM, group=self.group)
                wire.copy_(wire_sum)
            else:
                dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group)
        return self._finish_summable(payloads, wire, wire_dtype, result)

    def _split_sum(self, worker, padded, m):
        """padded (world * m half-precision values, zero tail) becomes the elementwise sum over ranks: all_to_all of
        the m-element chunks (rank r receives every rank's chunk r), float32 sum in rank order, one rounding to the
        wire dtype (nearest even), all_gather of the summed chunks back into `padded`."""
        world = self.world
        chunks = worker.buffer("chunks", world * m, padded.dtype)
        # The collectives only move bits: uint8 views (gloo in torch 1.13 has neither bfloat16 nor int16).
        dist.all_to_all_single(chunks.view(torch.uint8), padded.view(torch.uint8), group=self.group)
        acc = worker.buffer("acc", m, torch.float32)
        acc.copy_(chunks[:m])
        for r in range(1, world):
            acc.add_(chunks[r * m:(r + 1) * m])
        mine = worker.buffer("mine", m, padded.dtype)
        mine.copy_(acc)
        dist.all_gather(list(padded.view(torch.uint8).view(world, 2 * m).unbind(0)), mine.view(torch.uint8),
                        group=self.group)

    def _pack_payloads(self, items, step, allocate):
        """Compresses every (name, tensor) of `items` into one uint8 buffer from `allocate(nbytes)`: a table of the k
        payload sizes (int64), then the payloads, each 16-byte aligned. Returns (buffer, bytes used)."""
        c = self.compressor
        caps = [_align(c.max_payload_bytes(t.numel())) for _, t in items]
        table_bytes = _align(8 * len(items))
        buf = allocate(table_bytes + sum(caps))
        sizes = []
        off = table_bytes
        with self.lock:
            for (name, t), cap in zip(items, caps):
                p = c.compress(t, name=name, step=step, rank=self.rank, world_size=self.world, prescale=1.0,
                               out=buf[off:off + cap])
                sizes.append(p.numel())
                off += _align(p.numel())
        buf[:table_bytes].view(torch.int64).copy_(torch.tensor(sizes, dtype=torch.int64))
        return buf, off

    def _gather_sync(self, worker, items, step):
        world = self.world
        buf, total = self._pack_payloads(items, step, lambda nbytes: worker.buffer("send", nbytes, torch.uint8))
        lengths = torch.zeros(world, dtype=torch.int64)
        dist.all_gather(list(lengths.view(world, 1).unbind(0)), torch.tensor([total], dtype=torch.int64),
                        group=self.group)
        longest = int(lengths.max())
        if longest > buf.numel():  # another rank's payloads are larger than our bound (cannot happen for one spec)
            send = torch.zeros(longest, dtype=torch.uint8)
            send[:total].copy_(buf[:total])
        else:
            send = buf[:longest]
        recv = worker.buffer("recv", world * longest, torch.uint8).view(world, longest)
        dist.all_gather(list(recv.unbind(0)), send, group=self.group)
        return list(recv.unbind(0))

    # -- summable: one allreduce of the packed wire-dtype bodies -----------------------------------------------------
    def _compress_summable(self, items, step, wire_dtype, worker=None, wire=None):
        """Compresses every item (prescale 1/world when averaging) and packs the wire-dtype bodies into `wire`."""
        c, world = self.compressor, self.world
        esize = torch.tensor([], dtype=wire_dtype).element_size()
        total = sum(t.numel() for _, t in items)
        if wire is None:
            wire = torch.empty(total, dtype=wire_dtype, device=items[0][1].device)
        payloads = []
        off = 0
        with self.lock:
            for i, (name, t) in enumerate(items):
                n = t.numel()
                out = worker.buffer(f"payload{i}", c.max_payload_bytes(n), torch.uint8) if worker else None
                p = c.compress(t, name=name, step=step, rank=self.rank, world_size=world,
                               prescale=(1.0 / world) if self.average else 1.0, out=out)
                body = p[PAYLOAD_HEADER_BYTES:PAYLOAD_HEADER_BYTES + n * esize]
                wire[off:off + n].copy_(body.view(wire_dtype))
                payloads.append((p, body, t, off, n))
                off += n
        return wire, payloads

    def _run_summable(self, items, step, result, wire_dtype, sum_dtype):
        wire, payloads = self._compress_summable(items, step, wire_dtype)
        if sum_dtype != wire_dtype:
            wire = wire.to(sum_dtype)
        if self.world == 1:
            return _completed_future(self._finish_summable(payloads, wire, wire_dtype, result))
        work = dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        return work.get_future().then(
            lambda fut: _checked(fut) and self._finish_summable(payloads, wire, wire_dtype, result))

    def _finish_summable(self, payloads, wire, wire_dtype, result):
        with self.lock:
            for p, body, t, off, n in payloads:
                body.view(wire_dtype).copy_(wire[off:off + n])
                self.compressor.decompress(p, t)
        return result

    # -- gatherable / requantizable: all-gather of packed payloads, decode in rank order -----------------------------
    def _run_gather(self, items, step, result):
        world = self.world
        device = items[0][1].device
        buf, total = self._pack_payloads(
            items, step, lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=device))
        if world == 1:
            return _completed_future(self._finish_gather([buf[:total]], items, result))
        lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(lengths, torch.tensor([total], dtype=torch.int64, device=device), group=self.group)
        longest = int(max(int(x.item()) for x in lengths))
        recv = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
        if longest > buf.numel():  # another rank's payloads are larger than our bound (cannot happen for one spec)
            send = torch.zeros(longest, dtype=torch.uint8, device=device)
            send[:total].copy_(buf[:total])
        else:
            send = buf[:longest]
        work = dist.all_gather(recv, send, group=self.group, async_op=True)
        return work.get_future().then(lambda fut: _checked(fut) and self._finish_gather(recv, items, result))

    def _finish_gather(self, recv, items, result):
        k = len(items)
        with self.lock:
            for r, blob in enumerate(recv):
                sizes = blob[:8 * k].view(torch.int64).tolist()
                off = _align(8 * k)
                for (name, t), size in zip(items, sizes):
                    self.compressor.decompress(blob[off:off + size], t, accumulate=(r > 0))
                    off += _align(size)
        if self.average and len(recv) > 1:
            for _, t in items:
                t.div_(len(recv))
        return result

    # -- Python (Horovod-shaped) codecs: allreduce-average the compressed tensors ------------------------------------
    def _compress_python(self, items):
        c, world = self.compressor, self.world
        compressed = []
        with self.lock:
            for name, t in items:
                payload, ctx = c.compress(t, name=name)
                if self.average and world > 1:
                    payload = payload / world if payload.is_floating_point() else payload
                compressed.append((payload.contiguous(), ctx, t))
        return compressed

    def _run_python(self, items, result):
        world = self.world
        compressed = self._compress_python(items)
        if world == 1:
            return _completed_future(self._finish_python(compressed, result))
        futs = [dist.all_reduce(p, op=dist.ReduceOp.SUM, group=self.group, async_op=True).get_future()
                for p, _, _ in compressed]
        return torch.futures.collect_all(futs).then(
            lambda fut: all(_checked(f) for f in fut.value()) and self._finish_python(compressed, result))

    def _finish_python(self, compressed, result):
        with self.lock:
            for payload, ctx, t in compressed:
                t.copy_(self.compressor.decompress(payload, ctx).reshape(t.shape))
        return result
