#!/usr/bin/env bash
# The mutation record of docs/testing.md, rerunnable: applies each deliberate bug to the working tree one at a time
# (an exact text replacement; the file is restored with `git checkout` afterwards, also on Ctrl-C), rebuilds what it
# touches in build/, runs the tests that must catch it, and prints "caught" or "MISSED" per mutation. Exits 1 if any
# is missed. Needs a built build/ (scripts/test.sh) and uncommitted-change-free copies of the mutated files.
#
# usage: scripts/mutation_check.sh [NAME...]   (default: every mutation; names: adasum-norms, half-sum-zero,
#        hier-leader-topk-qsgd, halved-lossy-step, runtime-reduces-nothing, missing-executable)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
build=${GRADCOMP_BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT} CCACHE_NOHASHDIR=true
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -f "$build/CTestTestfile.cmake" ] || { echo "mutation_check.sh: no $build/ (run scripts/test.sh first)" >&2; exit 2; }

mutated=""
restore() {
  if [ -n "$mutated" ]; then git checkout -q -- "$mutated"; mutated=""; fi
}
trap restore EXIT

# mutate FILE OLD NEW: replaces the one occurrence of OLD in FILE (fails if OLD is not there exactly once, so the
# record breaks loudly when the code it mutates moves).
mutate() {
  git diff --quiet -- "$1" || { echo "mutation_check.sh: $1 has uncommitted changes" >&2; exit 2; }
  python3 - "$1" "$2" "$3" <<'EOF'
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"mutation_check.sh: expected one '{old}' in {path}, found {text.count(old)}")
open(path, "w").write(text.replace(old, new))
EOF
  mutated=$1
}

# expect_caught NAME TARGETS REGEX: builds TARGETS, runs the ctest tests matching REGEX; caught if any fails.
missed=0
expect_caught() {
  local name=$1 targets=$2 regex=$3
  [ -z "$targets" ] || nice -n 10 cmake --build "$build" -j 2 --target $targets >/dev/null
  if (cd "$build" && nice -n 10 ctest -R "$regex" --no-tests=error --output-on-failure -j 2 >"$ROOT/$build/mutation-$name.log" 2>&1); then
    echo "MISSED  $name: every test of /$regex/ passed (log: $build/mutation-$name.log)"; missed=1
  else
    echo "caught  $name: $(grep -E 'tests? failed|\*\*\*Failed|\(Failed\)' "$build/mutation-$name.log" | head -3 | tr -s ' ' | paste -sd';')"
  fi
  restore
}

run_one() {
  case "$1" in
    adasum-norms)  # each pairwise coefficient divided by the other vector's squared norm
      mutate python/gradcomp/torch/adasum.py "1.0 - dot / anorm * 0.5 if anorm" "1.0 - dot / bnorm * 0.5 if anorm"
      expect_caught "$1" "" 'python_hvd_adasum_check_(mpi|runtime)_np2$' ;;
    half-sum-zero)  # one element of the dense fp16/bf16 sum zeroed after the communicator's allreduce
      mutate comm/algorithms/dense.cc \
        "call.comm.allreduce(call.space.view(body, call.tensor.numel(), traits.wire_dtype), ReduceOp::kSum);" \
        "call.comm.allreduce(call.space.view(body, call.tensor.numel(), traits.wire_dtype), ReduceOp::kSum);
    if ((traits.wire_dtype == DType::kF16 || traits.wire_dtype == DType::kBF16) && call.tensor.numel() > 2) {
      reinterpret_cast<std::uint16_t*>(body)[call.tensor.numel() / 2] = 0;
    }"
      expect_caught "$1" "half_sum_bound_test allreduce_local_test" '^(half_sum_bound_test|allreduce_local_test)$' ;;
    hier-leader-topk-qsgd)  # the node leaders' sum off by one in one element, for top-k and qsgd only
      mutate comm/algorithms/compressed_allreduce.cc "  if (groups->leaders != nullptr) {
    AllreduceOptions inner" "  if (groups->leaders != nullptr && numel > 2 &&
      (compressor.name() == \"topk\" || compressor.name() == \"qsgd\")) {
    work[numel / 2] += 1.0f;
  }
  if (groups->leaders != nullptr) {
    AllreduceOptions inner"
      expect_caught "$1" "allreduce_local_test" '^allreduce_local_test$' ;;
    halved-lossy-step)  # every gradient the optimizer applies halved (the script's top-k rows must see it)
      mutate python/gradcomp/torch/optimizer.py "    def _postscale(self, grad):
" "    def _postscale(self, grad):
        grad.mul_(0.5)
"
      expect_caught "$1" "" '^python_horovod_style_train_(mpi|torch)_np2$' ;;
    runtime-reduces-nothing)  # the fusion runtime skips the allreduce: every rank keeps its own input
      mutate src/runtime/executor.cc \
        "AllreduceStats stats = compressed_allreduce(data_comm, compressor, buffer, buffer_name, options);" \
        "AllreduceStats stats;
  (void)data_comm;"
      expect_caught "$1" "runtime_test" '^runtime_test$' ;;
    missing-executable)  # a test's executable gone: test.sh's counting must fail it, not skip it
      local exe="$build/tests/comm/half_sum_bound_test" junit="$ROOT/$build/mutation-junit.xml"
      mv "$exe" "$exe.away"
      rm -f "$junit"
      (cd "$build" && ctest -R '^half_sum_bound_test$' --output-junit "$junit" >/dev/null 2>&1) || true
      if python3 scripts/test_summary.py "$junit" "$ROOT/$build/no-pytest-junit" >"$build/mutation-$1.log" 2>&1; then
        echo "MISSED  $1: counted as $(tail -1 "$build/mutation-$1.log")"; missed=1
      else
        echo "caught  $1: $(tail -1 "$build/mutation-$1.log")"
      fi
      mv "$exe.away" "$exe" ;;
    *) echo "mutation_check.sh: unknown mutation '$1'" >&2; exit 2 ;;
  esac
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(adasum-norms half-sum-zero hier-leader-topk-qsgd halved-lossy-step runtime-reduces-nothing
  missing-executable)
for name in "${names[@]}"; do run_one "$name"; done
# The tree is as it was; rebuild so build/ matches it again.
nice -n 10 cmake --build "$build" -j 2 >/dev/null
exit $missed
