"""gradcomprun's default launcher: Open MPI's mpirun with horovodrun's translation of the flags."""
import os
import shlex
import shutil

from .procs import exported_names, start, wait_all


def command(a):
    """The mpirun argv for parsed arguments `a`."""
    cmd = ["mpirun"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["--tag-output", "-np", str(a.np), "-H", ",".join(f"{h}:{s}" for h, s in a.hosts),
            "--bind-to", "none", "--map-by", "slot"]
    rsh = []
    if a.ssh_port:
        rsh += ["-p", str(a.ssh_port)]
    if a.ssh_identity_file:
        rsh += ["-i", a.ssh_identity_file]
    if rsh:
        cmd += ["-mca", "plm_rsh_args", " ".join(rsh)]
    if a.nics:
        cmd += ["-mca", "btl_tcp_if_include", a.nics, "-mca", "oob_tcp_if_include", a.nics,
                "-x", f"NCCL_SOCKET_IFNAME={a.nics}"]
    if a.output_filename:
        cmd += ["--output-filename", a.output_filename]
    for name in exported_names(os.environ):
        cmd += ["-x", name]
    cmd += shlex.split(a.mpi_args or "")
    return cmd + list(a.command)


def launch(a):
    if shutil.which("mpirun") is None:
        print("gradcomprun: Open MPI's mpirun is not on PATH; install openmpi-bin or launch with --gloo", flush=True)
        return 1
    cmd = command(a)
    if a.verbose:
        print("gradcomprun:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    return wait_all([start(cmd, dict(os.environ))], a.timeout, what="mpirun")
