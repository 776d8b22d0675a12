#!/usr/bin/env python3
"""Compression vs accuracy on Fashion-MNIST: trains one model data-parallel on N ranks of this machine once per
compressor (same seeds, same initial weights, same data order for every compressor, so the differences are the
compressor's alone), then prints a table and writes <out>/accuracy.csv, accuracy.png and accuracy.json.

The default is the quick demo (a 784-128-10 MLP, 1 epoch over 16,000 training images, 4 ranks x 8 images per step,
500 steps of plain SGD; a few minutes on a 2-core machine). --full is the converged sweep (a two-layer CNN, 20 epochs
over all 60,000 images, plain SGD lr 0.2: about 100 minutes for the nine compressors on an idle 2-core machine).

Gradients travel through gradcomp (--comm gradcomp: gradcomp.torch.DistributedOptimizer under mpirun, on gradcomp's
C++ compressed_allreduce over MPI; --comm ddp-hook: torch DDP + gradcomp.torch.ddp_comm_hook over gloo, one process
per rank). Payload bytes, wire bytes and compression ratios are gradcomp's own stats. --comm torch is a plain-PyTorch
dense reference ('none' only).

examples:
  bench/accuracy/run.py                                   # the demo sweep, all nine compressors
  bench/accuracy/run.py --full --out results-full/
  bench/accuracy/run.py --compressors none,qsgd:bits=4,topk:ratio=0.01 --ranks 2 --epochs 2
  bench/accuracy/run.py --link 1gbit                      # under bench/net/shaped.sh, adds time-to-accuracy
  bench/accuracy/run.py --launcher spark --compressors none,topk:ratio=0.01   # ranks as Spark tasks, local[4]
  bench/accuracy/run.py --full --seeds 1-3 --out results-full/   # per seed into seed-N/, then mean and paired Δ
  bench/accuracy/run.py --combine a/seed-1 b/seed-2 --out both/   # combine sweeps already run (seed aside, alike)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import lm_report  # noqa: E402
import lm_seeds  # noqa: E402
import lm_task  # noqa: E402
import report  # noqa: E402
from progress import Progress  # noqa: E402
import seeds  # noqa: E402

DEFAULT_COMPRESSORS = ("none,fp16,qsgd:bits=4,terngrad,onebit,topk:ratio=0.01,randomk:ratio=0.01,"
                       "blocktopk:ratio=0.01,dgc:ratio=0.001")
# Both presets use plain SGD: heavy-ball momentum applied after sparsification amplifies the error-feedback codecs'
# delayed bursts (Lin et al. 2018, section 3.2). The demo takes many small steps (8 images per rank, 500 steps) so the
# residuals can drain in one epoch; --full with momentum 0.9 (its first setting) left topk 1.0, dgc 1.3 and onebit
# 4.7 pp behind dense and random-k diverged, against 0.1-0.4 pp with plain SGD at lr 0.4 (docs/measurements/2026-12-01-accuracy-history.md).
# --full's 20 epochs at lr 0.2 (its third setting, after 5 epochs at lr 0.4): random-k 1% diverged or fell 6-81 pp
# behind at lr 0.4, and needs the smaller step and more steps to end within 1.5 pp of dense; every compressor shares
# the setting, and all nine targets hold there (docs/accuracy-cnn.md).
PRESETS = {
    "demo": dict(model="mlp", epochs=1, train_subset=16000, batch=8, lr=0.1, momentum=0.0, evals_per_epoch=1),
    "full": dict(model="cnn", epochs=20, train_subset=0, batch=32, lr=0.2, momentum=0.0, evals_per_epoch=1),
}
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,tcp",
             "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


def split_specs(text: str) -> list[str]:
    """'none,qsgd:bits=4,bucket=512,topk:ratio=0.01' -> ['none', 'qsgd:bits=4,bucket=512', 'topk:ratio=0.01']:
    a comma-separated piece that is a key=value pair without a ':' continues the previous spec. ';' also separates."""
    specs: list[str] = []
    for chunk in text.replace(";", " ").split():
        for piece in chunk.split(","):
            piece = piece.strip()
            if not piece:
                continue
            if "=" in piece and ":" not in piece and specs:
                specs[-1] += "," + piece
            else:
                specs.append(piece)
    seen = set()
    return [s for s in specs if not (s in seen or seen.add(s))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_env(build_dir: str) -> dict:
    """The environment of the ranks: gradcomp's package importable from the build tree (<build>/python/gradcomp
    holds the nanobind module and links to the package's .py files), without threads oversubscribing the cores."""
    env = dict(os.environ)
    paths = [os.path.join(build_dir, "python")]
    env["PYTHONPATH"] = os.pathsep.join([p for p in paths if os.path.isdir(p)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def gradcomp_importable(python: str, env: dict) -> tuple[bool, str]:
    r = subprocess.run([python, "-c", "import gradcomp.torch"], env=env, capture_output=True, text=True, timeout=120)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]


def choose_comm(requested: str, python: str, env: dict, specs: list[str]) -> tuple[str, str]:
    """(comm, why) for --comm auto: gradcomp's MPI path when gradcomp imports and mpirun exists, else the DDP hook
    (needs gradcomp too), else the plain-PyTorch reference when only 'none' is asked for."""
    if requested != "auto":
        return requested, "requested"
    ok, err = gradcomp_importable(python, env)
    if ok and shutil.which("mpirun"):
        return "gradcomp", "gradcomp.torch imports and mpirun is present"
    if ok:
        return "ddp-hook", "mpirun not found"
    if all(report.codec(s) == "none" for s in specs):
        return "torch", f"gradcomp.torch does not import ({err}); plain PyTorch reference"
    sys.exit(f"run.py: gradcomp.torch does not import ({err}).\n"
             "Build the Python module first (scripts/demo.sh does: cmake -DGRADCOMP_WITH_PYTHON=ON ...), "
             "or run only --compressors none --comm torch for the plain-PyTorch reference.")


def launch(args, comm: str, specs: list[str], index_base: int, run_dir: str, env: dict, progress: Progress,
           failures: dict) -> int:
    """Runs the ranks once over `specs`; returns the launcher's exit code. Rank 0's events drive `progress`."""
    python = args.python
    worker = [python, os.path.join(HERE, "worker.py"), "--specs", json.dumps(specs), "--comm", comm,
              "--index-base", str(index_base), "--out", run_dir, "--model", args.model, "--epochs", str(args.epochs),
              "--train-subset", str(args.train_subset), "--batch", str(args.batch), "--lr", str(args.lr),
              "--momentum", str(args.momentum), "--seed", str(args.seed), "--log-every", str(args.log_every),
              "--evals-per-epoch", str(args.evals_per_epoch), "--threads", str(args.threads)]
    if args.cosine:
        worker.append("--cosine")
    if args.task == "lm":
        worker = lm_task.worker_command(python, json.dumps(specs), comm, index_base, run_dir, args)
    if args.launcher == "spark":  # the ranks as Spark tasks on local[ranks] (spark_launch.py)
        import spark_launch
        return spark_launch.launch(args, worker[1:], progress, failures)
    env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if comm == "gradcomp":
        cmd = ["mpirun"] + MPI_FLAGS + ["-np", str(args.ranks)]
        for k in ("MASTER_ADDR", "MASTER_PORT", "PYTHONPATH", "OMP_NUM_THREADS", "PYTHONUNBUFFERED"):
            cmd += ["-x", k]
        cmds = [cmd + worker]
    else:  # one process per rank, rendezvous over 127.0.0.1
        cmds = [worker for _ in range(args.ranks)]
    if args.link:
        shaped = os.path.join(ROOT, "bench", "net", "shaped.sh")
        if not os.path.exists(shaped):
            sys.exit(f"run.py: --link needs {shaped} (bench/net, from the comm work)")
        if comm != "gradcomp":
            sys.exit("run.py: --link shapes one launched command; use --comm gradcomp (mpirun)")
        cmds = [[shaped, args.link, "--"] + cmds[0]]

    procs = []
    for r, cmd in enumerate(cmds):
        penv = env if comm == "gradcomp" else dict(env, RANK=str(r), WORLD_SIZE=str(args.ranks))
        procs.append(subprocess.Popen(cmd, env=penv, stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                                      stderr=None if r == 0 else subprocess.STDOUT, text=True, bufsize=1,
                                      start_new_session=True))
    timed_out = threading.Event()

    def kill_groups(sig):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop_all():  # each launch is its own process group: mpirun and its ranks, or one rank
        timed_out.set()
        kill_groups(signal.SIGTERM)
        time.sleep(5)
        kill_groups(signal.SIGKILL)

    watchdog = threading.Timer(max(0.0, args.deadline - time.monotonic()), stop_all)
    watchdog.daemon = True
    watchdog.start()
    try:
        for raw in procs[0].stdout:
            if raw.startswith("@@ "):
                ev = json.loads(raw[3:])
                if ev["event"] == "failed":
                    failures[ev["spec"]] = ev["error"]
                progress.event(ev)
            else:
                progress.passthrough(raw)
        rcs = [p.wait() for p in procs]
    except KeyboardInterrupt:
        kill_groups(signal.SIGTERM)
        time.sleep(3)
        kill_groups(signal.SIGKILL)
        raise
    finally:
        watchdog.cancel()
    if timed_out.is_set():
        progress.passthrough(f"run.py: the sweep ran past --timeout {args.timeout:g} s; the ranks were stopped\n")
        return 124
    return next((rc for rc in rcs if rc != 0), 0)


def parse_seeds(text: str) -> list[int]:
    """'1,2,3' or '1-3' -> [1, 2, 3]."""
    seeds: list[int] = []
    for piece in text.split(","):
        piece = piece.strip()
        if "-" in piece[1:]:
            lo, hi = piece.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        elif piece:
            seeds.append(int(piece))
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds '{text}': give distinct integers, e.g. 1,2,3 or 1-3")
    return seeds


def run_sweep(args, comm: str, specs: list[str], env: dict, out: str, deadline: float) -> int:
    """Trains every spec once with args.seed and writes <out>/accuracy.{csv,json,png} and <out>/runs/. Returns the
    exit status: 0 when every row succeeded, 1 when one failed, 130 when interrupted."""
    os.makedirs(out, exist_ok=True)
    run_dir = os.path.join(out, "runs")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    progress = Progress(len(specs), args.quiet)
    failures: dict[str, str] = {}
    started = time.monotonic()
    pending = list(range(len(specs)))
    args.deadline = deadline
    stopped = False
    while pending:
        try:
            rc = launch(args, comm, [specs[i] for i in pending], pending[0], run_dir, env, progress, failures)
        except KeyboardInterrupt:  # the ranks were stopped; report what finished, relaunch nothing
            stopped = True
            rc = 130
        if stopped:
            done = {int(f.split(".")[0]) for f in os.listdir(run_dir) if f.endswith(".json")}
            for i in pending:
                if i not in done and specs[i] not in failures:
                    failures[specs[i]] = "not run to the end: the sweep was interrupted"
            print("\nrun.py: interrupted; writing what finished", file=sys.stderr)
            break
        done = {int(f.split(".")[0]) for f in os.listdir(run_dir) if f.endswith(".json")}
        pending = [i for i in pending if i not in done and specs[i] not in failures]
        if rc == 124:  # the whole sweep's time is up: what finished is reported, the rest is marked not run
            for i in pending:
                failures[specs[i]] = f"not run to the end: the sweep reached --timeout {args.timeout:g} s"
            pending = []
        elif rc != 0 and pending:  # the launch died inside pending[0]: record it and go on with the rest
            i = pending.pop(0)
            failures[specs[i]] = f"the ranks exited with status {rc} during this run (see the output above)"
            progress.event({"event": "failed", "spec": specs[i], "error": failures[specs[i]]})
        elif rc != 0:
            print(f"run.py: the ranks exited with status {rc} after the last run", file=sys.stderr)
    wall = time.monotonic() - started

    rows = []
    for i, spec in enumerate(specs):
        path = os.path.join(run_dir, f"{i:02d}.json")
        if os.path.exists(path):
            with open(path) as f:
                row = json.load(f)
            row["status"] = "ok"
        else:
            row = {"spec": spec, "status": "failed", "error": failures.get(spec, "no result")}
        row["link"] = args.link or ""
        rows.append(row)
    rep = lm_report if args.task == "lm" else report   # same functions, the task's own metric
    rep.annotate(rows)
    print()
    print(rep.table(rows, with_link=bool(args.link)))
    if not any(report.codec(r["spec"]) == "none" and r["status"] == "ok" for r in rows):
        print("(Δ vs none is n/a: this sweep has no successful 'none' run; add none to --compressors, or pair it "
              "later with `run.py --combine THIS_FOLDER A_SWEEP_WITH_NONE --out ...` (same seed and settings))")
    meta = {k: getattr(args, k) for k in ("ranks", "epochs", "model", "train_subset", "batch", "lr", "momentum",
                                          "cosine", "seed", "link", "full")}
    meta.update(comm=comm, comm_why=args.comm_why, sweep_wall_s=wall, compressors=specs)
    if args.task == "lm":
        meta.update(lm_task.meta(args))
    csv_path = os.path.join(out, "accuracy.csv")
    png_path = os.path.join(out, "accuracy.png")
    rep.write_csv(rows, csv_path)
    rep.write_json(rows, meta, os.path.join(out, "accuracy.json"))
    title = lm_task.title(args, comm) if args.task == "lm" else sweep_title(args, comm)
    plotted = report.plot(rep.write_png, rows, png_path, title + f", seed {args.seed}")
    print(f"\nwrote {csv_path}{', ' + png_path if plotted else ''} ({wall:.0f} s of training runs)")
    if stopped:
        return 130
    return 1 if any(r["status"] != "ok" for r in rows) else 0


def sweep_title(args, comm: str) -> str:
    return (f"Fashion-MNIST, {args.model}, {args.ranks} ranks, {args.epochs} epoch(s) over "
            f"{args.train_subset or 60000} images, gradients via {comm}" + (f", link {args.link}" if args.link else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=("fashion-mnist", "lm"), default="fashion-mnist",
                   help="fashion-mnist (default: MLP/CNN with SGD) or lm (byte-level transformer with AdamW on the "
                   "Python standard library's sources; quick by default, --full ~9 min per seed on 2 idle cores)")
    p.add_argument("--compressors",
                   help=f"gradcomp specs separated by commas (default: the nine of the sweep: {DEFAULT_COMPRESSORS}; "
                   f"--task lm: {lm_task.DEFAULT_COMPRESSORS}, then its momentum rows, lm_task.py)")
    p.add_argument("--ranks", type=int, default=4, help="data-parallel ranks on this machine (default 4)")
    p.add_argument("--epochs", type=int, help="epochs per run (demo 1, --full 20)")
    p.add_argument("--full", action="store_true", help="the converged sweep: CNN, all 60,000 images, 20 epochs, "
                   "lr 0.2 (about 100 minutes on 2 cores)")
    p.add_argument("--link", metavar="RATE", help="run under bench/net/shaped.sh at RATE (e.g. 1gbit) and report "
                   "the training time to reach the dense run's final accuracy")
    p.add_argument("--out", default="results", help="output folder (default results/)")
    p.add_argument("--comm", default="auto", choices=("auto", "gradcomp", "ddp-hook", "torch"),
                   help="gradient path (default auto: gradcomp over MPI under mpirun, else the DDP hook on gloo)")
    p.add_argument("--launcher", default="mpirun", choices=("mpirun", "spark"),
                   help="how the ranks start (default mpirun: mpirun for --comm gradcomp, else one process per rank); "
                   "spark: as the tasks of a Spark barrier stage on local[ranks] (gradcomp.spark.run; --comm "
                   "gradcomp then runs on gradcomp's torch backend over gloo; needs scripts/spark-deps.sh)")
    p.add_argument("--model", choices=("mlp", "cnn"), help="demo mlp, --full cnn")
    p.add_argument("--train-subset", type=int, help="training images used (0 = all 60,000; demo 16,000)")
    p.add_argument("--batch", type=int, help="per-rank batch size (demo 8, --full 32)")
    p.add_argument("--lr", type=float, help="SGD learning rate, cosine-decayed to 0 (demo 0.1, --full 0.2)")
    p.add_argument("--momentum", type=float, help="SGD momentum (demo 0, --full 0); DGC's momentum correction "
                   "uses it too")
    p.add_argument("--no-cosine", dest="cosine", action="store_false", help="constant learning rate")
    p.add_argument("--evals-per-epoch", type=int, help="test-set evaluations per epoch (default 1; 4 with --link)")
    p.add_argument("--log-every", type=int, default=0, help="steps between progress lines (default: ~20 per run)")
    p.add_argument("--seed", type=int, default=1, help="seed of the weights, data order and dropout (default 1)")
    p.add_argument("--seeds", metavar="LIST", help="run the sweep once per seed (e.g. 1,2,3 or 1-3) into "
                   "<out>/seed-N/, then write <out>/accuracy.* with each compressor's mean accuracy and mean Δ vs "
                   "the same seed's dense run (± standard error)")
    p.add_argument("--combine", nargs="+", metavar="SWEEP", help="train nothing: combine finished sweeps that differ "
                   "only in --seed (their output folders or accuracy.json files) into <out>/, as --seeds does")
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (default: cores / ranks, >= 1)")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"), help="where build/python holds gradcomp")
    p.add_argument("--python", default=sys.executable, help="the ranks' Python (default: this one)")
    p.add_argument("--timeout", type=float,
                   help="seconds for the whole sweep, all seeds together (default per seed: 90 s per epoch of 60,000 "
                   "images per compressor, at least 7200; 4.5 h for --full); runs not finished by then are reported "
                   "as not run")
    p.add_argument("--quiet", action="store_true", help="no progress lines, only each run's result and the table")
    lm_task.add_arguments(p)
    args = p.parse_args()
    lm = args.task == "lm"
    if args.compressors is None:
        args.compressors = lm_task.default_compressors(args.full) if lm else DEFAULT_COMPRESSORS

    if args.combine:
        try:
            return (lm_seeds if lm else seeds).write_combined(args.combine, args.out)
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"run.py --combine: {e}")
    try:
        seed_list = parse_seeds(args.seeds) if args.seeds else [args.seed]
    except ValueError as e:
        p.error(str(e))
    if lm:  # before the Fashion-MNIST preset, which would fill --batch and --lr with its values
        lm_task.configure(args)
    preset = PRESETS["full" if args.full else "demo"]
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.link and args.evals_per_epoch == preset["evals_per_epoch"] and "--evals-per-epoch" not in sys.argv:
        args.evals_per_epoch = 4
    if args.threads <= 0:
        args.threads = max(1, (os.cpu_count() or 1) // args.ranks)
    specs = split_specs(args.compressors)
    if not specs:
        p.error("--compressors is empty")
    if args.ranks < 1:
        p.error("--ranks must be >= 1")

    env = python_env(args.build_dir)
    comm, args.comm_why = choose_comm(args.comm, args.python, env, specs)
    steps = (args.train_subset or 60000) // (args.batch * args.ranks) * args.epochs
    if args.log_every <= 0:
        args.log_every = max(1, steps // 20)

    mode = "full" if args.full else "demo"
    print(lm_task.banner(args, len(specs)) if lm else
          f"accuracy sweep ({mode}): {len(specs)} compressors, {args.ranks} ranks, model {args.model}, "
          f"{args.epochs} epoch(s) over {args.train_subset or 60000} Fashion-MNIST images, batch {args.batch}/rank"
          f"{', link ' + args.link if args.link else ''}"
          + (f", seeds {','.join(map(str, seed_list))}" if args.seeds else ""))
    print(f"gradient path: --comm {comm} ({args.comm_why})", flush=True)

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)   # also when started in the background (SIGINT ignored there)
    if args.timeout is None and lm:
        args.timeout = lm_task.default_timeout(args, len(specs), len(seed_list))
    if args.timeout is None:
        images = args.train_subset or 60000
        args.timeout = len(seed_list) * max(7200.0, 90.0 * args.epochs * len(specs) * images / 60000)
    deadline = time.monotonic() + args.timeout
    if not args.seeds:
        return run_sweep(args, comm, specs, env, args.out, deadline)
    worst = 0
    folders = []
    for n, seed in enumerate(seed_list):
        args.seed = seed
        folder = os.path.join(args.out, f"seed-{seed}")
        print(f"\n=== seed {seed} ({n + 1}/{len(seed_list)}) -> {folder}", flush=True)
        rc = run_sweep(args, comm, specs, env, folder, deadline)
        worst = max(worst, rc)
        folders.append(folder)
        if rc == 130:
            break
    return max(worst, (lm_seeds if lm else seeds).write_combined(folders, args.out))


if __name__ == "__main__":
    sys.exit(main())
