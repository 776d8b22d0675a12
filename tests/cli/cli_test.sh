#!/usr/bin/env bash
# Runs the gradcomp CLI as a user would and checks its output. Usage: cli_test.sh PATH_TO_GRADCOMP
set -u
bin=$1
failures=0
check() {  # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; failures=$((failures + 1)); fi
}
out=$("$bin" --version); check "--version names the version" grep -q '^gradcomp [0-9]' <<<"$out"
out=$("$bin" --help); check "--help shows usage" grep -q 'usage:' <<<"$out"
check "no arguments exits 2" bash -c "'$bin' >/dev/null 2>&1; [ \$? -eq 2 ]"
out=$("$bin" list); check "list shows none" grep -q '^none' <<<"$out"
out=$("$bin" list --json); check "list --json is valid JSON with none" python3 -c '
import json, sys
items = json.loads(sys.stdin.read())
names = [i["name"] for i in items]
assert "none" in names, names
assert all("params" in i and "traits" in i for i in items)
' <<<"$out"
for spec in $("$bin" list --json | python3 -c 'import json,sys; print(" ".join(i["name"] for i in json.load(sys.stdin)))'); do
  out=$("$bin" probe "$spec" --numel 20000 --json)
  check "probe $spec --json has every key" python3 -c '
import json, sys
row = json.loads(sys.stdin.read())
keys = ["spec", "numel", "ratio", "rel_error", "bias", "payload_bytes", "compress_gbps", "decompress_gbps", "memcpy_gbps"]
missing = [k for k in keys if k not in row]
assert not missing, missing
assert row["numel"] == 20000 and row["ratio"] > 0 and row["memcpy_gbps"] > 0, row
' <<<"$out"
done
out=$("$bin" probe none --numel 1000 --json)
check "probe none is exact" python3 -c '
import json, sys
row = json.loads(sys.stdin.read())
assert row["rel_error"] == 0 and row["bias"] == 0, row
assert abs(row["ratio"] - 4000 / (4000 + 64)) < 1e-6, row
' <<<"$out"
err=$("$bin" probe nosuch 2>&1); rc=$?
check "unknown compressor exits 1 and lists valid ones" bash -c "[ $rc -eq 1 ] && grep -q 'unknown compressor' <<<\"\$0\" && grep -q none <<<\"\$0\"" "$err"
err=$("$bin" probe none --bogus 2>&1); rc=$?
check "unknown option is an error" bash -c "[ $rc -eq 1 ] && grep -q 'unknown option' <<<\"\$0\"" "$err"
err=$("$bin" probe none --dist cauchy 2>&1); rc=$?
check "unknown distribution is an error" bash -c "[ $rc -eq 1 ] && grep -q 'normal, uniform' <<<\"\$0\"" "$err"
out=$("$bin" probe --help); check "probe --help" grep -q 'memcpy_fraction' <<<"$out"
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
