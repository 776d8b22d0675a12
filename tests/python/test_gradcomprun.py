"""gradcomprun: flag parsing (hosts, hostfile, slots, unknown flags, elastic), the mpirun and gloo commands it
builds, --check-build, a 2-rank launch on each launcher, a failing rank's status, and unreachable hosts failing
within --start-timeout."""
import os
import socket
import subprocess
import sys
import time

import pytest

from gradcomp.run import args as run_args
from gradcomp.run import gloo, mpi
from gradcomp.run.args import UsageError

RUN = [sys.executable, "-m", "gradcomp.run"]


def parse(line):
    return run_args.parse(line.split())


def test_hosts_slots_and_defaults():
    a = parse("-np 3 -H h1:2,h2:2 python t.py --lr 0.1")
    assert a.hosts == [("h1", 2), ("h2", 2)] and a.np == 3 and a.command == ["python", "t.py", "--lr", "0.1"]
    assert run_args.assign(a.hosts, a.np) == [("h1", 0, 2, 0), ("h1", 1, 2, 0), ("h2", 0, 1, 1)]
    assert parse("-H h1,h2:3 python t.py").np == 4  # -np defaults to every slot; a bare host has one
    assert parse("-np 2 python t.py").hosts == [("localhost", 2)]


def test_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4\nnode2:2\nnode3\n")
    assert parse(f"--hostfile {f} python t.py").hosts == [("node1", 4), ("node2", 2), ("node3", 1)]
    f.write_text("node1 cpus=4\n")
    with pytest.raises(UsageError, match="slots=N"):
        parse(f"--hostfile {f} python t.py")


