"""Launch on Spark: a gradcomp training function run as the tasks of one Spark barrier stage, one task per rank.

    import gradcomp.spark

    def train(lr):
        import gradcomp.torch as hvd
        hvd.init()                      # rank, size and rendezvous come from the Spark task
        ...
        return hvd.rank()

    ranks = gradcomp.spark.run(train, args=(0.1,), num_proc=4)   # [0, 1, 2, 3]

Modules: ``session`` (the SparkContext, its slots), ``task`` (one rank inside its task), ``job`` (the stage from the
driver, bounded start), ``errors`` (a rank's failure carried to the driver). docs/spark.md has the
semantics: barrier mode, failures, timeouts, retries, dependencies.
"""
import sys

from .errors import RankFailed, find_rank_failure
from .job import StartTimeout, collect_barrier_job
from .session import check_num_proc, get_or_create_context
from .task import make_task

__all__ = ["run", "RankFailed", "StartTimeout"]


def run(fn, args=(), kwargs=None, num_proc=None, backend="torch", start_timeout=600.0, env=None, verbose=1):
    """Runs fn(*args, **kwargs) on num_proc ranks, each a task of one Spark barrier stage (all start together or
    none), and returns the ranks' return values in rank order.

    Inside fn, gradcomp.torch.init() (or torch.distributed.init_process_group(init_method="env://")) joins the ranks:
    the task sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (rank 0's host, from the barrier
    context's task infos), MASTER_PORT (a free port rank 0 picked, shared through the barrier's allGather),
    GRADCOMP_BACKEND=backend and GRADCOMP_TORCH_PG (nccl when Spark assigned the task GPUs, with
    CUDA_VISIBLE_DEVICES set to them; else gloo), then restores the worker's environment after fn.

    fn, args, kwargs: pickled to the tasks (a function of an importable module travels by reference: the executors
    must import it too). num_proc: ranks; None = the SparkContext's defaultParallelism. ValueError, before anything
    runs, when it is < 1 or more than the task slots the context has now. backend: gradcomp.torch's backend in the
    tasks; "torch" (torch.distributed) is the one a Spark task can have. start_timeout: seconds for all tasks to be
    running; past it the job is cancelled and StartTimeout raised. env: extra environment variables for the tasks
    (e.g. {"OMP_NUM_THREADS": "1"}). verbose: 0 silent, 1 a line on the driver per run, 2 also each rank's
    rendezvous on its task's stderr.

    Uses the active SparkContext, else starts a local[num_proc] SparkSession (session.get_or_create_context). A rank
    whose fn raises fails the stage: Spark kills the other ranks' tasks and this raises RankFailed with the rank and
    its traceback. A rank that hangs is bounded by the communicator timeout of the others
    (gradcomp.torch.init(timeout_s=...), 60 s by default): they raise gradcomp.Timeout, which fails the stage.
    """
    if backend != "torch":
        raise ValueError(f"gradcomp.spark.run: backend '{backend}' cannot run in Spark tasks (no MPI launcher there); "
                         "use backend='torch' (torch.distributed: gloo, or NCCL on the tasks' GPUs)")
    if not callable(fn):
        raise ValueError(f"gradcomp.spark.run: fn must be callable, not {type(fn).__name__}")
    if isinstance(num_proc, int) and not isinstance(num_proc, bool) and num_proc < 1:
        raise ValueError(f"gradcomp.spark.run: num_proc must be >= 1, not {num_proc}")
    sc = get_or_create_context(num_proc)
    num_proc = check_num_proc(sc, num_proc)
    task = make_task(fn, tuple(args), dict(kwargs or {}), env, backend, verbose)
    rdd = sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(task)
    name = getattr(fn, "__qualname__", repr(fn))
    if verbose >= 1:
        print(f"gradcomp.spark.run: {name} on {num_proc} ranks (master {sc.master}, barrier mode)",
              file=sys.stderr, flush=True)
    try:
        pairs = collect_barrier_job(sc, rdd, num_proc, start_timeout, f"gradcomp.spark.run({name}, {num_proc} ranks)")
    except StartTimeout:
        raise
    except Exception as e:
        failure = find_rank_failure(str(e))
        if failure is None:
            raise
        failure.spark_error = e
        raise failure from None
    return [value for _, value in sorted(pairs, key=lambda pair: pair[0])]
