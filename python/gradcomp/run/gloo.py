"""gradcomprun --gloo: gradcomprun starts every rank itself (locally, or through ssh on remote hosts) with the
variables torch.distributed's env:// rendezvous reads (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, plus GROUP_RANK/CROSS_*), so gradcomp.torch.init() and gradcomp.tensorflow.init() take the "torch"
backend (gloo) and a plain torch.distributed script runs unchanged."""
import os
import shlex
import socket

from .args import assign
from .hosts import is_local
from .procs import exported_names, remote_command, start, wait_all


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rank_envs(a):
    """[(host, {variable: value})] of each rank."""
    placed = assign(a.hosts, a.np)
    master = placed[0][0]
    addr = "127.0.0.1" if is_local(master) else master
    port = str(_free_port())
    hosts_used = len({p[3] for p in placed})
    out = []
    for r, (host, lr, ls, index) in enumerate(placed):
        env = {"RANK": str(r), "WORLD_SIZE": str(a.np), "LOCAL_RANK": str(lr), "LOCAL_WORLD_SIZE": str(ls),
               "GROUP_RANK": str(index), "CROSS_RANK": str(index), "CROSS_SIZE": str(hosts_used),
               "MASTER_ADDR": addr, "MASTER_PORT": port, "GRADCOMP_START_TIMEOUT": str(a.start_timeout)}
        if a.nics:
            env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = a.nics
        out.append((host, env))
    return out


def launch(a):
    procs = []
    for host, extra in rank_envs(a):
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_"))}
        env = dict(base, **extra)
        if not is_local(host):
            extra = dict({k: os.environ[k] for k in exported_names(os.environ)}, **extra)
        cmd = remote_command(host, a, extra, a.command)
        if a.verbose:
            print(f"gradcomprun: rank {extra['RANK']} on {host}:",
                  " ".join(f"{k}={v}" for k, v in extra.items() if k in ("RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                                           "MASTER_PORT")),
                  " ".join(shlex.quote(c) for c in cmd), flush=True)
        procs.append(start(cmd, env))
    return wait_all(procs, a.timeout)
