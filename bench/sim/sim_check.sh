#!/usr/bin/env bash
# CTest sim_hierarchical_2x2 (label sim): gradcomp's allreduce on the simulated 2 x 2 cluster (bench/sim/platforms/
# emulated-2x2-1gbit.xml, nodes of 2 ranks), the real CPU codecs, every result checked as the MPI tests check theirs:
#   - flat: every codec's result against the reference rebuilt from what every rank's compressor sends (#wrong 0);
#   - hierarchical (node sum, leaders' allreduce, broadcast; our ring inside each node from 1 MiB): none against the
#     exact average, every codec's result bit-identical on all ranks;
#   - and the clock is simulated: 4 MiB dense between the two hosts cannot beat their 1 Gbit/s uplinks;
#   - folded (modeled codecs, GRADCOMP_SIM_SHARED_BYTES): the flat dense allreduce of 64 MiB between the hosts, which
#     the shims run as Rabenseifner messages in the folded buffer, takes the same simulated time as SMPI's own rab_rdb
#     (GRADCOMP_SIM_SMPI_ALLREDUCE=1), Open MPI's choice there.
# allreduce_perf exits 1 on any wrong element or ranks that disagree. usage: sim_check.sh build-sim/allreduce_perf.so
set -euo pipefail
so=$1
here=$(cd "$(dirname "$0")" && pwd)
platform=$here/platforms/emulated-2x2-1gbit.xml
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for mode in flat hierarchical; do
  flag=""; [ $mode = hierarchical ] && flag=--hierarchical
  # shellcheck disable=SC2086
  GRADCOMP_LOCAL_SIZE=2 timeout 240 smpirun -np 4 -platform "$platform" -hostfile "${platform%.xml}.hosts" "$so" \
    --cfg=smpi/test:0 --cfg=smpi/wtime:0 --cfg=smpi/coll-selector:ompi --cfg=smpi/bcast:scatter_rdb_allgather --cfg=smpi/host-speed:1Gf \
    --log=root.thres:warning $flag --min-bytes 4K --max-bytes 4M --factor 32 --iters 1 --json \
    --specs "fp16;qsgd:bits=4;topk:ratio=0.01;dgc:ratio=0.001" >"$out/$mode.jsonl" 2>"$out/$mode.err" \
    || { echo "FAIL: $mode run exited $?"; cat "$out/$mode.jsonl" "$out/$mode.err"; exit 1; }
done
for own in "" 1; do
  env GRADCOMP_LOCAL_SIZE=2 GRADCOMP_SIM_SHARED_BYTES=1048576 ${own:+GRADCOMP_SIM_SMPI_ALLREDUCE=1} timeout 240 smpirun -np 4 \
    -platform "$platform" -hostfile "${platform%.xml}.hosts" "$so" --cfg=smpi/test:0 --cfg=smpi/wtime:0 \
    --cfg=smpi/coll-selector:ompi --cfg=smpi/bcast:scatter_rdb_allgather --cfg=smpi/host-speed:1Gf \
    --cfg=smpi/shared-malloc-blocksize:33554432 --log=root.thres:warning -- --cfg=smpi/simulate-computation:no \
    --bytes 64M --rows 4000 --iters 1 --no-check --baseline "sim_none:gbps=1000" --specs "sim_fp16:gbps=1000" --json \
    >"$out/folded$own.jsonl" 2>"$out/folded$own.err" \
    || { echo "FAIL: folded run (own=$own) exited $?"; cat "$out/folded$own.jsonl" "$out/folded$own.err"; exit 1; }
done
python3 - "$out/flat.jsonl" "$out/hierarchical.jsonl" "$out/folded.jsonl" "$out/folded1.jsonl" <<'PY'
import json, sys
flat = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
hier = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
shim = [json.loads(l) for l in open(sys.argv[3]) if l.startswith("{")]
smpi = [json.loads(l) for l in open(sys.argv[4]) if l.startswith("{")]
problems = []
if len(shim) != 2 or [r["spec"] for r in shim] != [r["spec"] for r in smpi]:
    problems.append(f"folded rows: {len(shim)} with the shims, {len(smpi)} with SMPI's allreduce")
for a, b in zip(shim, smpi):
    if a["time_s"] <= 0 or abs(a["time_s"] - b["time_s"]) > 1e-6 * b["time_s"]:
        problems.append(f"folded {a['spec']}: {a['time_s']} s with the shims' Rabenseifner, {b['time_s']} s with SMPI's")
if len(flat) < 10 or len(hier) < 10:
    problems.append(f"expected every spec at 2 sizes, got {len(flat)} flat and {len(hier)} hierarchical rows")
for r in flat:
    if r["wrong"] != 0 or r["identical"] is not True:
        problems.append(f"flat {r['spec']} {r['bytes']} B: wrong {r['wrong']}, identical {r['identical']}")
for r in hier:
    if r["identical"] is not True or r["wrong"] > 0 or (r["spec"] == "none" and r["wrong"] != 0):
        problems.append(f"hierarchical {r['spec']} {r['bytes']} B: wrong {r['wrong']}, identical {r['identical']}")
    if not r["algorithm"] or r["time_s"] <= 0:
        problems.append(f"hierarchical {r['spec']}: no time")
# 4 MiB summed over the two hosts: each leader sends at least half of it through a 125 MB/s uplink.
big = [r for r in hier if r["spec"] == "none" and r["bytes"] == 4 << 20]
if not big or big[0]["time_s"] < (2 << 20) / 125e6:
    problems.append(f"4 MiB hierarchical none took {big[0]['time_s'] if big else None} s: not simulated time")
for p in problems:
    print("FAIL:", p)
print(f"{len(flat)} flat and {len(hier)} hierarchical rows checked" if not problems else "")
sys.exit(1 if problems else 0)
PY
