"""Processes of a launch: the environment handed to ranks, commands for remote hosts, and waiting for a group of
processes (the first failure ends the others; an optional time limit)."""
import os
import shlex
import signal
import subprocess
import time

from .hosts import is_local, ssh_command

# Variables a rank needs from the launching shell (mpirun -x, ssh env): these names and prefixes.
_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES")
_PREFIXES = ("GRADCOMP_", "HOROVOD_", "OMP_", "TF_", "NCCL_", "GLOO_", "OMPI_MCA_", "FASHION_MNIST")


def exported_names(env):
    return sorted(k for k in env if k in _NAMES or k.startswith(_PREFIXES))


def remote_command(host, args, env, command):
    """The argv that runs `command` with `env` (a dict of extra variables) on `host`: directly when local, else
    through ssh in the same working directory."""
    if is_local(host):
        return command
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    line = f"cd {shlex.quote(os.getcwd())} && env {exports} {' '.join(shlex.quote(c) for c in command)}"
    cmd = ssh_command(host, args.ssh_port, args.start_timeout)
    if args.ssh_identity_file:
        cmd[1:1] = ["-i", args.ssh_identity_file]
    return cmd + [line]


def start(cmd, env, **kw):
    return subprocess.Popen(cmd, env=env, start_new_session=True, **kw)


def stop(procs, grace_s=5.0):
    """SIGTERM to each running process group, SIGKILL after grace_s."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def wait_all(procs, timeout_s=0.0, what="rank"):
    """Waits for every process; the first non-zero exit stops the others and is returned (0 when all succeed, 124
    when timeout_s > 0 passed first). Ctrl-C stops them all (130)."""
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, c = failed[0]
                print(f"gradcomprun: {what} {i} exited with status {c}; stopping the others", flush=True)
                stop(procs)
                return c if c > 0 else 128 - c
            if all(c == 0 for c in codes):
                return 0
            if deadline is not None and time.monotonic() > deadline:
                print(f"gradcomprun: the job ran past --timeout {timeout_s:g} s; stopping it", flush=True)
                stop(procs)
                return 124
            time.sleep(0.1)
    except KeyboardInterrupt:
        stop(procs)
        return 130
