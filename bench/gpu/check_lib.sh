# shellcheck shell=bash disable=SC2034
# The machinery of bench/gpu/check.sh (sourced by it): the step runner under the deadline, the environment of the
# carried prefix, the proof that the build used it, the time budget and the summary. Uses check.sh's variables (ROOT,
# RESULTS, BUILD_DIR, DEPS, JOBS, DEADLINE, DRY, ONLY, PYTHON).

# Targets of the build step: the library, the tests that use the GPU, the benches, the Python module. (The CPU halves
# of the gpu tests run in every CI build: scripts/test.sh, label cpu.)
TARGETS=(gradcomp cuda_check_test codec_parity_gpu_test stream_order_gpu_test device_path_gpu_test
         lowrank_ops_gpu_test lowrank_products_gpu_test powersgd_gpu_test nccl_communicator_gpu_test payload_checks_gpu_test
         compressors_bench_cuda device_path_bench _gradcomp)
# The gpu step: each test and its own timeout (seconds).
GPU_TESTS=("cuda_check_test 30" "codec_parity_gpu_test 150" "stream_order_gpu_test 60" "device_path_gpu_test 120"
           "lowrank_ops_gpu_test 60" "lowrank_products_gpu_test 60" "powersgd_gpu_test 120"
           "nccl_communicator_gpu_test 90" "payload_checks_gpu_test 60")
MPIRUN_FLAGS=(--allow-run-as-root --oversubscribe --mca plm isolated --mca btl self,tcp --mca pml ob1
              --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -x PYTHONPATH -x LD_LIBRARY_PATH -x OPAL_PREFIX
              -x PMIX_MCA_mca_base_component_path -x GRADCOMP_DEVICE_COMM)
# Expected seconds of each step on an H200 machine (16 cores), for the budget line (docs/cuda.md): the second device
# draw's (2026-12-04; racecheck of the device path with one rank), profile as measured (4-5 s) with room for ncu.
BUDGET=("setup 13" "configure 9" "build 30" "proof 1" "gpu 45" "sanitize 55" "python 30" "mpi 13" "bench 12"
        "profile 30")
RESERVE=8  # seconds kept for the summary and the log tarball

start_check() {
  T0=$(date +%s)
  mkdir -p "$RESULTS"
  LOGS=$(mktemp -d "${TMPDIR:-/tmp}/gradcomp-check-logs.XXXXXX")
  STATUS="$RESULTS/status.tsv"
  printf 'step\tresult\tseconds\tlimit\tdetail\n' > "$STATUS"
  FAILED=0; NOT_RUN=0
  say "gradcomp GPU check$([ $DRY -eq 1 ] && echo ' (dry run: no GPU use)'), $(date -u '+%Y-%m-%d %H:%M UTC')," \
      "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), deadline ${DEADLINE}s"
  local total=0 line=""
  for entry in "${BUDGET[@]}"; do
    read -r name secs <<<"$entry"
    total=$((total + secs))
    line="$line $name ${secs}s,"
  done
  say "budget (expected):${line%,} = ${total}s of ${DEADLINE}s; steps that no longer fit are NOT RUN (--only STEP)"
}

say() { echo "$*" | tee -a "$LOGS/check.log"; }
elapsed() { echo $(( $(date +%s) - T0 )); }
wanted() { [ -z "$ONLY" ] || [[ "$ONLY" == *",$1,"* ]]; }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$STATUS"; say "$(printf '%-34s %-9s %4ss (limit %ss) %s' "$@")"; }