@pytest.mark.parametrize("line,message", [
    ("-np 5 -H a:2,b:2 python t.py", "more than the 4 slots"),
    ("-np 2 --bogus python t.py", "--bogus"),
    ("-np 2 -- --ssh-prot 22 python t.py", "did you mean '--ssh-port'"),
    ("-np 2", "no command"),
    ("python t.py", "-np is required"),
    ("-np 2 -H a:x python t.py", "bad host 'a:x'"),
    ("-np 2 -H a:2 --hostfile f python t.py", "exclude each other"),
    ("--min-np 3 --max-np 2 --host-discovery-script d.sh python t.py", "--min-np"),
    ("--mpi --gloo -np 2 python t.py", "not allowed with"),
])
def test_bad_command_lines(line, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse(line)


def test_unknown_flag_exit_status():
    r = subprocess.run(RUN + ["-np", "2", "--bogus", "python", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "--bogus" in r.stderr


def test_mpirun_command_translates_flags():
    a = parse("-np 4 -H h1:2,h2:2 -p 2222 --network-interface eth1 --mpi-args=--report-bindings python t.py")
    cmd = mpi.command(a)
    s = " ".join(cmd)
    assert "-np 4 -H h1:2,h2:2" in s and cmd[cmd.index("plm_rsh_args") + 1] == "-p 2222"
    assert "btl_tcp_if_include eth1" in s and "oob_tcp_if_include eth1" in s and "--report-bindings" in s
    assert cmd[-2:] == ["python", "t.py"]


def test_gloo_rank_environment():
    envs = gloo.rank_envs(parse("--gloo -np 3 -H localhost:2,localhost:2 python t.py"))
    assert [e["RANK"] for _, e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for _, e in envs] == ["0", "1", "0"] and envs[2][1]["CROSS_RANK"] == "1"
    assert {e["MASTER_ADDR"] for _, e in envs} == {"127.0.0.1"} and len({e["MASTER_PORT"] for _, e in envs}) == 1


def test_elastic_maps_to_torchrun():
    from gradcomp.run import elastic
    a = parse("--min-np 2 --max-np 4 --host-discovery-script ./d.sh --reset-limit 5 python t.py")
    cmd = elastic.agent_command(a, "h:1234", "job", "/tmp/x")
    assert "--nnodes=2:4" in cmd and "--max_restarts=5" in cmd and "--rdzv_endpoint=h:1234" in cmd
    assert cmd[-2:] == ["python", "t.py"]


def test_check_build():
    r = subprocess.run(RUN + ["--check-build"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Available Frameworks:" in r.stdout and "[X] PyTorch" in r.stdout and "[X] MPI" in r.stdout
    assert "topk" in r.stdout


# One write per line (print() may write its pieces apart when stdout is unbuffered, interleaving the ranks').
PRINT_RANK = ("import os; os.write(1, ('rank %s\\n' % (os.environ.get('RANK') or "
              "os.environ['OMPI_COMM_WORLD_RANK'])).encode())")


@pytest.mark.parametrize("launcher", [[], ["--gloo"]])
def test_two_rank_launch(launcher):
    r = subprocess.run(RUN + launcher + ["-np", "2", sys.executable, "-c", PRINT_RANK], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 0" in r.stdout and "rank 1" in r.stdout


def test_gloo_launch_runs_torch_distributed():
    code = ("import os, gradcomp.torch as hvd, torch; hvd.init(); "
            "os.write(1, ('sum %s %s\\n' % (hvd.allreduce(torch.ones(1) * hvd.rank(), op=hvd.Sum).item(), "
            "hvd.backend())).encode())")
    r = subprocess.run(RUN + ["--gloo", "-np", "2", sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("sum 1.0 torch") == 2


def test_failing_rank_stops_the_job():
    code = "import os, sys, time; r = int(os.environ['RANK']); time.sleep(0 if r else 60); sys.exit(3 if r else 0)"
    t = time.monotonic()
    r = subprocess.run(RUN + ["--gloo", "-np", "2", sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3 and time.monotonic() - t < 30, r.stdout + r.stderr
    assert "rank 1 exited with status 3" in r.stdout


def test_unreachable_host_fails_within_start_timeout():
    # A loopback address that accepts TCP and never speaks ssh: the check must give up at --start-timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.2", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        t = time.monotonic()
        r = subprocess.run(RUN + ["-np", "2", "-H", "127.0.0.2:2", "-p", str(port), "--start-timeout", "3",
                                  sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t
    assert r.returncode == 1 and "127.0.0.2" in r.stderr and "no answer within 3 s" in r.stderr, r.stderr
    assert 3 <= took < 10


def test_refused_host_is_named():
    with socket.socket() as s:
        s.bind(("127.0.0.3", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        r = subprocess.run(RUN + ["-np", "1", "-H", "127.0.0.3:1", "-p", str(port), "--start-timeout", "5",
                                  sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "127.0.0.3" in r.stderr and "unreachable" in r.stderr


def test_elastic_survives_a_lost_node(tmp_path):
    """gradcomprun --min-np 2 --max-np 3 --host-discovery-script: three torchrun agents on this machine train
    elastic_train.py (top-k with error feedback); rank 2's node (agent and worker) dies inside its allreduce at step 3;
    the two survivors re-form, resume the last commit and finish every step with identical parameters."""
    import json
    out = tmp_path / "out"
    out.mkdir()
    discovery = tmp_path / "hosts.sh"
    discovery.write_text("#!/bin/sh\necho localhost:3\n")
    discovery.chmod(0o755)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_train.py")
    env = dict(os.environ, GRADCOMP_ELASTIC_DIR=str(out / "commits"), OMP_NUM_THREADS="1")
    r = subprocess.run(RUN + ["--min-np", "2", "--max-np", "3", "--host-discovery-script", str(discovery),
                              "--timeout", "200", sys.executable, script, "--steps", "8", "--out", str(out),
                              "--kill", "2:3:allreduce", "--kill-agent"],
                       capture_output=True, text=True, timeout=240, env=env)
    logs = r.stdout + r.stderr
    assert r.returncode == 0, logs
    finals = [json.loads(p.read_text()) for p in sorted(out.glob("final-*.json"))]
    assert sorted(d["rank"] for d in finals) == [0, 1], logs
    assert all(d["size"] == 2 and d["step"] == 8 for d in finals), (finals, logs)
    assert len({d["digest"] for d in finals}) == 1 and "resumed commit" in logs, (finals, logs)
