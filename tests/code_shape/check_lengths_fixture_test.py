#!/usr/bin/env python3
"""Fixture test of scripts/check_lengths.py: on a small temporary tree it must fail (exit 1) naming an 81-line
function and a 401-line file, pass (exit 0) on an 80-line function and a 400-line file, not be fooled by braces in
strings, comments, default arguments and initializer lists, and honour (and only honour) allow-list entries.

usage: check_lengths_fixture_test.py REPO_ROOT"""

import subprocess
import sys
import tempfile
from pathlib import Path

FAILURES = []


def expect(condition, what):
    if not condition:
        FAILURES.append(what)
        print("FAIL: " + what, file=sys.stderr)


def function(name, lines, tricky=False):
    """A C++ function whose body spans exactly `lines` lines (opening-brace line through closing-brace line)."""
    body = ["int %s(int x, int y = {}) {" % name]
    filler = ["  x += 1;  // a } in a comment", '  x += sizeof("}{");', "  /* { */ x += '}';",
              "  if (x > 0) {", "    x -= 1;", "  }"] if tricky else ["  x += 1;"]
    while len(body) + len(filler) <= lines - 2:
        body.extend(filler)
    body += ["  x += 2;"] * (lines - 2 - len(body))
    body += ["  return x + y;", "}"]
    assert len(body) == lines
    return body


def write(root, rel, lines):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run(script, root, *extra):
    proc = subprocess.run([sys.executable, str(script), "--root", str(root), *extra], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def padded_file(lines, functions):
    out = ["// fixture", "namespace gradcomp {"] + functions
    out += ["int pad_%d() { return 0; }" % k for k in range(lines - len(out) - 1)] + ["}  // namespace gradcomp"]
    assert len(out) == lines
    return out


def main(repo):
    script = Path(repo) / "scripts" / "check_lengths.py"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Over: an 81-line function (inside a class, with a constructor initializer list before it) and a 401-line
        # file; under: an 80-line function and a 400-line file.
        write(root, "compressors/long.cc", ["struct Holder {", "  Holder(int a) : a_{a}, b_(a) {}",
                                            "  int a_; int b_;"] + ["  " + l for l in function("too_long", 81, True)]
              + ["};"])
        write(root, "src/big.h", padded_file(401, []))
        write(root, "kernels/ok.cu", padded_file(400, function("just_fits", 80, True)))
        write(root, "tests/ignored.cc", function("in_tests", 200))
        rc, out = run(script, root, "--allowlist", "none")
        expect(rc == 1, "an 81-line function and a 401-line file exit 1 (got %d)" % rc)
        expect("compressors/long.cc:Holder::too_long: 81 lines" in out, "the 81-line function is named:\n" + out)
        expect("file src/big.h: 401 lines" in out, "the 401-line file is named:\n" + out)
        expect("just_fits" not in out and "kernels/ok.cu" not in out, "80 lines and 400 lines pass:\n" + out)
        expect("in_tests" not in out and "Holder::Holder" not in out, "tests/ and short functions pass:\n" + out)

        allow = root / "allow.txt"
        allow.write_text("# fixture\nfunction compressors/long.cc:Holder::too_long split pending\n", encoding="utf-8")
        rc, out = run(script, root, "--allowlist", str(allow))
        expect(rc == 1 and "src/big.h" in out and "too_long" not in out,
               "an allow-listed function passes, the file still fails (rc %d):\n%s" % (rc, out))
        allow.write_text("function compressors/long.cc:Holder::too_long split pending\n"
                         "file src/big.h being split\nfile src/gone.cc stale\n", encoding="utf-8")
        rc, out = run(script, root, "--allowlist", str(allow))
        expect(rc == 0 and "stale allow-list entry" in out and "src/gone.cc" in out,
               "everything allow-listed exits 0 and names the stale entry (rc %d):\n%s" % (rc, out))
        allow.write_text("function compressors/long.cc:Holder::too_long\n", encoding="utf-8")
        rc, out = run(script, root, "--allowlist", str(allow))
        expect(rc == 2, "an allow-list entry without a reason is a usage error (rc %d)" % rc)

        write(root, "compressors/long.cc", function("now_fits", 80, True))
        write(root, "src/big.h", padded_file(400, []))
        rc, out = run(script, root, "--allowlist", "none")
        expect(rc == 0, "an 80-line function and 400-line files exit 0 (got %d):\n%s" % (rc, out))

    rc, out = run(script, Path(repo), "--help")
    expect(rc == 0 and "usage" in out, "--help prints usage")
    print("%d failure(s)" % len(FAILURES))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]))
