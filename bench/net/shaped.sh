#!/usr/bin/env bash
# Runs a command in a fresh network namespace whose loopback is rate-limited with tc, to emulate a slow link on one
# machine (root needed). All ranks of an mpirun inside share that one loopback: its rate is the aggregate link.
#
# usage: bench/net/shaped.sh RATE [--delay DELAY] [--burst BYTES] [--keep-mca] -- CMD [ARGS...]
#   RATE          tc rate: 1gbit, 10gbit, 500mbit, ...
#   --delay D     add a one-way netem delay on the loopback (100us, 1ms, ...); needs the sch_netem qdisc
#   --burst B     tbf bucket size in bytes (default: 4 ms at RATE, at least 2 x the 64 KiB loopback MTU)
#   --keep-mca    do not set OMPI_MCA_* (by default MPI is pinned to TCP over lo: btl self,tcp, if_include lo)
#   -h, --help    this text
# The namespace (gradcomp-shaped-PID) is always deleted afterwards, also on failure or Ctrl-C. The exit status is the
# command's. Example:
#   bench/net/shaped.sh 1gbit -- mpirun --allow-run-as-root -np 4 build/bench/comm/allreduce_perf --bytes 100M
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
rate=$1; shift
delay=""; burst=""; keep_mca=0
while [ $# -gt 0 ]; do
  case "$1" in
    --delay) delay=${2:?--delay needs a value}; shift 2 ;;
    --burst) burst=${2:?--burst needs a value}; shift 2 ;;
    --keep-mca) keep_mca=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "shaped.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ $# -ge 1 ] || { echo "shaped.sh: no command given after --" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "shaped.sh: must run as root (ip netns, tc)" >&2; exit 2; }

# RATE -> bits per second, to size the bucket.
rate_bps=$(python3 - "$rate" <<'PY'
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(bit|bps)?", sys.argv[1].lower())
if not m:
    sys.exit("shaped.sh: cannot parse rate '%s' (use e.g. 1gbit, 500mbit)" % sys.argv[1])
value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
if m.group(3) == "bps":
    value *= 8  # tc's "bps" is bytes per second
print(int(value))
PY
)
if [ -z "$burst" ]; then
  burst=$(( rate_bps / 8 / 250 ))
  [ "$burst" -ge 131072 ] || burst=131072
fi

ns="gradcomp-shaped-$$"
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" tc qdisc add dev lo root handle 1: tbf rate "$rate" burst "$burst" latency 100ms
if [ -n "$delay" ]; then
  if ! ip netns exec "$ns" tc qdisc add dev lo parent 1:1 handle 10: netem delay "$delay" 2>/tmp/shaped-netem.$$; then
    echo "shaped.sh: cannot add a netem delay: $(cat /tmp/shaped-netem.$$) (this kernel lacks sch_netem?)" >&2
    rm -f /tmp/shaped-netem.$$
    exit 3
  fi
  rm -f /tmp/shaped-netem.$$
fi
echo "[shaped] namespace $ns: lo at $rate (burst $burst B)${delay:+, delay $delay}" >&2

if [ $keep_mca -eq 0 ]; then
  export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
fi
set +e
ip netns exec "$ns" "$@"
status=$?
set -e
exit $status
