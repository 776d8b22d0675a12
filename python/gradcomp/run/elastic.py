"""gradcomprun's elastic mode on torchrun's elastic agent (docs/elastic.md): horovodrun's --min-np, --max-np and
--host-discovery-script become one torchrun agent per discovered slot (`--nnodes=MIN:MAX --nproc_per_node=1`, a c10d
rendezvous whose TCP store gradcomprun hosts, so any agent may die without taking the rendezvous with it). The
discovery script runs every few seconds; new slots get agents, up to --max-np. The agents restart their workers after
a failure (--reset-limit times) and re-form the job with the survivors when an agent dies; the script uses
gradcomp.torch.elastic (hvd.elastic.run). The job succeeds when an agent completes."""
import os
import subprocess
import sys
import time

from .hosts import HostError, parse_hosts
from .procs import exported_names, remote_command, start, stop

_DISCOVERY_PERIOD_S = 3.0


def discover(a):
    """[(host, slots)] printed by the discovery script (one 'host' or 'host:slots' per line), or -H/--hostfile."""
    if not a.host_discovery_script:
        return a.hosts
    try:
        out = subprocess.run([a.host_discovery_script], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise HostError(f"--host-discovery-script {a.host_discovery_script} failed: {e}") from e
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if a.slots:
        lines = [line if ":" in line else f"{line}:{a.slots}" for line in lines]
    return parse_hosts(",".join(lines)) if lines else []


def agent_command(a, endpoint, job_id, log_dir):
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={a.min_np}:{a.max_np}", "--nproc_per_node=1",
            f"--max_restarts={a.reset_limit}", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}",
            f"--rdzv_id={job_id}", f"--rdzv_conf=is_host=false,last_call_timeout=1,join_timeout={int(a.elastic_timeout)}",
            "--monitor_interval=0.5", "--redirects=1", "--tee=1", f"--log_dir={log_dir}", "--no_python"] + list(a.command)


def launch(a):
    import socket
    import tempfile

    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("0.0.0.0", port, None, True, wait_for_workers=False)  # the rendezvous; lives with the job
    endpoint = f"{socket.gethostname()}:{port}"
    job_id = f"gradcomprun-{os.getpid()}"
    log_dir = tempfile.mkdtemp(prefix="gradcomprun-elastic-")
    env = dict(os.environ, GRADCOMP_TORCH_PG=os.environ.get("GRADCOMP_TORCH_PG", "gloo"))
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_"))}
    agents = {}  # (host, slot) -> Popen
    next_check = 0.0
    deadline = time.monotonic() + a.timeout if a.timeout > 0 else None
    try:
        while True:
            if deadline is not None and time.monotonic() > deadline:
                print(f"gradcomprun: the job ran past --timeout {a.timeout:g} s; stopping it", flush=True)
                stop(list(agents.values()))
                return 124
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + _DISCOVERY_PERIOD_S
                for host, slots in discover(a):
                    for slot in range(slots):
                        if (host, slot) in agents:
                            continue
                        if len([p for p in agents.values() if p.poll() is None]) >= a.max_np:
                            break
                        extra = {k: env[k] for k in exported_names(env)}
                        cmd = remote_command(host, a, extra, agent_command(a, endpoint, job_id, log_dir))
                        if a.verbose:
                            print(f"gradcomprun: agent on {host} (slot {slot}):", " ".join(cmd), flush=True)
                        agents[(host, slot)] = start(cmd, env)
            codes = [p.poll() for p in agents.values()]
            if 0 in codes:
                stop([p for p in agents.values() if p.poll() is None], grace_s=30.0)
                return 0
            if agents and all(c is not None for c in codes):
                print(f"gradcomprun: every elastic agent failed (statuses {codes}); logs in {log_dir}", flush=True)
                return next(c for c in codes if c)
            time.sleep(0.2)
    except KeyboardInterrupt:
        stop(list(agents.values()))
        return 130
    finally:
        del store
