#!/usr/bin/env bash
# one.sh NP PLATFORM SPEC: one modeled row of the transformer (5.2 GB), flat, under /usr/bin/time -v, with
# bench/sim/run.sh's flags for that part; LOCAL = ranks per node (default 8), LOG = where the output goes.
cd "$(dirname "$0")/../../.."  # the checkout; build-sim/ from bench/sim/build.sh
np=$1; platform=$2; spec=$3
env GRADCOMP_LOCAL_SIZE=${LOCAL:-8} GRADCOMP_SIM_SHARED_BYTES=1048576 /usr/bin/time -v bench/sim/tmpfs.sh smpirun -np $np -platform $platform -hostfile ${platform%.xml}.hosts \
  build-sim/allreduce_perf.so --cfg=smpi/test:0 --cfg=smpi/wtime:0 --cfg=smpi/coll-selector:ompi --cfg=smpi/bcast:scatter_rdb_allgather \
  --cfg=smpi/host-speed:1Gf --cfg=smpi/shared-malloc-blocksize:33554432 --log=root.thres:warning \
  -- --cfg=smpi/simulate-computation:no --bytes 5200000000 --rows 40000 --iters 1 --no-check \
  --baseline "sim_none:gbps=1000" --specs "$spec" --json > ${LOG:-/tmp/sim-one.log} 2>&1; grep -E "^\{|Maximum resident|Elapsed|User time|rror" ${LOG:-/tmp/sim-one.log} | cut -c1-300