# step NAME LIMIT COMMAND...: runs COMMAND (a shell function too) under min(LIMIT, time left) seconds, output in
# logs/NAME.log. Returns non-zero unless it passed (or skipped with 77 in a dry run).
step() {
  local name=$1 limit=$(( $2 * SCALE ))
  shift 2
  local room=$(( DEADLINE - $(elapsed) - RESERVE ))
  if [ "$room" -lt 15 ] || { [ "$room" -lt "$limit" ] && [ "$room" -lt 60 ]; }; then
    NOT_RUN=$((NOT_RUN + 1))
    record "$name" "NOT RUN" 0 "$limit" "deadline: ${room}s left"
    return 0
  fi
  [ "$limit" -gt "$room" ] && limit=$room
  local start rc
  start=$(date +%s)
  if declare -F "$1" >/dev/null; then
    "$@" > "$LOGS/$name.log" 2>&1 & local pid=$!
    ( sleep "$limit"; kill -TERM "$pid" 2>/dev/null ) & local watchdog=$!
    wait "$pid"; rc=$?
    kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null
    [ $rc -eq 143 ] && rc=124
  else
    timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1; rc=$?
  fi
  local seconds=$(( $(date +%s) - start )) result detail=""
  case $rc in
    0) result=PASS ;;
    124|137) result=TIMEOUT; detail="killed after ${limit}s" ;;
    77) result=SKIPPED; detail=$(grep -m1 -i 'skip' "$LOGS/$name.log" | cut -c1-100) ;;
    *) result=FAIL; detail="exit $rc: $(grep -m1 -E 'FAILED|Error|error|ERROR|Traceback|#wrong' "$LOGS/$name.log" | cut -c1-100)" ;;
  esac
  # A gpu test that skips on a machine with a GPU means the device was unusable: a failure there.
  if [ $result = SKIPPED ] && [ $DRY -eq 0 ]; then result=FAIL; fi
  record "$name" "$result" "$seconds" "$limit" "$detail"
  case $result in PASS|SKIPPED) return 0 ;; *) FAILED=$((FAILED + 1)); return 1 ;; esac
}

test_path() { find "$BUILD_DIR/tests" -maxdepth 2 -type f -name "$1" | head -1; }

