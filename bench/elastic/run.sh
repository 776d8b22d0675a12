#!/usr/bin/env bash
# Elastic training benchmark (issue 18): Fashion-MNIST, bench/accuracy's --full CNN (20 epochs, all 60,000 images,
# per-rank batch 32, plain SGD lr 0.2), top-k 1% with error feedback, 4 torchrun nodes on this machine (min 2, max
# 4); rank 3's node is killed (SIGKILL) in the middle of epoch 2, a replacement joins at epoch 4; then the same run
# without faults. Prints and writes <out>/summary.json: time from the kill to the first step on 3 ranks, steps lost,
# the join's cost, final test accuracy vs the run without faults. Extra arguments go to bench.py, e.g. a short run:
#   bench/elastic/run.sh --out /tmp/el --epochs 5 --train-subset 4000 --commit-every 5
# Needs a build with Python (PYTHONPATH=<build>/python) and Debian's dataset-fashion-mnist.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${PYTHON:=${here}/../../.venv/bin/python}"
export OMP_NUM_THREADS=1
exec "$PYTHON" "$here/bench.py" "$@"
