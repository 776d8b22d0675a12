"""Runs the barrier stage from the driver with a bounded start: the job runs in a thread under its own job group,
and the driver cancels it when its tasks have not all started within start_timeout seconds."""
import time
import uuid


class StartTimeout(TimeoutError):
    """The barrier stage's tasks did not all start within start_timeout (too few free slots or executors)."""


def _started_tasks(sc, group):
    tracker = sc.statusTracker()
    started = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in (job.stageIds if job else []):
            stage = tracker.getStageInfo(stage_id)
            if stage:
                started += stage.numActiveTasks + stage.numCompletedTasks + stage.numFailedTasks
    return started


def collect_barrier_job(sc, rdd, num_tasks, start_timeout, description):
    """rdd.collect() (an RDD whose stage runs num_tasks barrier tasks), waiting at most start_timeout seconds for the
    tasks to be running; raises StartTimeout after cancelling the job, or the job's own exception. Once started, the
    job runs to its end: the ranks' communicator timeouts bound a rank that hangs."""
    from pyspark import InheritableThread
    group = f"gradcomp.spark-{uuid.uuid4().hex}"
    outcome = {}

    def body():
        sc.setJobGroup(group, description, interruptOnCancel=True)
        try:
            outcome["result"] = rdd.collect()
        except BaseException as e:  # handed to the driver's thread
            outcome["error"] = e

    thread = InheritableThread(target=body, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    started = False
    try:
        while thread.is_alive():
            thread.join(0.2)
            if not started and thread.is_alive():
                started = _started_tasks(sc, group) >= num_tasks
                if not started and time.monotonic() > deadline:
                    sc.cancelJobGroup(group)
                    thread.join(30)
                    raise StartTimeout(f"gradcomp.spark.run: {_started_tasks(sc, group)} of {num_tasks} tasks "
                                       f"started within start_timeout={start_timeout:g} s; the job was cancelled "
                                       f"(master {sc.master}: are there {num_tasks} free task slots?)")
    except KeyboardInterrupt:
        sc.cancelJobGroup(group)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
