"""gradcomprun (`python -m gradcomp.run`): horovodrun's command line for gradcomp jobs.

    gradcomprun -np 4 -H host1:2,host2:2 python train.py
    gradcomprun --gloo -np 2 python train.py
    gradcomprun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh python train_elastic.py
    gradcomprun --check-build

Modules: args (the flags), hosts (-H, hostfile, reachability), procs (rank environments, waiting), mpi, gloo and
elastic (the three launchers), check_build."""
import sys

from .args import UsageError, parse, parser
from .hosts import HostError, check_reachable


def main(argv=None):
    """Runs gradcomprun with `argv` (default sys.argv[1:]); returns the exit status (2: bad command line, 1: hosts
    unreachable or nothing to launch with, else the job's)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        a = parse(argv)
    except UsageError as e:
        print(f"gradcomprun: error: {e}", file=sys.stderr, flush=True)
        return 2
    if a.version:
        import gradcomp
        print(gradcomp.__version__)
        return 0
    if a.check_build:
        from .check_build import report
        print(report(), flush=True)
        return 0
    try:
        if a.elastic:
            from . import elastic
            if a.hosts:
                check_reachable(a.hosts, a.ssh_port, a.start_timeout, a.verbose)
            return elastic.launch(a)
        check_reachable(a.hosts, a.ssh_port, a.start_timeout, a.verbose)
    except HostError as e:
        print(f"gradcomprun: error: {e}", file=sys.stderr, flush=True)
        return 1
    if a.gloo:
        from . import gloo
        return gloo.launch(a)
    from . import mpi
    return mpi.launch(a)


__all__ = ["main", "parse", "parser"]
