#!/usr/bin/env python3
"""bench/accuracy/lm_seeds.py on synthetic `--task lm` sweeps: the paired Δ in % of each seed's own dense validation
loss, its standard error, a failed seed, the refusal to combine sweeps whose settings differ, and the files written."""
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))
import lm_seeds  # noqa: E402

META = dict(task="lm", steps=200, batch=4, lr=3e-3, weight_decay=0.1, layers=4, width=128, heads=4, context=128,
            train_bytes=4_000_000, val_bytes=262_144, val_windows=256, ranks=4, comm="gradcomp")


def run(spec, bpb, ratio=1.0):
    return {"spec": spec, "status": "ok", "val_bpb": bpb, "compression_ratio": ratio, "payload_bytes_per_step": 1e3,
            "wire_bytes_per_step": 1.5e3, "time_per_100_steps_s": 60.0, "model": "transformer", "steps": 200,
            "lr": 3e-3, "ranks": 4, "loss_curve": [[1, 8.0], [2, 4.0]], "evals": [{"step": 2, "bpb": bpb}]}


def sweep(seed, runs, **meta):
    return {"meta": dict(META, seed=seed, **meta), "runs": runs, "path": f"seed-{seed}"}


class LmCombineTest(unittest.TestCase):
    def test_delta_is_percent_of_the_same_seeds_dense(self):
        # Dense moves from 3.0 to 2.0 between seeds; qsgd is 1% and 3% worse than its own seed's dense.
        rows = lm_seeds.combine([sweep(1, [run("none", 3.0), run("qsgd:bits=4", 3.03, 6.0)]),
                                 sweep(2, [run("none", 2.0), run("qsgd:bits=4", 2.06, 6.0)])])
        self.assertEqual([r["spec"] for r in rows], ["none", "qsgd:bits=4"])
        qsgd = rows[1]
        self.assertEqual(qsgd["seeds"], [1, 2])
        self.assertAlmostEqual(qsgd["deltas_pct"][0], 1.0, places=9)
        self.assertAlmostEqual(qsgd["deltas_pct"][1], 3.0, places=9)
        self.assertAlmostEqual(qsgd["delta_pct_mean"], 2.0, places=9)
        self.assertAlmostEqual(qsgd["delta_pct_se"], 1.0, places=9)  # sd of (1, 3) is sqrt(2); / sqrt(2 seeds)
        self.assertAlmostEqual(qsgd["val_bpb_mean"], 2.545, places=9)
        self.assertEqual(rows[0]["deltas_pct"], [0.0, 0.0])

    def test_failed_seed_is_not_averaged(self):
        failed = {"spec": "onebit", "status": "failed", "error": "FloatingPointError: loss is nan"}
        rows = lm_seeds.combine([sweep(1, [run("none", 3.0), run("onebit", 3.3, 20.0)]),
                                 sweep(2, [run("none", 2.0), failed])])
        onebit = rows[1]
        self.assertEqual(onebit["seeds"], [1])
        self.assertAlmostEqual(onebit["delta_pct_mean"], 10.0, places=9)
        self.assertIsNone(onebit["delta_pct_se"])
        self.assertIn("seed 2: FloatingPointError", onebit["error"])
        all_failed = lm_seeds.combine([sweep(1, [run("none", 3.0), failed])])[1]
        self.assertEqual(all_failed["status"], "failed")

    def test_differing_settings_are_refused(self):
        with self.assertRaisesRegex(ValueError, "'steps' is 200 in seed-1 but 300 in seed-2"):
            lm_seeds.combine([sweep(1, [run("none", 3.0)]), sweep(2, [run("none", 2.0)], steps=300)])

    def test_write_combined_writes_table_files(self):
        import json
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for seed, bpbs in ((1, (3.0, 3.01)), (2, (2.9, 2.92))):
                path = os.path.join(tmp, f"seed-{seed}.json")
                s = sweep(seed, [run("none", bpbs[0]), run("fp16", bpbs[1], 2.0)])
                with open(path, "w") as f:
                    json.dump({"meta": s["meta"], "runs": s["runs"]}, f)
                paths.append(path)
            out = os.path.join(tmp, "combined")
            self.assertEqual(lm_seeds.write_combined(paths, out), 0)
            for name in ("accuracy.csv", "accuracy.json", "accuracy.png", "val_curves.png"):
                self.assertTrue(os.path.getsize(os.path.join(out, name)) > 0, name)
            with open(os.path.join(out, "accuracy.csv")) as f:
                text = f.read()
            self.assertIn("fp16", text)


if __name__ == "__main__":
    unittest.main()
