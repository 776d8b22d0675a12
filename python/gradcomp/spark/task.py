"""The Spark task side of gradcomp.spark.run: one barrier task is one rank. It learns its rank and the ranks'
hosts from the barrier context, agrees on rank 0's port, sets the environment that torch.distributed's env://
rendezvous and gradcomp.torch.init() read, runs the user's function, and leaves the Python worker as it found it
(PySpark reuses workers for later tasks)."""
import socket
import sys
import time
import traceback

from .._env import environ_scope
from .errors import is_peer_failure, rank_failure_message

# Seconds a rank whose fn failed with a communication error waits before reporting it (errors.is_peer_failure).
PEER_FAILURE_GRACE_S = 10.0

# Launcher variables that gradcomp.torch.init() reads before RANK/WORLD_SIZE: cleared inside the task, so a driver
# started under mpirun or srun does not hand its own rank to every task.
_OTHER_LAUNCHERS = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                    "SLURM_LOCALID", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "GRADCOMP_INIT_METHOD")


def _host_of(address):
    """'10.0.0.5:41234' -> '10.0.0.5'; '[::1]:41234' -> '::1'."""
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rank_environment(rank, hosts, port, gpus, backend):
    """The variables one rank runs under. hosts: every rank's host, in rank order; port: rank 0's rendezvous port;
    gpus: the GPU addresses Spark assigned to this task ([] when none); backend: gradcomp.torch's backend. The
    process group is NCCL on the task's own GPUs when Spark assigned some (CUDA_VISIBLE_DEVICES = them), else gloo."""
    env = {"RANK": rank, "WORLD_SIZE": len(hosts), "LOCAL_RANK": hosts[:rank].count(hosts[rank]),
           "LOCAL_WORLD_SIZE": hosts.count(hosts[rank]), "MASTER_ADDR": hosts[0], "MASTER_PORT": port,
           "GRADCOMP_MASTER_ADDR": hosts[0], "GRADCOMP_MASTER_PORT": port, "GRADCOMP_BACKEND": backend,
           "GRADCOMP_TORCH_PG": "nccl" if gpus else "gloo"}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return {k: str(v) for k, v in env.items()}


def _release_process_group():
    """Ends what `fn` left initialized (gradcomp.torch's context, the default process group): a reused worker's next
    task must start without them. Modules `fn` never imported are not imported here."""
    gct = sys.modules.get("gradcomp.torch")
    if gct is not None and gct.is_initialized():
        gct.shutdown()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def make_task(fn, args, kwargs, user_env, backend, verbose):
    """The mapPartitions function of the barrier stage: yields (rank, fn(*args, **kwargs)) once. When fn raises, the
    task raises a RuntimeError whose message holds the rank and traceback (errors.rank_failure_message): Spark then
    fails the stage and kills the other ranks' tasks, and the driver turns the message into RankFailed."""

    def task(_partition):
        from pyspark import BarrierTaskContext
        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        hosts = [_host_of(info.address) for info in ctx.getTaskInfos()]
        # Rank 0 picks a free port on its host and every task learns it (allGather is also the start barrier).
        port = int(ctx.allGather(str(_free_port()) if rank == 0 else "")[0])
        resources = ctx.resources()
        gpus = list(resources["gpu"].addresses) if "gpu" in resources else []
        env = rank_environment(rank, hosts, port, gpus, backend)
        env.update({k: str(v) for k, v in (user_env or {}).items()})
        if verbose >= 2:
            print(f"gradcomp.spark: rank {rank} of {len(hosts)} on {hosts[rank]}, rendezvous "
                  f"{hosts[0]}:{port}, process group {env['GRADCOMP_TORCH_PG']}", file=sys.stderr, flush=True)
        with environ_scope(env, unset=_OTHER_LAUNCHERS):
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:
                if is_peer_failure(e):
                    # Likely a consequence of another rank's failure: let that one reach the driver first (Spark
                    # reports the first failed task and kills the others, this one included, meanwhile).
                    time.sleep(PEER_FAILURE_GRACE_S)
                raise RuntimeError(rank_failure_message(rank, len(hosts), traceback.format_exc())) from None
            ctx.barrier()  # every rank is done with its collectives before any tears its process group down
            _release_process_group()
        yield rank, result

    return task
