#!/usr/bin/env bash
# Emulates a cluster of HOSTS machines on this one (root needed): one network namespace per host, each joined by a
# veth pair to a bridge in a namespace of its own, each host's uplink rate-limited with tbf, then launches PROGRAM on
# RANKS_PER_HOST ranks per host with Open MPI (or torchrun per host). Ranks of one host talk over that host's
# loopback (unshaped, as shared memory would be); ranks of different hosts over the bridge, at RATE per host.
#
# usage: bench/net/cluster.sh HOSTS RANKS_PER_HOST [--link RATE] [--launcher mpi|torch] [--mpi-arg ARG]...
#                             [--timeout SECONDS] [--keep] -- PROGRAM [ARGS...]
#   --link RATE      each host's uplink (tc rate: 1gbit, 100mbit, ...; default 1gbit); "none": unshaped
#   --launcher L     mpi (default): one mpirun over all hosts (orted started in each host's namespace);
#                    torch: torchrun per host (--nnodes HOSTS --nproc-per-node RANKS_PER_HOST, rendezvous on host 0)
#   --mpi-arg ARG    one more argument for mpirun (repeatable), e.g. --mpi-arg -x --mpi-arg PYTHONPATH
#   --timeout S      stop the launch after S seconds, showing what still ran (exit 124); 0 = no limit (default)
#   --keep           print the namespaces and wait for Enter before tearing down (debugging)
#   -h, --help       this text
# Environment: PYTHON (the interpreter that runs torchrun; default python3).
# Host h is namespace gc-h<h>-<PID> with address 10.77.<PID % 200>.<h + 1>/24 on its veth; the bridge lives in
# gc-br-<PID>. Every rank sees GRADCOMP_LOCAL_SIZE=RANKS_PER_HOST (gradcomp's hierarchical mode then takes one node
# per host) and GRADCOMP_CLUSTER_HOST=<h>; torchrun's workers also GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME=eth0. Everything is deleted on exit, failure or Ctrl-C; the exit status is the
# launcher's; 3 when the emulated hosts cannot reach host 0 over the bridge within 20 s (checked with TCP before the
# launch; what the network looked like is printed). Example (2 hosts x 2 ranks, 1 Gbit/s between hosts):
#   bench/net/cluster.sh 2 2 --link 1gbit -- build/bench/comm/allreduce_perf --hierarchical --bytes 64M
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
[ $# -ge 2 ] || { usage >&2; exit 2; }
hosts=$1 per_host=$2; shift 2
[[ "$hosts" =~ ^[1-9][0-9]*$ && "$hosts" -le 16 ]] || { echo "cluster.sh: HOSTS must be 1..16, got '$hosts'" >&2; exit 2; }
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: RANKS_PER_HOST must be >= 1, got '$per_host'" >&2; exit 2; }
rate=1gbit launcher=mpi keep=0 limit=0 mpi_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --link) rate=${2:?--link needs a rate}; shift 2 ;;
    --launcher) launcher=${2:?--launcher needs mpi or torch}; shift 2 ;;
    --mpi-arg) mpi_args+=("${2:?--mpi-arg needs a value}"); shift 2 ;;
    --timeout) limit=${2:?--timeout needs seconds}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "cluster.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ $# -ge 1 ] || { echo "cluster.sh: no PROGRAM given after --" >&2; exit 2; }
[ "$launcher" = mpi ] || [ "$launcher" = torch ] || { echo "cluster.sh: --launcher must be mpi or torch" >&2; exit 2; }
[[ "$limit" =~ ^[0-9]+$ ]] || { echo "cluster.sh: --timeout must be whole seconds, got '$limit'" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "cluster.sh: must run as root (ip netns, tc)" >&2; exit 2; }

id=$$
subnet="10.77.$(( id % 200 ))"
bridge_ns="gc-br-$id"
host_ns() { echo "gc-h$1-$id"; }
work=$(mktemp -d "/tmp/gradcomp-cluster-$id.XXXX")

