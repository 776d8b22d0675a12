#!/usr/bin/env python3
"""bench/accuracy/seeds.py and run.py --combine on synthetic sweeps: the paired Δ (each seed against its own dense
run), its standard error, seeds missing or failed for one compressor, and the refusal to combine sweeps whose
settings differ."""
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))
import seeds  # noqa: E402

META = dict(model="cnn", epochs=5, train_subset=0, batch=32, lr=0.4, momentum=0.0, cosine=True, ranks=4,
            comm="gradcomp", link=None, full=True)


def run(spec, acc, ratio=1.0):
    return {"spec": spec, "status": "ok", "test_acc": acc, "compression_ratio": ratio, "payload_bytes_per_step": 1000.0,
            "wire_bytes_per_step": 1500.0, "time_per_epoch_s": 60.0, "model": "cnn", "epochs": 5, "lr": 0.4,
            "ranks": 4, "loss_curve": [[1, 2.0], [2, 1.0]]}


def sweep(seed, runs, path=None, **meta):
    return {"meta": dict(META, seed=seed, **meta), "runs": runs, "path": path or f"seed-{seed}"}


class CombineTest(unittest.TestCase):
    def test_delta_is_paired_per_seed(self):
        # Dense swings 0.9 pp between seeds; fp16 follows it: the paired Δ is -0.1 pp each time, se 0.
        rows = seeds.combine([sweep(1, [run("none", 0.911), run("fp16", 0.910, 2.0)]),
                              sweep(2, [run("none", 0.902), run("fp16", 0.901, 2.0)]),
                              sweep(3, [run("none", 0.907), run("fp16", 0.906, 2.0)])])
        fp16 = next(r for r in rows if r["spec"] == "fp16")
        self.assertEqual(fp16["seeds"], [1, 2, 3])
        self.assertAlmostEqual(fp16["delta_pp_mean"], -0.1, places=9)
        self.assertAlmostEqual(fp16["delta_pp_se"], 0.0, places=9)
        self.assertAlmostEqual(fp16["test_acc_mean"], (0.910 + 0.901 + 0.906) / 3, places=12)
        self.assertGreater(fp16["test_acc_sd"], 0.004)  # the unpaired spread is much larger than the paired one

    def test_standard_error_of_the_mean_delta(self):
        rows = seeds.combine([sweep(1, [run("none", 0.90), run("topk:ratio=0.01", 0.89)]),
                              sweep(2, [run("none", 0.90), run("topk:ratio=0.01", 0.91)])])
        topk = rows[1]
        self.assertAlmostEqual(topk["delta_pp_mean"], 0.0, places=9)
        # deltas -1, +1 pp: sd sqrt(2), se = sd / sqrt(2) = 1
        self.assertAlmostEqual(topk["delta_pp_se"], 1.0, places=9)
        self.assertEqual([round(d, 9) for d in topk["deltas_pp"]], [-1.0, 1.0])

    def test_seed_without_dense_run_is_not_paired(self):
        rows = seeds.combine([sweep(1, [run("none", 0.90), run("qsgd:bits=4", 0.89)]),
                              sweep(2, [run("qsgd:bits=4", 0.80)])])
        qsgd = next(r for r in rows if r["spec"] == "qsgd:bits=4")
        self.assertEqual(qsgd["seeds"], [1, 2])
        self.assertEqual(qsgd["paired_seeds"], [1])
        self.assertAlmostEqual(qsgd["delta_pp_mean"], -1.0, places=9)
        self.assertIsNone(qsgd["delta_pp_se"])

    def test_failed_runs_are_reported_not_averaged(self):
        failed = {"spec": "randomk:ratio=0.01", "status": "failed", "error": "FloatingPointError: loss is nan"}
        rows = seeds.combine([sweep(1, [run("none", 0.90), failed]), sweep(2, [run("none", 0.91), dict(failed)])])
        rk = next(r for r in rows if r["spec"] == "randomk:ratio=0.01")
        self.assertEqual(rk["status"], "failed")
        self.assertIn("seed 1: FloatingPointError", rk["error"])
        self.assertIn("seed 2:", rk["error"])
        self.assertIn("FAILED", seeds.table(rows))

    def test_partial_sweeps_of_one_seed_merge_with_dense_first(self):
        # Seed 1 run as `randomk,none` and then the rest, seed 2 likewise: one table, dense first, every row paired.
        rows = seeds.combine([sweep(1, [run("randomk:ratio=0.01", 0.89), run("none", 0.91)]),
                              sweep(1, [run("fp16", 0.905, 2.0), run("topk:ratio=0.01", 0.92)]),
                              sweep(2, [run("randomk:ratio=0.01", 0.90), run("none", 0.92)]),
                              sweep(2, [run("fp16", 0.921, 2.0), run("topk:ratio=0.01", 0.915)])])
        self.assertEqual([r["spec"] for r in rows], ["none", "randomk:ratio=0.01", "fp16", "topk:ratio=0.01"])
        for r in rows:
            self.assertEqual(r["paired_seeds"], [1, 2], r["spec"])
        fp16 = rows[2]
        self.assertEqual([round(d, 9) for d in fp16["deltas_pp"]], [-0.5, 0.1])

    def test_differing_settings_are_refused(self):
        with self.assertRaises(ValueError) as ctx:
            seeds.combine([sweep(1, [run("none", 0.9)], path="a.json"),
                           sweep(2, [run("none", 0.9)], path="b.json", lr=0.1)])
        self.assertIn("'lr'", str(ctx.exception))
        self.assertIn("a.json", str(ctx.exception))
        self.assertIn("b.json", str(ctx.exception))

    def test_csv_holds_one_row_per_compressor(self):
        rows = seeds.combine([sweep(1, [run("none", 0.90), run("fp16", 0.905, 2.0)]),
                              sweep(2, [run("none", 0.91), run("fp16", 0.905, 2.0)])])
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "accuracy.csv")
            seeds.write_csv(rows, path)
            with open(path) as f:
                got = list(csv.DictReader(f))
        self.assertEqual([r["spec"] for r in got], ["none", "fp16"])
        self.assertEqual(got[1]["seeds"], "1 2")
        self.assertTrue(math.isclose(float(got[1]["delta_pp_mean"]), 0.0, abs_tol=1e-9))
        self.assertEqual(got[1]["n_seeds"], "2")


