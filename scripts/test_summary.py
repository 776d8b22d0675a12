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

usage: test_summary.py [CTEST_JUNIT [PYTEST_JUNIT_DIR] ...] [--skipped REASON ...] [--counts "P F S" WHAT ...]
  one pair per ctest pass (scripts/test.sh runs the torch2 label a second time on torch 2); each --skipped counts one
  more skip (a pass that could not run, with why); --counts adds another runner's counts (scripts/sim-test.sh).
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


def parse_args(argv):
    """([(ctest junit, pytest dir or None)], [extra skip reasons], [("P F S", what)]) from the command line."""
    paths, extra, counted = [], [], []
    it = iter(argv)
    for arg in it:
        if arg == "--skipped":
            extra.append(next(it, "no reason given"))
        elif arg == "--counts":
            counted.append((next(it, ""), next(it, "another runner")))
        else:
            paths.append(arg)
    runs = [(paths[i], paths[i + 1] if i + 1 < len(paths) else None) for i in range(0, len(paths), 2)]
    return runs, extra, counted


def count_pass(junit_path, pytest_dir, tag, counts, notes):
    """Adds one ctest run's outcomes (its JUnit file, the pytest files of its tests) to counts and notes."""
    try:
        root = ET.parse(junit_path).getroot()
    except (OSError, ET.ParseError) as e:
        notes.append(f"[summary] CTest wrote no readable JUnit file{tag} ({e}): counted as a failure")
        counts["failed"] += 1
        return
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
                notes.append(f"[summary] pytest case skipped inside passed {name}{tag}: {n} ({m})")
        counts[outcome] += 1
        if outcome != "passed":
            notes.append(f"[summary] {outcome}: {name}{tag}{f' ({reason})' if reason else ''}")


def main(argv):
    runs, extra_skips, counted = parse_args(argv[1:])
    if not runs and not counted:
        print(__doc__, file=sys.stderr)
        return 2
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    notes = []
    for junit_path, pytest_dir in runs:
        tag = f" [{os.path.basename(junit_path)}]" if len(runs) > 1 else ""
        count_pass(junit_path, pytest_dir, tag, counts, notes)
    for line, what in counted:
        fields = line.split()
        if len(fields) != 3 or not all(f.isdigit() for f in fields):
            notes.append(f"[summary] failed: {what} (no 'PASSED FAILED SKIPPED' counts: '{line}')")
            counts["failed"] += 1
            continue
        for key, value in zip(("passed", "failed", "skipped"), map(int, fields)):
            counts[key] += value
        if int(fields[1]) or int(fields[2]):
            notes.append(f"[summary] {what}: {fields[1]} failed, {fields[2]} skipped")
    for reason in extra_skips:
        counts["skipped"] += 1
        notes.append(f"[summary] skipped: {reason}")
    for note in notes:
        print(note)
    if sum(counts.values()) == 0:
        print("[summary] no test ran (a mistyped --label?): counted as a failure")
        counts["failed"] = 1
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
