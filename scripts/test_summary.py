#!/usr/bin/env python3
"""The summary of a scripts/test.sh run: reads CTest's JUnit file and the JUnit files pytest wrote per CTest test,
prints what was skipped or not run (with the reason) and one line "N passed, N failed, N skipped". Exits 1 when
anything failed, when CTest's file is missing or unreadable (a crashed ctest), or when no test ran.

Counting (CTest 3.25 JUnit):
- failed: a <failure>/<error>, and every "notrun" that is not a skip: "Unable to find executable", "Required Files
  Missing", a failed fixture (a test that did not run did not pass);
- skipped: "notrun" with a <skipped> message CTest writes for a declared skip (SKIP_RETURN_CODE=77,
  SKIP_REGULAR_EXPRESSION_MATCHED), "disabled", and a passed pytest test whose every case pytest skipped;
- passed: the rest. A passed pytest test with some cases skipped stays passed; its skipped cases are listed.

usage: test_summary.py CTEST_JUNIT [PYTEST_JUNIT_DIR]
"""
import os
import sys
import xml.etree.ElementTree as ET

DECLARED_SKIPS = ("SKIP_RETURN_CODE=", "SKIP_REGULAR_EXPRESSION_MATCHED")


def ctest_outcome(case):
    """('passed' | 'failed' | 'skipped', reason) of one CTest test case."""
    status = case.get("status", "run")
    if case.find("failure") is not None or case.find("error") is not None:
        return "failed", ""
    if status == "disabled":
        return "skipped", "disabled"
    skipped = case.find("skipped")
    if status == "notrun" or skipped is not None:
        message = skipped.get("message", "") if skipped is not None else ""
        if message.startswith(DECLARED_SKIPS):
            return "skipped", message
        return "failed", f"not run: {message or 'no reason given'}"
    return "passed", ""


def pytest_cases(path):
    """[(case name, skip message or None)] of one pytest JUnit file."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        skipped = case.find("skipped")
        name = f"{case.get('classname', '')}.{case.get('name', '')}".strip(".")
        cases.append((name, None if skipped is None else skipped.get("message", "")))
    return cases


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        root = ET.parse(argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"[summary] CTest wrote no readable JUnit file ({e}): counted as a failure")
        print("0 passed, 1 failed, 0 skipped")
        return 1
    pytest_dir = argv[2] if len(argv) > 2 else None
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    notes = []
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        outcome, reason = ctest_outcome(case)
        junit = os.path.join(pytest_dir, name + ".xml") if pytest_dir else None
        if outcome == "passed" and junit and os.path.exists(junit):
            cases = pytest_cases(junit)
            skipped = [(n, m) for n, m in cases if m is not None]
            if cases and len(skipped) == len(cases):
                outcome, reason = "skipped", f"every pytest case skipped: {skipped[0][1]}"
            for n, m in skipped if outcome == "passed" else []:
                notes.append(f"[summary] pytest case skipped inside passed {name}: {n} ({m})")
        counts[outcome] += 1
        if outcome != "passed":
            notes.append(f"[summary] {outcome}: {name}{f' ({reason})' if reason else ''}")
    for note in notes:
        print(note)
    total = sum(counts.values())
    if total == 0:
        print("[summary] no test ran (a mistyped --label?): counted as a failure")
        counts["failed"] = 1
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
