"""The exchange worker (python/src/exchange_worker.cc) runs a CUDA tensor's job on the tensor's device and on the
stream that produced it. Its worker thread never chose a device, so without that every CUDA call of the job ran on
GPU 0's legacy stream, unordered after the backward kernels of cuda:local_rank (stale averages on local ranks >= 1).
No GPU is needed: a DLPack capsule labelled cuda:1 stands in for the tensor, and the worker's `device_enter` seam
records what the worker thread would make current (in production it is a gradcomp DeviceScope). The job itself then
fails (no device here), and the failure reaches the future."""
import ctypes
import threading

import pytest
import torch

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
