#!/usr/bin/env bash
# gradcomp's GPU check: what the first device call runs (docs/cuda.md, "The first device run"). Under one deadline
# (default 540 s), in this order, each step under its own timeout:
#   setup      unpack the dependency prefix that bench/gpu/prepare.sh made (.gpu-deps/prefix.tar.gz: fmt, GoogleTest,
#              Google Benchmark, OpenBLAS, Open MPI); find nvidia-smi, nvcc, cmake, ninja, python3 with torch and
#              nanobind, and NCCL in that python's nvidia-nccl-cu13 wheel
#   configure  CUDA for the GPU's architecture, MPI, NCCL, the Python module, tests and benchmarks, without -Werror
#   build      the targets below, 16 jobs
#   proof      the build used the prefix and the wheel, not other copies (CMakeCache, dependency files, the loader)
#   gpu        every gpu test and its CPU half, each under its own timeout
#   sanitize   compute-sanitizer memcheck and racecheck on the codec and device-path tests (sizes up to 100003)
#   python     the Python package on the device's torch: CUDA collectives, the exchange worker, an optimizer step
#   mpi        2 MPI ranks on the one GPU (CUDA tensors staged through MPI: GRADCOMP_DEVICE_COMM=none)
#   bench      compressors_bench_cuda (64M floats and top-k on 25M), torch.topk (25M), device_path_bench (#wrong)
#   profile    Nsight Compute: time and DRAM throughput of every kernel of fp16, terngrad, onebit, top-k and block
#              top-k on 25M floats (profile.csv; not in a dry run)
# A step that no longer fits the deadline is NOT RUN, which the summary says; run it in a second call with --only
# (setup always runs; a build whose build-gpu/ is still there, on a machine still warm, only checks it is up to date).
# Results in $OUT (default ./gpu-results), five files: summary.txt, status.tsv, bench.csv, profile.csv, logs.tar.gz
# (every log).
#
# --dry-run (any machine, as root): the same setup, configure, build and proof with this machine's fmt, GoogleTest,
# Google Benchmark, OpenBLAS headers, Open MPI and NCCL out of reach (bench/gpu/hide_system_deps.sh); the steps that
# need a GPU run their no-GPU path (a gpu test skips with 77, the Python CUDA test skips, the MPI ranks step on CPU
# tensors) and the time budget is printed.
#
# usage: bench/gpu/check.sh [--dry-run] [--deadline S] [--jobs N] [--only STEP[,STEP...]] [--build-dir D]
#                           [--deps FILE] [--scale N] [--help]
#   --scale N   every step's time limit times N (a dry run on a machine slower than the device's 16 cores)
# Exit: 0 every step passed; 1 a test, sanitizer, Python or MPI run failed, a gpu test skipped on a GPU machine, or
# a benchmark reported #wrong; 2 setup, configure or build failed; 3 no GPU (not with --dry-run); 5 nothing failed
# but a step was NOT RUN for the deadline.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RESULTS=${OUT:-$PWD/gpu-results}
BUILD_DIR="$ROOT/build-gpu"
DEPS="$ROOT/.gpu-deps/prefix.tar.gz"
JOBS=16
DEADLINE=540
DRY=0
ONLY=""
SCALE=1
PYTHON=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --deadline) DEADLINE=$2; shift ;;
    --jobs) JOBS=$2; shift ;;
    --only) ONLY=",$2,"; shift ;;
    --build-dir) BUILD_DIR=$(realpath -m "$2"); shift ;;
    --deps) DEPS=$(realpath -m "$2"); shift ;;
    --scale) SCALE=$2; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ $DRY -eq 1 ] && [ -z "${GRADCOMP_HIDDEN_NS:-}" ]; then
  exec "$ROOT/bench/gpu/hide_system_deps.sh" "$0" --dry-run --deadline "$DEADLINE" --jobs "$JOBS" \
    --build-dir "$BUILD_DIR" --deps "$DEPS" --scale "$SCALE" ${ONLY:+--only "${ONLY:1:${#ONLY}-2}"}
fi
source "$ROOT/bench/gpu/check_lib.sh"
ON_CPU=()  # the Python steps' CPU stand-in in a dry run
[ $DRY -eq 1 ] && ON_CPU=(--cpu)
start_check

# ---- setup (every call) ----------------------------------------------------------------------------------------------
setup_environment || finish 2
# ---- configure + build -----------------------------------------------------------------------------------------------
if wanted build; then
  step configure 120 cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DGRADCOMP_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DGRADCOMP_WITH_MPI=ON -DMPI_C_COMPILER="$PREFIX/usr/bin/mpicc" -DMPIEXEC_EXECUTABLE="$PREFIX/usr/bin/mpirun" \
    -DGRADCOMP_WITH_NCCL=ON -DNCCL_INCLUDE_DIR="$NCCL_INCLUDE" -DNCCL_LIBRARY="$NCCL_LIBRARY" \
    -DGRADCOMP_WITH_PYTHON=ON -DPython_EXECUTABLE="$PYTHON_PATH" -DGRADCOMP_WERROR=OFF \
    -DGRADCOMP_BUILD_TESTS=ON -DGRADCOMP_BUILD_BENCH=ON -DCMAKE_PREFIX_PATH="$PREFIX/usr" || finish 2
  step build 300 cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}" || finish 2
  step proof 30 prove_prefix_used || finish 2
