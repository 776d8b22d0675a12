"""horovod.torch.mpi_ops' names, for scripts that import them from there: the collectives and their handles, the
reduce ops, init/shutdown and the topology queries (the modules that define them: collectives.py, gathers.py,
context.py, launch.py, topology.py, process_sets.py)."""
from .collectives import (allreduce, allreduce_, allreduce_async, allreduce_async_, barrier, grouped_allreduce,
                          grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, join, poll,
                          synchronize)
from .context import (Adasum, Average, Max, Min, Product, Sum, is_initialized, local_rank, local_size, rank,
                      size)
from .gathers import (allgather, allgather_async, alltoall, alltoall_async, broadcast, broadcast_, broadcast_async,
                      broadcast_async_, grouped_allgather, grouped_allgather_async, grouped_reducescatter,
                      grouped_reducescatter_async, reducescatter, reducescatter_async, sparse_allreduce_async)
from .launch import init, shutdown
from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from .topology import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                       is_homogeneous, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rocm_built,
                       start_timeline, stop_timeline)

__all__ = [n for n in dir() if not n.startswith("_")]
