#!/usr/bin/env python3
"""Reachability probe for bench/net/cluster.sh: does TCP cross the emulated network between two hosts?

usage: reach.py listen ADDR PORT SECONDS     accept connections on ADDR:PORT until SECONDS have passed
       reach.py connect ADDR PORT SECONDS    retry connecting to ADDR:PORT until it answers (exit 0) or SECONDS
                                             have passed (exit 1, saying what the last attempt got)

A freshly made veth/bridge may take a moment to pass traffic; the launcher must not start before it does, and a
network that never does must be reported, not left to hang an mpirun whose daemons cannot call home.
"""
import socket
import sys
import time


def listen(addr, port, seconds):
    deadline = time.monotonic() + seconds
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((addr, port))
        server.listen(16)
        while (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except socket.timeout:
                break
            conn.sendall(b"ok")
            conn.close()
    return 0


def connect(addr, port, seconds):
    deadline = time.monotonic() + seconds
    last = "no attempt"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1.0) as conn:
                if conn.recv(2) == b"ok":
                    return 0
                last = "connected, but no answer"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    print(f"reach.py: {addr}:{port} not reachable within {seconds:g} s (last attempt: {last})", file=sys.stderr)
    return 1


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) != 5 or argv[1] not in ("listen", "connect"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    mode, addr, port, seconds = argv[1], argv[2], int(argv[3]), float(argv[4])
    return listen(addr, port, seconds) if mode == "listen" else connect(addr, port, seconds)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