cleanup() {
  local h ns
  for h in $(seq 0 $(( hosts - 1 ))); do
    ns=$(host_ns "$h")
    # Whatever a timed-out or failed launch left running in the host (daemons, ranks) goes with it.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip netns del "$bridge_ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The bucket: 4 ms at the rate, at least 2 x a 64 KiB segment (as shaped.sh).
burst_for() {
  python3 - "$1" <<'PY'
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(bit|bps)?", sys.argv[1].lower())
if not m:
    sys.exit("cluster.sh: cannot parse rate '%s' (use e.g. 1gbit, 100mbit)" % sys.argv[1])
bps = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)] * (8 if m.group(3) == "bps" else 1)
print(max(131072, int(bps / 8 / 250)))
PY
}
[ "$rate" = none ] || burst=$(burst_for "$rate")

ip netns add "$bridge_ns"
ip netns exec "$bridge_ns" ip link set lo up
ip netns exec "$bridge_ns" ip link add br0 type bridge
ip netns exec "$bridge_ns" ip link set br0 up
for h in $(seq 0 $(( hosts - 1 ))); do
  ns=$(host_ns "$h")
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  # Created in the host's namespace, its peer moved to the bridge's: names never touch the root namespace.
  ip netns exec "$ns" ip link add eth0 type veth peer name "p$h" netns "$bridge_ns"
  ip netns exec "$ns" ip addr add "$subnet.$(( h + 1 ))/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$bridge_ns" ip link set "p$h" master br0
  ip netns exec "$bridge_ns" ip link set "p$h" up
  if [ "$rate" != none ]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
  fi
done
echo "[cluster] $hosts hosts x $per_host ranks, uplinks ${rate}, subnet $subnet.0/24, namespaces gc-h*-$id" >&2

