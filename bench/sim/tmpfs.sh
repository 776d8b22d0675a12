#!/usr/bin/env bash
# Runs COMMAND with /tmp on a private tmpfs (a mount namespace of its own; root only, else /tmp as it is, with a note).
# SMPI keeps the file behind its folded (shared) buffers in /tmp: on a disk-backed /tmp every first write to a folded
# page costs a filesystem fault and its writeback, which made a 64-rank run of 100 MB gradients I/O-bound. The tmpfs
# backs files with 2 MiB pages where the kernel allows (huge=always): SMPI maps that file into every folded
# allocation and populates the mapping, a page directory entry per 2 MiB instead of 512 page table entries.
# usage: bench/sim/tmpfs.sh COMMAND [ARGS...]
set -euo pipefail
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null && unshare -m --propagation private true 2>/dev/null; then
  exec unshare -m --propagation private sh -c '{ mount -t tmpfs -o size=4g,huge=always gradcomp-sim /tmp 2>/dev/null ||
    mount -t tmpfs -o size=4g gradcomp-sim /tmp; } && exec "$@"' sh "$@"
fi
echo "[sim] /tmp stays as it is (needs root and unshare): folded buffers may be slow" >&2
exec "$@"
