"""Starts torchrun elastic agents on this machine for the elastic tests and bench/elastic: each agent is one "node"
(--nproc_per_node=1) of a c10d rendezvous whose TCP store this process hosts (every agent is a client:
is_host=false), so that any agent may be killed without taking the rendezvous with it."""
import os
import signal
import socket
import subprocess
import sys
import time

import torch.distributed as dist


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid):
    """Process ids whose parent is `pid` (the agent's workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


class Job:
    """Agents of one elastic job: `nnodes` "MIN:MAX", `max_restarts`, logs under `out`, the worker `script` with
    `args`, extra environment `env`."""

    def __init__(self, out, script, args, nnodes="2:4", max_restarts=3, env=None, run_id="gradcomp-test"):
        self.out, self.script, self.args = out, script, list(args)
        self.nnodes, self.max_restarts, self.run_id = nnodes, max_restarts, run_id
        os.makedirs(out, exist_ok=True)
        self.port = free_port()
        self.store = dist.TCPStore("127.0.0.1", self.port, None, True, wait_for_workers=False)
        # torch >= 2.4 shares the agents' TCP store: it keeps the first round's master address, so an agent that
        # joins a later round (or outlives the first round's rank 0) waits forever for a key nobody sets. Elastic
        # jobs turn the sharing off (docs/elastic.md).
        self.env = dict(os.environ, OMP_NUM_THREADS="1", GRADCOMP_TORCH_PG="gloo",
                        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **(env or {}))
        self.agents = []

    def start_agent(self):
        """Starts one more agent (a node); returns its Popen. Its output goes to <out>/agent<i>.log."""
        i = len(self.agents)
        # --redirects/--tee 1: torch 1.13 on Python 3.11 cannot parse the default "0" (Std.NONE is not iterated).
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={self.nnodes}", "--nproc_per_node=1",
               f"--max_restarts={self.max_restarts}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{self.port}",
               f"--rdzv_id={self.run_id}", "--rdzv_conf=is_host=false,last_call_timeout=1",
               "--monitor_interval=0.5", "--redirects=1", "--tee=1", f"--log_dir={self.out}/logs{i}",
               self.script] + self.args
        log = open(os.path.join(self.out, f"agent{i}.log"), "w")
        self.agents.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True))
        return self.agents[-1]

    def wait(self, timeout):
        """Exit codes of every agent (None: still running at the deadline, then killed)."""
        deadline = time.time() + timeout
        codes = []
        for p in self.agents:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        self.kill()
        return codes

    def kill(self):
        """SIGKILL to every agent still running and to its workers."""
        for i in range(len(self.agents)):
            self.kill_agent(i)

    def kill_agent(self, i):
        """SIGKILL to agent i and its workers (the node is lost), if it still runs."""
        p = self.agents[i]
        if p.poll() is None:
            for pid in [p.pid] + _children(p.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()

    def logs(self):
        text = []
        for i in range(len(self.agents)):
            with open(os.path.join(self.out, f"agent{i}.log"), errors="replace") as f:
                text.append(f"--- agent {i} ---\n" + f.read()[-6000:])
        return "\n".join(text)
