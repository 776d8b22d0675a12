"""Hosts and slots for gradcomprun, as horovodrun reads them: `-H host1:2,host2:2` (a host without ":slots" has one
slot), a hostfile of lines "host slots=N" (or "host:N"; # comments), and the reachability check of remote hosts
(ssh, all hosts at once, within --start-timeout)."""
import socket
import subprocess
import time


class HostError(Exception):
    """A bad host list, or hosts that cannot be reached; the message is for the user."""


def parse_hosts(text):
    """[(host, slots)] from "host1:2,host2:2"."""
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        host, _, slots = item.partition(":")
        if not host or (slots and not slots.isdigit()) or slots == "0":
            raise HostError(f"bad host '{item}' in '{text}': expected host or host:slots (slots >= 1)")
        out.append((host, int(slots) if slots else 1))
    if not out:
        raise HostError(f"no hosts in '{text}'")
    return out


def parse_hostfile(path):
    """[(host, slots)] from a hostfile: "host slots=N", "host:N" or "host" per line."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise HostError(f"cannot read the hostfile {path}: {e}") from e
    items = []
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) == 2 and parts[1].startswith("slots="):
            items.append(f"{parts[0]}:{parts[1][6:]}")
        elif len(parts) == 1:
            items.append(parts[0])
        else:
            raise HostError(f"{path}:{n}: expected 'host slots=N', got '{line}'")
    return parse_hosts(",".join(items))


def is_local(host):
    if host in ("localhost", "127.0.0.1", "::1"):
        return True
    names = {socket.gethostname(), socket.getfqdn()}
    return host in names


def ssh_command(host, port, connect_timeout):
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
           f"ConnectTimeout={max(int(connect_timeout), 1)}"]
    if port:
        cmd += ["-p", str(port)]
    return cmd + [host]


def check_reachable(hosts, ssh_port, timeout_s, verbose=False):
    """Every remote host answers `ssh host true` within timeout_s seconds (checked in parallel; a host that has not
    answered by then is killed and counted unreachable). Raises HostError naming each unreachable host."""
    remote = [h for h, _ in hosts if not is_local(h)]
    if not remote:
        return
    procs = {}
    for h in remote:
        cmd = ssh_command(h, ssh_port, timeout_s) + ["true"]
        if verbose:
            print("gradcomprun: checking", " ".join(cmd), flush=True)
        try:
            procs[h] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        except FileNotFoundError as e:
            raise HostError(f"cannot check remote hosts {', '.join(remote)}: no ssh client ({e})") from e
    deadline = time.monotonic() + timeout_s
    failed = []
    for h, p in procs.items():
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            if p.returncode != 0:
                err = p.stderr.read().decode(errors="replace").strip().splitlines()
                failed.append(f"{h} (ssh exit {p.returncode}{': ' + err[-1] if err else ''})")
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            failed.append(f"{h} (no answer within {timeout_s:g} s)")
    if failed:
        raise HostError(f"unreachable host(s): {'; '.join(failed)}. Check the names, --ssh-port and passwordless "
                        "ssh, or raise --start-timeout")
