"""gradcomprun's command line: horovodrun's common flags (-np, -H, --hostfile, -p/--ssh-port, --start-timeout,
--network-interface, --verbose, --mpi/--gloo, --check-build, the elastic --min-np/--max-np/--host-discovery-script),
then the command. An unknown flag before the command is an error naming it (with the closest known flag)."""
import argparse
import difflib

from .hosts import HostError, parse_hostfile, parse_hosts


class UsageError(Exception):
    """A bad command line; the message is for the user (exit status 2)."""


def parser():
    p = argparse.ArgumentParser(
        prog="gradcomprun", description="Launches a gradcomp (or Horovod-style) training script on several "
        "processes and hosts, with horovodrun's flags: through Open MPI's mpirun (default), a TCP rendezvous for "
        "torch.distributed/gloo (--gloo), or torchrun's elastic agent (--min-np/--max-np/--host-discovery-script).",
        usage="gradcomprun [-h] [-np NP] [-H HOSTS | --hostfile FILE] [options] command ...")
    p.add_argument("-v", "--version", action="store_true", help="print gradcomp's version and exit")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of processes (default: every slot)")
    p.add_argument("-H", "--hosts", help="host1:slots,host2:slots (default localhost:NP)")
    p.add_argument("-hostfile", "--hostfile", dest="hostfile", help="file of lines 'host slots=N'")
    p.add_argument("-p", "--ssh-port", type=int, help="ssh port of the remote hosts")
    p.add_argument("-i", "--ssh-identity-file", help="ssh identity file for the remote hosts")
    p.add_argument("--start-timeout", type=float, default=30.0,
                   help="seconds within which every host must answer and the job must start (default 30)")
    p.add_argument("--network-interface", "--network-interfaces", dest="nics",
                   help="comma-separated interfaces for the job's traffic (e.g. eth0)")
    p.add_argument("--output-filename", help="mpirun: write each rank's output under this folder")
    p.add_argument("--verbose", action="store_true", help="print the launch command and host checks")
    p.add_argument("--check-build", action="store_true", help="print what this build of gradcomp has and exit")
    p.add_argument("--mpi-args", default="", help="extra arguments for mpirun (one string)")
    p.add_argument("--timeout", type=float, default=0.0, help="kill the job after this many seconds (0: never)")
    ctl = p.add_mutually_exclusive_group()
    ctl.add_argument("--mpi", action="store_true", help="launch with Open MPI's mpirun (the default)")
    ctl.add_argument("--gloo", action="store_true",
                     help="launch with gradcomprun's own TCP rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
                          "for torch.distributed/gloo; gradcomp's 'torch' backend)")
    el = p.add_argument_group("elastic (torchrun's elastic agent, docs/elastic.md)")
    el.add_argument("--min-np", type=int, help="minimum number of processes")
    el.add_argument("--max-np", type=int, help="maximum number of processes")
    el.add_argument("--host-discovery-script", help="prints the available hosts, one 'host:slots' per line")
    el.add_argument("--slots-per-host", "--slots", dest="slots", type=int,
                    help="slots of a discovered host that prints no ':slots'")
    el.add_argument("--reset-limit", type=int, default=3, help="restarts of the workers allowed (default 3)")
    el.add_argument("--elastic-timeout", type=float, default=600.0,
                    help="seconds to wait for --min-np processes (default 600)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    return p


def _known_flags(p):
    return [s for a in p._actions for s in a.option_strings]


def parse(argv):
    """The parsed arguments, with .hosts = [(host, slots)] and .np resolved; UsageError for a bad command line."""
    p = parser()

    def fail(message):
        raise UsageError(message)
    p.error = fail
    a = p.parse_args(argv)
    if a.version or a.check_build:
        return a
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    if a.command and a.command[0].startswith("-"):
        close = difflib.get_close_matches(a.command[0], _known_flags(p), n=1)
        raise UsageError(f"unknown flag '{a.command[0]}'" + (f" (did you mean '{close[0]}'?)" if close else "") +
                         "; see gradcomprun --help")
    if not a.command:
        raise UsageError("no command to run (e.g. gradcomprun -np 2 python train.py)")
    a.elastic = a.min_np is not None or a.max_np is not None or a.host_discovery_script is not None
    try:
        _resolve_hosts(a)
    except HostError as e:
        raise UsageError(str(e)) from e
    return a


def _resolve_hosts(a):
    if a.hosts and a.hostfile:
        raise UsageError("-H and --hostfile exclude each other")
    if a.elastic:
        if not a.host_discovery_script and not a.hosts and not a.hostfile:
            raise UsageError("elastic mode needs --host-discovery-script (or -H/--hostfile)")
        if a.gloo or a.mpi:
            raise UsageError("elastic mode runs on torchrun's agent; --mpi/--gloo do not apply")
        a.min_np = a.min_np or a.np or 1
        a.max_np = a.max_np or a.np or a.min_np
        if a.min_np < 1 or a.max_np < a.min_np:
            raise UsageError(f"need 1 <= --min-np ({a.min_np}) <= --max-np ({a.max_np})")
        a.hosts = parse_hosts(a.hosts) if a.hosts else parse_hostfile(a.hostfile) if a.hostfile else None
        return
    a.hosts = parse_hosts(a.hosts) if a.hosts else parse_hostfile(a.hostfile) if a.hostfile else None
    if a.hosts is None:
        if a.np is None:
            raise UsageError("-np is required without -H/--hostfile")
        a.hosts = [("localhost", a.np)]
    slots = sum(s for _, s in a.hosts)
    a.np = slots if a.np is None else a.np
    if a.np < 1:
        raise UsageError(f"-np must be >= 1, got {a.np}")
    if a.np > slots:
        raise UsageError(f"-np {a.np} is more than the {slots} slots of the hosts "
                         f"({','.join(f'{h}:{s}' for h, s in a.hosts)})")


def assign(hosts, np_):
    """[(host, local_rank, local_size, host_index)] for ranks 0..np-1, filling each host's slots in order."""
    placed = []
    for index, (host, slots) in enumerate(hosts):
        take = min(slots, np_ - len(placed))
        placed += [(host, lr, take, index) for lr in range(take)]
        if len(placed) == np_:
            break
    return placed