fi
# ---- gpu tests -------------------------------------------------------------------------------------------------------
if wanted gpu; then
  for entry in "${GPU_TESTS[@]}"; do
    read -r name limit <<<"$entry"
    step "gpu.$name" "$limit" "$(test_path "$name")"
  done
fi
# ---- compute-sanitizer -----------------------------------------------------------------------------------------------
if wanted sanitize && [ $DRY -eq 1 ] && ! command -v "$SANITIZER" >/dev/null; then
  record sanitize SKIPPED 0 - "no compute-sanitizer on this machine (dry run; the device image has it)"
elif wanted sanitize; then
  for tool in memcheck racecheck; do
    step "sanitize.$tool.parity" 90 env GRADCOMP_PARITY_MAX_NUMEL=100003 "$SANITIZER" --tool "$tool" \
      --error-exitcode 1 "$(test_path codec_parity_gpu_test)" \
      --gtest_filter='Codecs/Parity.PayloadsAndStateAreBitIdentical/*:Codecs/Parity.CrossDeviceDecode/*'
    # racecheck runs the device path with one rank: with 2 or 3 host threads (ranks) on one GPU it stalls past 60 s
    # in the first test where memcheck takes 0.3 s for all four (2026-12-04, docs/cuda.md "Known limits").
    ranks=$([ "$tool" = racecheck ] && echo 1 || echo 3)
    step "sanitize.$tool.device_path" 90 env GRADCOMP_PARITY_MAX_NUMEL=20011 GRADCOMP_DEVICE_PATH_RANKS=$ranks \
      "$SANITIZER" --tool "$tool" --error-exitcode 1 "$(test_path device_path_gpu_test)" \
      --gtest_filter='Codecs/DevicePath.*/topk*:Codecs/DevicePath.*/randomk*:Codecs/DevicePath.*/qsgd*'
  done
fi
# ---- Python on the device's torch ------------------------------------------------------------------------------------
if wanted python; then
  step python.cuda_collectives 120 "$PYTHON" -m pytest -q -rs -p no:cacheprovider "$ROOT/tests/python/test_cuda_collectives.py"
  step python.exchange_device 60 "$PYTHON" -m pytest -q -p no:cacheprovider "$ROOT/tests/python/test_exchange_device.py"
  step python.optimizer_step 120 "$PYTHON" "$ROOT/bench/gpu/optimizer_step.py" --steps 3 "${ON_CPU[@]}"
fi
# ---- 2 MPI ranks, one GPU ----------------------------------------------------------------------------------------------
if wanted mpi; then
  step mpi.two_ranks_staged 120 env GRADCOMP_DEVICE_COMM=none "$PREFIX/usr/bin/mpirun" "${MPIRUN_FLAGS[@]}" -np 2 \
    "$PYTHON" "$ROOT/bench/gpu/optimizer_step.py" --backend runtime --steps 2 --specs none,topk:ratio=0.01 "${ON_CPU[@]}"
fi
# ---- benchmarks ------------------------------------------------------------------------------------------------------
if wanted bench; then
  if [ $DRY -eq 1 ]; then
    step bench.device_path_cpu 120 "$BUILD_DIR/bench/comm/device_path_bench" --device cpu --numel 2e5 --tensors 4 \
      --steps 1
  else
    step bench.kernels 150 "$BUILD_DIR/bench/kernels/compressors_bench_cuda" --sizes 25M,64M --reps 3 \
      --csv "$RESULTS/bench.csv"
    step bench.torch_topk 60 "$PYTHON" "$ROOT/bench/gpu/torch_topk.py" --numel 25M --ratio 0.01
    step bench.device_path 150 "$BUILD_DIR/bench/comm/device_path_bench" --device cuda --numel 25e6 --tensors 50 \
      --steps 5
  fi
fi
# ---- kernel profile: each kernel's time and DRAM throughput (Nsight Compute) for the codecs below their target ---------
if wanted profile && [ $DRY -eq 0 ]; then
  if [ -n "$NCU" ]; then
    step profile 120 "$NCU" --clock-control none --csv --log-file "$RESULTS/profile.csv" \
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum \
      "$BUILD_DIR/bench/kernels/compressors_bench_cuda" --sizes 25M --reps 1 \
      --specs fp16,terngrad,onebit,topk:ratio=0.01,blocktopk:ratio=0.01
  else
    record profile SKIPPED 0 - "no ncu (Nsight Compute) on this machine"
  fi
fi
finish
