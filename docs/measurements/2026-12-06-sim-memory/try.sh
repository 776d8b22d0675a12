#!/usr/bin/env bash
# try.sh EXTRA_CFG: the 2x8 transformer row (sim_fp16 flat) with one extra smpirun --cfg (or none)
cd /work/main
p=/work/simmem/p2x8.xml
env GRADCOMP_SIM_DEBUG=${DBG:-} ${OWN:+GRADCOMP_SIM_SMPI_ALLREDUCE=1} GRADCOMP_LOCAL_SIZE=8 GRADCOMP_SIM_SHARED_BYTES=1048576 timeout ${T:-60} bench/sim/tmpfs.sh smpirun -np 16 -platform $p -hostfile ${p%.xml}.hosts \
  build-sim/allreduce_perf.so --cfg=smpi/test:0 --cfg=smpi/wtime:0 --cfg=smpi/coll-selector:ompi --cfg=smpi/bcast:scatter_rdb_allgather \
  --cfg=smpi/host-speed:1Gf --cfg=smpi/shared-malloc-blocksize:33554432 --log=root.thres:warning $1 \
  -- --cfg=smpi/simulate-computation:no --bytes ${BYTES:-5200000000} --rows 40000 --iters 1 --no-check \
  --baseline "sim_none:gbps=1000" --specs "sim_fp16:gbps=1000" --json
