"""The exchange worker (python/src/exchange_worker.cc) runs a CUDA tensor's job on the tensor's device and on the
stream that produced it. Its worker thread never chose a device, so without that every CUDA call of the job ran on
GPU 0's legacy stream, unordered after the backward kernels of cuda:local_rank (stale averages on local ranks >= 1).
No GPU is needed: a DLPack capsule labelled cuda:1 stands in for the tensor, and the worker's `device_enter` seam
records what the worker thread would make current (in production it is a gradcomp DeviceScope). The job itself then
fails (no device here), and the failure reaches the future.

The hook's path keeps a bucket in memory its group takes: the TorchCommunicator takes the CUDA device of an NCCL group,
and nothing is staged between the bucket and the group (on the CPU over gloo; on a GPU over NCCL)."""
import ctypes
import threading

import pytest
import torch
import torch.distributed as dist

import gradcomp

_C = gradcomp._gradcomp


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_CAPSULE_NAME = b"dltensor"
_KEEP = []  # the memory behind the capsules outlives the test


def fake_cuda_tensor(device, numel):
    """A DLPack capsule of `numel` float32 labelled as memory of CUDA device `device` (the data is host memory: the
    worker must never touch it before making the device current)."""
    data = (ctypes.c_float * numel)()
    shape = (ctypes.c_int64 * 1)(numel)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(ctypes.cast(data, ctypes.c_void_p), _DLDevice(2, device), 1,  # kDLCUDA = 2
                                  _DLDataType(2, 32, 1), shape, None, 0)  # kDLFloat
    _KEEP.append((data, shape, managed))
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new_capsule(ctypes.addressof(managed), _CAPSULE_NAME, None)


def _thread_name():
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        return f.read().strip()


def test_a_cuda_job_runs_on_its_device_and_producer_stream():
    comm = _C.make_local_communicators(1)[0]
    entered = []
    worker = _C.ExchangeWorker(comm, device_enter=lambda device, stream: entered.append((device, stream,
                                                                                          _thread_name())))
    try:
        codec = _C.make_compressor("topk:ratio=0.5")
        future = worker.submit(codec, fake_cuda_tensor(1, 64), "grad", stream=0xBEEF)
        with pytest.raises(Exception) as failure:
            future.wait()
        # The job reached the allreduce, which cannot run without a GPU: its error, not a silent success.
        assert "cuda" in str(failure.value).lower()
        assert entered == [(1, 0xBEEF, "gradcomp-xchg")], entered
        # A CPU tensor's job makes no device current and completes.
        cpu = torch.arange(64, dtype=torch.float32)
        assert worker.submit(codec, cpu, "cpu", result="done").wait() == "done"
        assert len(entered) == 1
    finally:
        worker.close()


class _StubAdapter:
    """The attributes a TorchCommunicator reads from a ProcessGroupAdapter; `device` as NCCL's adapter sets it."""
    rank, size, backend, timeout_s = 0, 1, "nccl", 5.0

    def __init__(self, device):
        self.device = device


def test_the_torch_communicator_takes_its_groups_device_memory():
    """On NCCL (an adapter with a CUDA device) the TorchCommunicator takes that device's memory, so
    compressed_allreduce keeps a CUDA bucket on the GPU; on gloo (no device) it takes host memory only, and a CUDA
    bucket is staged once. No GPU is needed: only the adapter's attributes are read."""
    nccl = _C.TorchCommunicator(_StubAdapter(torch.device("cuda", 1)))
    assert nccl.takes("cuda:1") and nccl.takes("cpu")
    assert not nccl.takes("cuda:0")
    gloo = _C.TorchCommunicator(_StubAdapter(None))
    assert gloo.takes("cpu") and not gloo.takes("cuda:1")
    assert not _C.make_local_communicators(1)[0].takes("cuda:0")


_DEVICE_PATHS = [pytest.param("gloo", "cpu", id="gloo-cpu")]
if torch.cuda.is_available() and _C.has_cuda and dist.is_nccl_available():
    _DEVICE_PATHS.append(pytest.param("nccl", "cuda", id="nccl-cuda"))


@pytest.mark.parametrize("backend, device", _DEVICE_PATHS)
def test_the_hook_path_stages_nothing_when_the_group_takes_the_buckets_memory(backend, device, tmp_path):
    """The hook's path (exchange.allreduce_async: the group's exchange worker, compressed_allreduce, the
    TorchCommunicator, the ProcessGroupAdapter) on a bucket in memory the group takes copies none of it, under every
    algorithm: AllreduceStats.staged_bytes is 0 and the adapter stages at most the small host control messages
    (payload sizes, the agreement fingerprint; NCCL takes device memory only), never the bucket or its payloads. On
    the CPU the group is gloo and the bucket host memory (the double of a group that takes the bucket's memory); on a
    GPU (bench/gpu/check.sh, step python.exchange_device) NCCL and a CUDA bucket: the CUDA codec runs and NCCL gets
    the device buffers."""
    from gradcomp.torch import exchange

    dist.init_process_group(backend, init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ex = exchange.exchange_for(None)
        adapter = ex.comm.adapter
        for spec in ("none", "fp16", "topk:ratio=0.25", "qsgd:bits=4", "onebit"):
            codec = gradcomp.compressor(spec)
            original = torch.linspace(-1, 1, 1 << 18, device=device)
            bucket = original.clone()
            stats = {}
            staged_before = adapter.staged_bytes
            exchange.allreduce_async(codec, bucket, f"bucket.{spec}", 0, stats=stats,
                                     segments=[("a", 0, 1000), ("b", 1000, (1 << 18) - 1000)]).wait()
            assert stats["staged_bytes"] == 0, f"{spec}: {stats}"
            control = adapter.staged_bytes - staged_before
            assert control <= 1024, f"{spec}: the adapter copied {control} bytes (the bucket is {4 << 18})"
            if backend == "gloo":
                assert control == 0, f"{spec}: gloo takes host memory, yet the adapter copied {control} bytes"
            # One rank: the average is the rank's own decoded payload.
            if spec == "none":
                assert torch.equal(bucket, original), spec
            elif spec == "fp16":
                assert torch.equal(bucket, original.half().float()), spec
            else:
                assert torch.isfinite(bucket).all() and bucket.abs().sum() > 0, spec
    finally:
        exchange.close_all()
        dist.destroy_process_group()
