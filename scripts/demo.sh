#!/usr/bin/env bash
# gradcomp's main job. For now: builds the library and the CLI, lists the compressors and probes each one on a
# synthetic 1M-element gradient. (The compression-vs-accuracy training benchmark replaces this.)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
source scripts/deps.sh
gradcomp_install_debian
export PATH=$PATH:/usr/local/cuda/bin
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j 2 --target gradcomp_cli
build/gradcomp list
for spec in $(build/gradcomp list --json | python3 -c 'import json,sys; print(" ".join(i["name"] for i in json.load(sys.stdin)))'); do
  build/gradcomp probe "$spec" --numel 1000000
done
