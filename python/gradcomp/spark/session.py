"""The driver's SparkContext for gradcomp.spark.run: the active one, or a local[N] one it starts, and the number of
tasks that context can run at once (a barrier stage needs one slot per rank, all at the same time)."""
import os
import sys

from .._env import environ_scope


def import_pyspark():
    """pyspark, or ImportError saying how to install it (and Java, which it needs)."""
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise ImportError("gradcomp.spark needs PySpark and a Java runtime: run scripts/spark-deps.sh (apt-get "
                          "openjdk-17-jre-headless, pip install pyspark into the project venv)") from e
    return pyspark


def get_or_create_context(num_proc):
    """The active SparkContext when there is one (its master and settings are the caller's). Otherwise starts a
    local SparkSession on this machine: master local[num_proc] (local[*], one slot per core, when num_proc is None),
    bound to 127.0.0.1, tasks run by this interpreter (sys.executable, unless PYSPARK_PYTHON says otherwise), no
    web UI. It stays active after run() returns, so later calls reuse it; SparkSession.getActiveSession().stop()
    ends it."""
    pyspark = import_pyspark()
    sc = pyspark.SparkContext._active_spark_context
    if sc is not None:
        return sc
    from pyspark.sql import SparkSession
    master = f"local[{num_proc}]" if num_proc is not None and num_proc >= 1 else "local[*]"
    # Read by the JVM and by SparkContext at start only: the tasks' interpreter, and the executor address that the
    # barrier tasks see (loopback: Spark would otherwise pick a network interface's address for a local master).
    scoped = {"PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable,
              "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"}
    with environ_scope(scoped):
        spark = (SparkSession.builder.master(master).appName("gradcomp.spark")
                 .config("spark.driver.host", scoped["SPARK_LOCAL_IP"])
                 .config("spark.driver.bindAddress", scoped["SPARK_LOCAL_IP"])
                 .config("spark.ui.enabled", "false")
                 .getOrCreate())
    return spark.sparkContext


def available_slots(sc):
    """Tasks `sc` can run at the same time now (executors registered so far x cores / spark.task.cpus, as Spark's
    own barrier check counts them); sc.defaultParallelism where that count is not reachable from Python."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # a Spark without these (private) JVM methods
        return int(sc.defaultParallelism)


def check_num_proc(sc, num_proc):
    """num_proc, or sc.defaultParallelism when it is None, checked against the slots: a barrier stage with more tasks
    than slots is never scheduled (Spark retries its check for minutes), so that is a ValueError here, at once."""
    if num_proc is None:
        num_proc = int(sc.defaultParallelism)
    if isinstance(num_proc, bool) or not isinstance(num_proc, int):
        raise ValueError(f"gradcomp.spark.run: num_proc must be an int >= 1 or None, not {num_proc!r}")
    if num_proc < 1:
        raise ValueError(f"gradcomp.spark.run: num_proc must be >= 1, not {num_proc}")
    slots = available_slots(sc)
    if num_proc > slots:
        raise ValueError(f"gradcomp.spark.run: num_proc={num_proc} ranks need {num_proc} Spark task slots at once "
                         f"(barrier mode), but the SparkContext (master {sc.master}) has {slots}; use "
                         f"num_proc <= {slots}, a local[{num_proc}] master, or more executors/cores")
    return num_proc
