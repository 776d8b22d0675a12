#!/usr/bin/env bash
# The MLP's gradcomp none row alone, as bench/peers/horovod.sh runs it, with the runtime's lanes set and the
# environment's GRADCOMP_PARTITION_BYTES / GRADCOMP_TIMELINE passed to the ranks (unset: the defaults).
# usage: run_direct.sh LANES [LINK: none | 1gbit | 10gbit ...] [STEPS]   (from anywhere; prints the JSON row)
set -euo pipefail
cd "$(dirname "$0")/../../.."
lanes=$1 link=${2:-none} steps=${3:-8}
prog=(.venv/bin/python bench/peers/peer_train.py --framework gradcomp --model mlp --compression none --steps "$steps"
      --warmup 2 --label "$link")
cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 -x PYTHONPATH
     -x GRADCOMP_PIPELINE_LANES="$lanes" -x GRADCOMP_TIMELINE -x GRADCOMP_PARTITION_BYTES "${prog[@]}")
export PYTHONPATH=$PWD/build/python
if [ "$link" = none ]; then
  OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo "${cmd[@]}" 2>&1 | grep '^{'
else
  bench/net/shaped.sh "$link" -- "${cmd[@]}" 2>&1 | grep '^{'
fi