# Unpacks the prefix, finds the tools, the GPU and NCCL; exports what the build and the runs need.
setup_environment() {
  local start
  start=$(date +%s)
  WORK=${GRADCOMP_GPU_WORK:-/tmp/gradcomp-gpu}
  PREFIX="$WORK/prefix"
  if [ ! -f "$DEPS" ]; then
    record setup FAIL 0 - "no $DEPS: run bench/gpu/prepare.sh here first and carry .gpu-deps"
    return 1
  fi
  rm -rf "$PREFIX" && mkdir -p "$WORK" && tar -xzf "$DEPS" -C "$WORK" || { record setup FAIL 0 - "cannot unpack $DEPS"; return 1; }
  local lib="$PREFIX/usr/lib/x86_64-linux-gnu"
  export PATH="$PREFIX/usr/bin:/usr/local/cuda/bin:$PATH"
  export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$PREFIX/usr" PMIX_MCA_mca_base_component_path="$lib/pmix2/lib/pmix"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm=isolated
  export PYTHONPATH="$BUILD_DIR/python:$ROOT/tests/python${PYTHONPATH:+:$PYTHONPATH}"
  NVCC=$(command -v nvcc || true)
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null || true)
  PYTHON_PATH=$(command -v "$PYTHON" || true)
  # Absolute, not resolved (a venv's python is a link out of the venv): CMake runs it from the build folder.
  case "$PYTHON_PATH" in ""|/*) ;; *) PYTHON_PATH=$PWD/$PYTHON_PATH ;; esac
  local missing=""
  [ -n "$NVCC" ] || missing="$missing nvcc"
  command -v cmake >/dev/null || missing="$missing cmake"
  command -v ninja >/dev/null || missing="$missing ninja"
  [ -n "$PYTHON_PATH" ] && "$PYTHON" -c "import torch, nanobind" 2>/dev/null || missing="$missing $PYTHON(torch,nanobind)"
  # NCCL from the nvidia-nccl-cu13 wheel of that python (nvidia/nccl/{include,lib}).
  local nccl_dirs
  nccl_dirs=$("$PYTHON" -c "import importlib.util as u; s = u.find_spec('nvidia.nccl'); print(' '.join(s.submodule_search_locations) if s else '')" 2>/dev/null)
  NCCL_INCLUDE=$(for d in $nccl_dirs; do find "$d" -name nccl.h -printf '%h\n'; done 2>/dev/null | head -1)
  NCCL_LIBRARY=$(for d in $nccl_dirs; do find "$d" -name 'libnccl.so*' -type f; done 2>/dev/null | head -1)
  [ -n "$NCCL_INCLUDE" ] && [ -n "$NCCL_LIBRARY" ] || missing="$missing nccl(wheel nvidia-nccl-cu13 of $PYTHON)"
  if [ -n "$missing" ]; then
    record setup FAIL $(( $(date +%s) - start )) - "missing:$missing"
    return 1
  fi
  if [ $DRY -eq 1 ]; then
    ARCH=90
    say "GPU: none used (dry run): sm_90, the H200's architecture"
  else
    local gpu
    gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
    if [ -z "$gpu" ]; then
      record setup FAIL $(( $(date +%s) - start )) - "no GPU: nvidia-smi found none"
      finish 3
    fi
    ARCH=$(echo "$gpu" | cut -d, -f2 | tr -d ' .')
    say "GPU: $gpu -> sm_$ARCH"
    nvidia-smi > "$LOGS/nvidia-smi.log" 2>&1
  fi
  say "tools: $("$NVCC" --version | tail -1); cmake $(cmake --version | head -1 | awk '{print $3}'); $("$PYTHON" -c \
      'import sys, torch, nanobind; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, nanobind {nanobind.__version__}")');" \
      "nccl $NCCL_LIBRARY; compute-sanitizer ${SANITIZER:-missing}; prefix $PREFIX ($(wc -l < "$(dirname "$DEPS")/packages.txt") packages)"
  [ -n "$SANITIZER" ] || SANITIZER=compute-sanitizer
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
  record setup PASS $(( $(date +%s) - start )) - ""
}

# The build used the carried prefix and the wheel's NCCL: the CMake cache points there, no compile read a header of
# another copy, and the loader (without LD_LIBRARY_PATH) resolves the libraries there.
prove_prefix_used() {
  local cache="$BUILD_DIR/CMakeCache.txt" bad=0
  for var in fmt_DIR GTest_DIR benchmark_DIR BLAS_openblas_LIBRARY MPI_C_HEADER_DIR MPI_mpi_LIBRARY MPIEXEC_EXECUTABLE; do
    local value
    value=$(sed -n "s/^$var:[A-Z]*=//p" "$cache")
    if [[ "$value" == "$PREFIX"* ]]; then echo "ok   $var = $value"; else echo "BAD  $var = '$value'"; bad=1; fi
  done
  for var in NCCL_INCLUDE_DIR NCCL_LIBRARY; do
    local value
    value=$(sed -n "s/^$var:[A-Z]*=//p" "$cache")
    if [ "$value" = "$NCCL_INCLUDE" ] || [ "$value" = "$NCCL_LIBRARY" ]; then echo "ok   $var = $value"; else
      echo "BAD  $var = '$value'"; bad=1; fi
  done
  local foreign  # (gradcomp's own sources, comm/mpi/ among them, are not a copy of anything)
  foreign=$(cd "$BUILD_DIR" && ninja -t deps 2>/dev/null | grep -E '^ +/' | grep -v -e "^ *$ROOT/" -e "^ *$BUILD_DIR/" \
              | grep -E '/(fmt|gtest|gmock|benchmark|openmpi|mpi)/|/(mpi|nccl|cblas)\.h$' \
              | grep -v -e "^ *$PREFIX" -e "^ *$NCCL_INCLUDE" | sort -u | head -5)
  if [ -n "$foreign" ]; then echo "BAD  headers from outside the prefix:"; echo "$foreign"; bad=1; else
    echo "ok   every fmt/GoogleTest/Benchmark/MPI/NCCL/CBLAS header came from the prefix or the wheel"; fi
  # The loader in the steps' environment (LD_LIBRARY_PATH as setup_environment set it: Open MPI's own libraries
  # are found through it, not through gradcomp's RUNPATH) resolves every carried library into the prefix or the wheel.
  local resolved module
  module=$(find "$BUILD_DIR/python" -name '_gradcomp*.so' -type f 2>/dev/null | head -1)
  resolved=$(ldd "$BUILD_DIR/libgradcomp.so" "$(test_path cuda_check_test)" ${module:+"$module"} 2>&1 \
               | grep -E 'libfmt|libopenblas|libmpi\.|libopen-(rte|pal)|libpmix|libnccl|not found|error' \
               | sed 's/ (0x[0-9a-f]*)//' | sort -u)
  echo "$resolved" | sed 's/^/     /'
  if ! echo "$resolved" | grep -q 'libmpi\.so.*=> /' || ! echo "$resolved" | grep -q 'libnccl.*=> /'; then
    echo "BAD  ldd resolved no libmpi or no libnccl"; bad=1
  elif echo "$resolved" | grep -v -e "=> $PREFIX" -e "=> $(dirname "$NCCL_LIBRARY")" | grep -q .; then
    echo "BAD  a library resolves outside the prefix and the wheel, or not at all"; bad=1
  else
    echo "ok   every carried library resolves into the prefix or the wheel"
  fi
  [ -n "${GRADCOMP_HIDDEN_PATHS:-}" ] && echo "hidden: $GRADCOMP_HIDDEN_PATHS"
  return $bad
}

# The kernel benchmark against the first device draw's targets (docs/cuda.md): fp16, bf16, qsgd, terngrad, onebit
# compress + decompress at >= 0.70 of the device copy bandwidth measured in the same run; top-k 1% of 25M floats
# >= 3x faster than torch.topk.
bench_table() {
  local torch_ms
  torch_ms=$(sed -n 's/.* ms=\([0-9.]*\).*/\1/p' "$LOGS/bench.torch_topk.log" 2>/dev/null | tail -1)
  echo
  printf '%-28s %10s %10s %10s %8s  %s\n' spec numel comp_ms decomp_ms of_copy target
  # The last 8 fields are numbers; the spec before them may hold commas (quoted or not).
  tail -n +2 "$RESULTS/bench.csv" | awk -F, '{s = $1; for (i = 2; i <= NF - 8; ++i) s = s "," $i; gsub(/"/, "", s);
      print s, $(NF - 7), $(NF - 5), $(NF - 4), $NF}' | while read -r spec numel cms dms frac; do
    local target="-"
    case "${spec%%:*}" in
      fp16|bf16|qsgd|terngrad|onebit) target=$(awk -v f="$frac" 'BEGIN{print (f >= 0.70 ? "ok (>=0.70)" : "MISS (<0.70)")}') ;;
      topk)
        if [ "$numel" = 26214400 ] && [ -n "$torch_ms" ] && [[ "$spec" == *ratio=0.01* || "$spec" == topk ]]; then
          target=$(awk -v c="$cms" -v t="$torch_ms" 'BEGIN{printf "%.1fx torch.topk (%s)", t / c, (t / c >= 3 ? "ok" : "MISS <3x")}')
        fi ;;
    esac
    printf '%-28s %10s %10s %10s %8s  %s\n' "$spec" "$numel" "$cms" "$dms" "$frac" "$target"
  done
  echo "copy: $(tail -n +2 "$RESULTS/bench.csv" | head -1 | awk -F, '{print $(NF - 1)}') GB/s device to device (read + write), same run"
  [ -n "$torch_ms" ] && tail -1 "$LOGS/bench.torch_topk.log"
}

