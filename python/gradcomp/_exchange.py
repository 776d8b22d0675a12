"""Compressed averaging of a group of tensors over a torch.distributed process group, with the collective that suits
the codec's traits (used by the DDP comm hook and by DistributedOptimizer's torch.distributed backend).

- summable (none, fp16, bf16): each rank compresses with prescale 1/world, the dense wire-dtype bodies of every
  tensor's payload are packed into one buffer and summed with one allreduce, then decoded in place;
- gatherable / requantizable (top-k, random-k, block top-k, DGC, QSGD, TernGrad, 1-bit): every tensor's payload is
  packed behind a table of sizes, the buffers are all-gathered (padded to the largest rank's size) and every rank
  decodes all of them in rank order (decompress-and-add, then divide by world): bit-identical results on all ranks;
- Python codecs (Horovod shape): the payload tensors are averaged with allreduce and decoded with the local ctx.
"""
import threading

import torch
import torch.distributed as dist

from ._compressors import PAYLOAD_HEADER_BYTES

_WIRE_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


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


class Exchanger:
    """Averages (or sums) named flat tensors in place across a process group through one compressor.

    The compressor's calls are serialized by a lock: compress runs in the caller's thread (autograd), decompress in
    the collective's completion callback.
    """

    def __init__(self, compressor, group=None, average=True):
        self.compressor = compressor
        self.group = group
        self.average = average
        self.lock = threading.Lock()
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0

    def run(self, items, step, result=None):
        """items: [(name, tensor)] of contiguous tensors, updated in place. Returns a torch Future whose value is
        `result` once every tensor holds the aggregate."""
        items = [(n, t) for n, t in items if t.numel() > 0]
        if not items:
            return _completed_future(result)
        c = self.compressor
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

    # -- summable: one allreduce of the packed wire-dtype bodies -----------------------------------------------------
    def _run_summable(self, items, step, result, wire_dtype, sum_dtype):
        c, world = self.compressor, self.world
        device = items[0][1].device
        esize = torch.tensor([], dtype=wire_dtype).element_size()
        total = sum(t.numel() for _, t in items)
        wire = torch.empty(total, dtype=sum_dtype, device=device)
        payloads = []
        off = 0
        with self.lock:
            for name, t in items:
                n = t.numel()
                p = c.compress(t, name=name, step=step, rank=self.rank, world_size=world,
                               prescale=(1.0 / world) if self.average else 1.0)
                body = p[PAYLOAD_HEADER_BYTES:PAYLOAD_HEADER_BYTES + n * esize]
                wire[off:off + n].copy_(body.view(wire_dtype))
                payloads.append((p, body, t, off, n))
                off += n
        if world == 1:
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
        c, world = self.compressor, self.world
        device = items[0][1].device
        k = len(items)
        caps = [_align(c.max_payload_bytes(t.numel())) for _, t in items]
        table_bytes = _align(8 * k)
        buf = torch.empty(table_bytes + sum(caps), dtype=torch.uint8, device=device)
        sizes = []
        off = table_bytes
        with self.lock:
            for (name, t), cap in zip(items, caps):
                p = c.compress(t, name=name, step=step, rank=self.rank, world_size=world, prescale=1.0,
                               out=buf[off:off + cap])
                sizes.append(p.numel())
                off += _align(p.numel())
        buf[:table_bytes].view(torch.int64).copy_(torch.tensor(sizes, dtype=torch.int64))
        total = off
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
    def _run_python(self, items, result):
        c, world = self.compressor, self.world
        compressed = []
        with self.lock:
            for name, t in items:
                payload, ctx = c.compress(t, name=name)
                if self.average and world > 1:
                    payload = payload / world if payload.is_floating_point() else payload
                compressed.append((payload.contiguous(), ctx, t))
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
