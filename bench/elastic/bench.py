"""bench/elastic: elastic training under torchrun with a node lost and a node joining, against the same run without
faults (issue 18). Both runs start 4 torchrun agents on this machine (one worker each, --nnodes=2:4); in the faulty
one the worker of rank 3 SIGKILLs its agent and itself in the middle of epoch --kill-epoch, and a fifth agent is
started once rank 0 reaches epoch --join-epoch. Reported (and written to <out>/summary.json):

- recovery: seconds from the kill to the end of the first step on 3 ranks, and steps lost (steps done before the
  kill minus the step the survivors resumed from; at most the commit interval);
- the same for the join (from the new agent's start to the first step on 4 ranks);
- final test accuracy of both runs and their difference.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
from elastic_launch import Job  # noqa: E402

TRAIN = os.path.join(HERE, "train.py")


def events(out):
    path = os.path.join(out, "events.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(out, worker_args, faults, kill_epoch, join_epoch, timeout):
    job = Job(out, TRAIN, ["--out", out] + worker_args + (["--kill-epoch", str(kill_epoch)] if faults else []),
              nnodes="2:4", max_restarts=5, env={"GRADCOMP_ELASTIC_DIR": os.path.join(out, "commits")},
              run_id="gradcomp-bench")
    for _ in range(4):
        job.start_agent()
    joined_at = None
    deadline = time.time() + timeout
    while faults and join_epoch and time.time() < deadline and any(a.poll() is None for a in job.agents):
        ev = events(out)
        if ev and ev[-1]["epoch"] >= join_epoch - 1 and ev[-1]["size"] == 3:
            joined_at = time.time()
            job.start_agent()
            break
        time.sleep(0.5)
    codes = job.wait(max(1.0, deadline - time.time()))
    return codes, joined_at


def summarize(out, joined_at):
    ev = events(out)
    res = {}
    kill_path = os.path.join(out, "kill.json")
    if os.path.exists(kill_path):
        with open(kill_path) as f:
            kill = json.load(f)
        after = [e for e in ev if e["t"] > kill["t"]]
        first3 = next((e for e in after if e["event"] == "step" and e["size"] == 3), None)
        entered3 = next((e for e in after if e["event"] == "entered" and e["size"] == 3), None)
        res["kill"] = {"steps_done": kill["gstep"], "epoch": kill["epoch"] + 1,
                       "resumed_from": entered3["gstep"] if entered3 else None,
                       "steps_lost": kill["gstep"] - entered3["gstep"] if entered3 else None,
                       "seconds_to_first_step_on_3": first3["t"] - kill["t"] if first3 else None}
    if joined_at is not None:
        before = [e for e in ev if e["t"] <= joined_at and e["event"] == "step"]
        after = [e for e in ev if e["t"] > joined_at]
        last3 = max((e["gstep"] for e in after if e["event"] == "step" and e["size"] == 3),
                    default=before[-1]["gstep"] if before else None)
        entered4 = next((e for e in after if e["event"] == "entered" and e["size"] == 4), None)
        first4 = next((e for e in after if e["event"] == "step" and e["size"] == 4), None)
        res["join"] = {"steps_done_on_3": last3, "resumed_from": entered4["gstep"] if entered4 else None,
                       "steps_lost": last3 - entered4["gstep"] if entered4 and last3 is not None else None,
                       "seconds_to_first_step_on_4": first4["t"] - joined_at if first4 else None}
    final = os.path.join(out, "final.json")
    if os.path.exists(final):
        with open(final) as f:
            res["final"] = json.load(f)
    res["steps_by_size"] = {str(n): sum(1 for e in ev if e["event"] == "step" and e["size"] == n) for n in (2, 3, 4)}
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results-elastic")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--train-subset", type=int, default=0)
    p.add_argument("--commit-every", type=int, default=10)
    p.add_argument("--kill-epoch", type=int, default=2)
    p.add_argument("--join-epoch", type=int, default=4)
    p.add_argument("--spec", default="topk:ratio=0.01")
    p.add_argument("--seed", type=int, default=1, help="model initialisation, subset and sample order")
    p.add_argument("--timeout", type=float, default=4 * 3600)
    p.add_argument("--skip-baseline", action="store_true")
    args = p.parse_args()
    worker = ["--epochs", str(args.epochs), "--train-subset", str(args.train_subset), "--commit-every",
              str(args.commit_every), "--spec", args.spec, "--seed", str(args.seed)]
    summary = {"config": vars(args)}
    for name, faults in (("faults", True), ("baseline", False)):
        if name == "baseline" and args.skip_baseline:
            continue
        out = os.path.abspath(os.path.join(args.out, name))
        if os.path.exists(os.path.join(out, "events.jsonl")):
            sys.exit(f"{out} holds a previous run; choose another --out")
        t0 = time.time()
        codes, joined_at = run(out, worker, faults, args.kill_epoch, args.join_epoch, args.timeout)
        summary[name] = summarize(out, joined_at)
        summary[name]["agent_exit_codes"] = codes
        summary[name]["wall_s"] = time.time() - t0
        print(name, json.dumps(summary[name], indent=1), flush=True)
    if "final" in summary.get("faults", {}) and "final" in summary.get("baseline", {}):
        summary["accuracy_delta_pp"] = 100 * (summary["faults"]["final"]["accuracy"] -
                                              summary["baseline"]["final"]["accuracy"])
        print(f"accuracy: faults {summary['faults']['final']['accuracy']:.4f}, no faults "
              f"{summary['baseline']['final']['accuracy']:.4f}, delta {summary['accuracy_delta_pp']:+.2f} pp")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
