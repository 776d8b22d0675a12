"""--launcher spark: the sweep's ranks as the tasks of one Spark barrier stage (gradcomp.spark.run on a local[N]
master) instead of mpirun or one process per rank. Each task runs the same worker script with the same arguments;
gradcomp.spark sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which the worker's process group and
gradcomp.torch.init() read, so --comm gradcomp runs DistributedOptimizer on gradcomp's torch backend (gloo) and
--comm ddp-hook the DDP hook, as without Spark. Rank 0's '@@' events are rendered in its task as run.py renders
them (the task's output reaches this terminal through Spark's executor, on stderr)."""
from __future__ import annotations

import copy
import io
import json
import os
import runpy
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class _EventTap(io.TextIOBase):
    """Rank 0's stdout inside its task: '@@' event lines go to `progress` (and failures are kept), others pass."""

    def __init__(self, progress, failures: dict, real):
        self.progress = progress
        self.failures = failures
        self.real = real
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            sys.stdout = self.real  # where progress writes
            try:
                if line.startswith("@@ "):
                    ev = json.loads(line[3:])
                    if ev["event"] == "failed":
                        self.failures[ev["spec"]] = ev["error"]
                    self.progress.event(ev)
                else:
                    self.progress.passthrough(line + "\n")
            finally:
                sys.stdout = self
        return len(text)


def _rank(script: str, script_args: list, progress, threads: int):
    """One rank inside its Spark task: runs `script` (worker.py or lm_worker.py) as __main__ with `script_args`.
    Returns (exit status, failures reported by rank 0's events, rank 0's count of finished runs)."""
    import torch
    torch.set_num_threads(threads)
    rank = int(os.environ["RANK"])
    failures: dict = {}
    saved_argv, saved_stdout = sys.argv, sys.stdout
    sys.argv = [script] + list(script_args)
    if rank == 0:
        sys.stdout = _EventTap(progress, failures, saved_stdout)
    try:
        runpy.run_path(script, run_name="__main__")
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.stdout = saved_argv, saved_stdout
    return rc, failures, progress.count


def launch(args, worker_command: list, progress, failures: dict) -> int:
    """Runs the ranks once as Spark tasks; returns the exit status as run.py's launch() does (0, the first non-zero
    rank's status, 1 when a rank raised, 124 when the sweep's --timeout cut the job). worker_command: the worker's
    script and arguments (the command mpirun would run, without the interpreter). Needs gradcomp built with Python
    (--build-dir) and PySpark with Java (scripts/spark-deps.sh)."""
    if args.link:
        sys.exit("run.py: --link shapes one launched command; use --launcher mpirun")
    build_python = os.path.join(args.build_dir, "python")
    sys.path.insert(0, build_python)
    # The executors' Python workers inherit this environment when the local master starts (first launch only).
    paths = [build_python, HERE] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PYSPARK_PYTHON", args.python)
    try:
        import gradcomp.spark
        from gradcomp.spark import session
    except ImportError as e:
        sys.exit(f"run.py --launcher spark: {e}")
    sc = session.get_or_create_context(args.ranks)
    sc.setLogLevel("ERROR")
    timed_out = threading.Event()

    def stop():
        timed_out.set()
        sc.cancelAllJobs()

    watchdog = threading.Timer(max(0.0, args.deadline - time.monotonic()), stop)
    watchdog.daemon = True
    watchdog.start()
    remote = copy.copy(progress)
    remote.tty = False  # the task's output is no terminal: one line per event
    try:
        results = gradcomp.spark.run(_rank, args=(worker_command[0], worker_command[1:], remote, args.threads),
                                     num_proc=args.ranks, env={"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
                                     verbose=0)
    except gradcomp.spark.RankFailed as e:
        progress.passthrough(f"run.py: {e}\n")
        return 1
    except Exception as e:  # the job was cancelled (timeout) or Spark failed outside the ranks
        if timed_out.is_set():
            progress.passthrough(f"run.py: the sweep ran past --timeout {args.timeout:g} s; the job was cancelled\n")
            return 124
        progress.passthrough(f"run.py: the Spark job failed: {str(e).splitlines()[0] if str(e) else e!r}\n")
        return 1
    finally:
        watchdog.cancel()
    rc0, rank0_failures, count = results[0]
    failures.update(rank0_failures)
    progress.count = count
    return next((rc for rc, _, _ in results if rc != 0), 0)