# The summary (the budget, every step's line, the benchmark table), the log tarball, the exit status.
finish() {
  local forced=${1:-}
  {
    echo
    echo "==== gradcomp GPU check: $(elapsed)s of ${DEADLINE}s; $(grep -c $'\tPASS\t' "$STATUS") passed," \
         "$FAILED failed, $NOT_RUN not run, $(grep -c $'\tSKIPPED\t' "$STATUS") skipped ===="
    column -t -s $'\t' "$STATUS" 2>/dev/null || cat "$STATUS"
    [ -s "$RESULTS/bench.csv" ] && bench_table
    [ -s "$LOGS/bench.device_path.log" ] && { echo; cat "$LOGS/bench.device_path.log"; }
    [ -s "$LOGS/python.optimizer_step.log" ] && tail -1 "$LOGS/python.optimizer_step.log"
    [ -s "$LOGS/mpi.two_ranks_staged.log" ] && tail -2 "$LOGS/mpi.two_ranks_staged.log"
  } | tee "$RESULTS/summary.txt"
  cp "$STATUS" "$LOGS/" 2>/dev/null
  tar -czf "$RESULTS/logs.tar.gz" -C "$LOGS" . 2>/dev/null
  rm -rf "$LOGS"
  [ -n "$forced" ] && exit "$forced"
  [ $FAILED -gt 0 ] && exit 1
  [ $NOT_RUN -gt 0 ] && exit 5
  exit 0
}