class CombineCliTest(unittest.TestCase):
    def _write(self, folder, sweep_obj):
        os.makedirs(folder)
        with open(os.path.join(folder, "accuracy.json"), "w") as f:
            json.dump({"meta": sweep_obj["meta"], "runs": sweep_obj["runs"]}, f)

    def test_combine_writes_csv_and_png(self):
        with tempfile.TemporaryDirectory() as tmp:
            self._write(os.path.join(tmp, "s1"), sweep(1, [run("none", 0.90), run("fp16", 0.899, 2.0)]))
            self._write(os.path.join(tmp, "s2"), sweep(2, [run("none", 0.91), run("fp16", 0.911, 2.0)]))
            out = os.path.join(tmp, "out")
            r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "accuracy", "run.py"), "--combine",
                                os.path.join(tmp, "s1"), os.path.join(tmp, "s2"), "--out", out],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("+0.00 ± 0.10 pp", r.stdout)
            self.assertTrue(os.path.exists(os.path.join(out, "accuracy.csv")))
            with open(os.path.join(out, "accuracy.png"), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_combine_refuses_mismatch_with_a_message(self):
        with tempfile.TemporaryDirectory() as tmp:
            self._write(os.path.join(tmp, "s1"), sweep(1, [run("none", 0.90)]))
            self._write(os.path.join(tmp, "s2"), sweep(2, [run("none", 0.91)], epochs=3))
            r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "accuracy", "run.py"), "--combine",
                                os.path.join(tmp, "s1"), os.path.join(tmp, "s2"), "--out", os.path.join(tmp, "o")],
                               capture_output=True, text=True, timeout=120)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("'epochs'", r.stderr)


if __name__ == "__main__":
    unittest.main()