# Every host must reach host 0 (where mpirun or the rendezvous runs) before the launch: a fresh link may need a
# moment, and a network that never passes traffic would leave the launcher waiting for daemons that cannot call home.
if [ "$hosts" -gt 1 ]; then
  probe_port=$(( 20000 + id % 1000 ))
  ip netns exec "$(host_ns 0)" python3 "$here/reach.py" listen "$subnet.1" "$probe_port" 25 &
  listener=$!
  unreachable=()
  for h in $(seq 1 $(( hosts - 1 ))); do
    ip netns exec "$(host_ns "$h")" python3 "$here/reach.py" connect "$subnet.1" "$probe_port" 20 || unreachable+=("$h")
  done
  kill "$listener" 2>/dev/null || true; wait "$listener" 2>/dev/null || true
  if [ ${#unreachable[@]} -gt 0 ]; then
    {
      echo "cluster.sh: hosts ${unreachable[*]} cannot reach host 0 ($subnet.1) over the emulated network; not launching."
      echo "  what the network looks like:"
      ip netns exec "$bridge_ns" ip -br link 2>&1 | sed 's/^/  bridge: /'
      ip netns exec "$bridge_ns" sysctl net.bridge.bridge-nf-call-iptables 2>&1 | sed 's/^/  bridge: /'
      for h in 0 "${unreachable[@]}"; do
        ip netns exec "$(host_ns "$h")" ip -br addr 2>&1 | sed "s/^/  host $h: /"
        ip netns exec "$(host_ns "$h")" ip neigh 2>&1 | sed "s/^/  host $h neigh: /"
      done
    } >&2
    exit 3
  fi
fi
if [ $keep -eq 1 ]; then
  ip netns list | grep -- "-$id" >&2
  read -r -p "[cluster] press Enter to launch " _ </dev/tty || true
fi

export GRADCOMP_LOCAL_SIZE=$per_host
# --timeout: a watchdog that, when the time is up, shows what still runs in each host, then ends it (TERM, KILL 10 s
# later); the launchers run inside the namespaces, so they end with it.
signal_hosts() {
  local h
  for h in $(seq 0 $(( hosts - 1 ))); do ip netns pids "$(host_ns "$h")" 2>/dev/null | xargs -r kill "-$1" 2>/dev/null || true; done
}
watchdog() {
  sleep "$limit"
  echo "cluster.sh: the launch did not finish within --timeout $limit s; what was still running in each host:" >&3
  local h pids
  for h in $(seq 0 $(( hosts - 1 ))); do
    pids=$(ip netns pids "$(host_ns "$h")" 2>/dev/null | paste -sd, -)
    [ -z "$pids" ] || ps -o pid=,stat=,etime=,args= -p "$pids" 2>/dev/null | cut -c1-160 | sed "s/^/  host $h: /" >&3
  done
  : >"$work/timed-out"
  signal_hosts TERM; sleep 10; signal_hosts KILL
}
watchdog_pid=""
# (its report on fd 3; its own stderr, where bash says "Terminated" when it is stopped early, is dropped)
[ "$limit" -eq 0 ] || { watchdog 3>&2 2>/dev/null & watchdog_pid=$!; }
status=0
if [ "$launcher" = mpi ]; then
  # Open MPI starts one orted per host through this "remote shell": it enters the host's namespace.
  cat >"$work/rsh" <<EOF
#!/bin/sh
# usage: rsh [options] HOST COMMAND... (as Open MPI calls ssh); HOST is h<index>. The orted runs in the foreground
# (its --daemonize dropped): a daemonized orted that dies before calling home leaves mpirun waiting forever, one in
# the foreground ends this process, and mpirun reports the failure.
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
# Shared memory inside a host, in a folder of its own (the segments are named by hostname and local rank, which
# the emulated hosts share).
mkdir -p "$work/shm-\$host"
exec ip netns exec "gc-\$host-$id" env GRADCOMP_CLUSTER_HOST="\${host#h}" \
  OMPI_MCA_btl_vader_backing_directory="$work/shm-\$host" sh -c "\$(echo "\$*" | sed 's/ --daemonize / /')"
EOF
  chmod +x "$work/rsh"
  : >"$work/hostfile"
  for h in $(seq 0 $(( hosts - 1 ))); do echo "h$h slots=$per_host" >>"$work/hostfile"; done
  set +e
  for attempt in 1 2; do
    # stdout as it is; stderr also kept in mpirun.err (a pipeline, so tee has written all of it before it is read)
    { ip netns exec "$(host_ns 0)" mpirun --allow-run-as-root --oversubscribe --bind-to none \
        -np $(( hosts * per_host )) --hostfile "$work/hostfile" --map-by slot \
        --mca plm_rsh_agent "$work/rsh" --mca plm_rsh_no_tree_spawn 1 --mca rtc_hwloc_vmhole none \
        --mca btl self,vader,tcp --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
        -x GRADCOMP_LOCAL_SIZE -x PATH "${mpi_args[@]}" "$@" 2>&1 >&3 3>&- | tee "$work/mpirun.err" >&2 3>&-
      status=${PIPESTATUS[0]}; } 3>&1
    # A daemon that did not start (ORTE's own error, before any rank ran) is retried once; a failing program is not.
    # (rtc_hwloc_vmhole none above: an orted sharing its hwloc topology through shared memory mapped at a "VM hole"
    # segfaulted in hwloc_shmem_topology_write on both attempts of one CI run; without the share, each rank reads the
    # topology itself.)
    if [ $status -ne 0 ] && [ $attempt -eq 1 ] && [ ! -e "$work/timed-out" ] &&
       grep -qE "unable to reliably start|failed to start|lost communication with a remote daemon|internal error has occurred in ORTE" "$work/mpirun.err"; then
      echo "cluster.sh: Open MPI could not start its daemons on every host (above); launching again" >&2
      sleep 1
      continue
    fi
    break
  done
  set -e
else
  port=$(( 29500 + id % 1000 ))
  pids=()
  for h in $(seq 0 $(( hosts - 1 ))); do
    ip netns exec "$(host_ns "$h")" env GRADCOMP_CLUSTER_HOST="$h" GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 \
      "${PYTHON:-python3}" -m torch.distributed.run --nnodes "$hosts" --node_rank "$h" --nproc_per_node "$per_host" \
      --master_addr "$subnet.1" --master_port "$port" \
      --redirects 1 --tee 1 --log_dir "$work/torch-logs-$h" "$@" &  # (torch 1.13 on Python 3.11 cannot parse the
                                                                    # default redirects "0"; 1 = stdout, teed)
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
  done
fi
if [ -n "$watchdog_pid" ]; then
  pkill -P "$watchdog_pid" 2>/dev/null || true; kill "$watchdog_pid" 2>/dev/null || true; wait "$watchdog_pid" 2>/dev/null || true
fi
[ ! -e "$work/timed-out" ] || status=124
exit $status
