"""gradcomp.torch as a package (issue 16): it exposes the public names of the single module it replaced, its modules
import one another without cycles, and none is longer than 450 lines."""
import ast
import pathlib
import types

import gradcomp.torch as hvd

# The public names of gradcomp.torch when it was one file (python/gradcomp/torch.py at 5f95e73: dir() without
# underscores, less the modules it had imported: atexit, contextlib, dist, hashlib, os, socket, torch).
PUBLIC = {
    "Adasum", "Average", "CommError", "Compression", "CompressionSpec", "DistributedOptimizer", "Error", "HookState",
    "InvalidArgument", "Sum", "Timeout", "allreduce", "allreduce_", "backend", "broadcast", "broadcast_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "bucket_name", "bucket_segments",
    "compressor", "ddp_comm_hook", "init", "is_initialized", "local_rank", "local_size", "make_spec", "rank",
    "shutdown", "size",
    "SyncBatchNorm",  # issue 19 (optimizer half)
    "CompressedAdam", "AutoWarmup", "VarianceSchedule",  # issue 32 (momentum compression for Adam)
}
# Horovod API parity (issue 19): collectives, topology, process sets, utilities.
PUBLIC |= {
    "Min", "Max", "Product", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
    "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async", "sparse_allreduce_async", "join",
    "barrier", "poll", "synchronize", "allgather_object", "cross_rank", "cross_size", "is_homogeneous", "mpi_built",
    "nccl_built", "gloo_built", "cuda_built", "rocm_built", "ddl_built", "ccl_built", "mpi_enabled", "gloo_enabled",
    "mpi_threads_supported", "start_timeline", "stop_timeline", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "HorovodInternalError", "HostsUpdatedInterrupt", "check_extension",
}
# Every public name of horovod.torch 0.28.1 (dir() of the installed package without underscores: 67 names and its
# submodules; mpi_lib_v2, its C extension, is gradcomp._gradcomp here).
HOROVOD_TORCH_0_28_1 = {
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HorovodInternalError", "Max", "Min", "ProcessSet",
    "Product", "Sum", "SyncBatchNorm", "add_process_set", "allgather", "allgather_async", "allgather_object",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object", "broadcast_optimizer_state",
    "broadcast_parameters", "ccl_built", "check_extension", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "init", "is_initialized", "join", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size", "sparse_allreduce_async",
    "start_timeline", "stop_timeline", "synchronize",
}
HOROVOD_TORCH_MODULES = {"compression", "elastic", "functions", "mpi_ops", "optimizer", "sync_batch_norm"}


def test_every_public_name_of_horovod_torch_exists():
    missing = sorted(n for n in HOROVOD_TORCH_0_28_1 | HOROVOD_TORCH_MODULES if not hasattr(hvd, n))
    assert not missing, f"horovod.torch names missing from gradcomp.torch: {missing}"
    from gradcomp.torch.compression import Compressor, FP16Compressor, NoneCompressor  # noqa: F401
    from gradcomp.torch.mpi_ops import allreduce_async, poll, synchronize  # noqa: F401
    from gradcomp.torch.functions import broadcast_parameters  # noqa: F401
    assert hvd.mpi_ops.allreduce is hvd.allreduce and hvd.compression.Compression is hvd.Compression
    assert hvd.check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", __file__, "mpi_lib_v2") is None


def test_public_names_are_those_of_the_module_it_replaced():
    names = {n for n in dir(hvd) if not n.startswith("_") and not isinstance(getattr(hvd, n), types.ModuleType)}
    assert names == PUBLIC
    assert sorted(hvd.__all__) == sorted(PUBLIC)


def test_private_names_read_by_tests_and_benches_remain():
    import gradcomp
    assert hvd._C is gradcomp._gradcomp
    assert hvd._ctx is hvd.context._ctx
    assert callable(hvd._rendezvous_port) and callable(hvd._check_op)


def _package_imports():
    """{module: modules of the package it imports}, from each file's relative imports."""
    pkg = pathlib.Path(hvd.__file__).resolve().parent
    graph = {}
    for path in sorted(pkg.glob("*.py")):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        graph[path.stem] = deps
    return pkg, graph


def test_modules_have_no_import_cycles_and_stay_small():
    pkg, graph = _package_imports()
    assert {"context", "exchange", "launch", "backends", "collectives", "optimizer", "hook"} <= set(graph)
    for name in graph:
        lines = len((pkg / f"{name}.py").read_text().splitlines())
        assert lines <= 450, f"gradcomp/torch/{name}.py has {lines} lines"
    done, path = set(), []

    def visit(name):
        assert name not in path, f"import cycle: {' -> '.join(path + [name])}"
        if name in done:
            return
        path.append(name)
        for dep in graph.get(name, ()):
            visit(dep)
        path.pop()
        done.add(name)

    for name in graph:
        visit(name)
