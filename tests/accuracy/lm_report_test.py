#!/usr/bin/env python3
"""bench/accuracy/lm_report.py on synthetic `--task lm` rows: Δ in % of dense's validation loss, and (run.py
--link) the training time to dense's final validation loss: the first evaluation at or below it, "never" where no
evaluation reaches it, nothing without a dense row. No training; a second."""
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))
import lm_report  # noqa: E402


def row(spec, evals, ratio=1.0):
    """A finished row whose validation evaluations are (train_s, bpb) pairs; its val_bpb is the last."""
    return {"spec": spec, "status": "ok", "val_bpb": evals[-1][1], "compression_ratio": ratio,
            "payload_bytes_per_step": 1e3, "wire_bytes_per_step": 1.5e3, "time_per_100_steps_s": 60.0,
            "evals": [{"step": 100 * (i + 1), "train_s": t, "bpb": b} for i, (t, b) in enumerate(evals)]}


class LmReportTest(unittest.TestCase):
    def test_time_to_dense_loss(self):
        rows = [row("none", [(100.0, 3.0), (200.0, 2.5), (300.0, 2.0)]),
                row("onebit:exchange=momentum", [(40.0, 2.9), (80.0, 2.0), (120.0, 1.9)], 4.0),  # reaches 2.0 at 80 s
                row("topk:ratio=0.01", [(50.0, 3.5), (100.0, 2.8), (150.0, 2.01)], 47.0),       # never reaches 2.0
                {"spec": "dgc", "status": "failed", "error": "stopped"}]
        lm_report.annotate(rows)
        self.assertEqual(rows[0]["time_to_dense_loss_s"], 300.0)   # dense reaches its own final loss at its end
        self.assertEqual(rows[1]["time_to_dense_loss_s"], 80.0)
        self.assertIsNone(rows[2]["time_to_dense_loss_s"])
        self.assertAlmostEqual(rows[1]["delta_pct"], -5.0, places=9)
        self.assertNotIn("time_to_dense_loss_s", rows[3])
        text = lm_report.table(rows, with_link=True)
        self.assertIn("time to dense loss", text)
        lines = text.splitlines()
        self.assertTrue(lines[2].rstrip().endswith("300 s"), lines[2])
        self.assertTrue(lines[3].rstrip().endswith("80 s"), lines[3])
        self.assertTrue(lines[4].rstrip().endswith("never"), lines[4])
        self.assertIn("FAILED: stopped", lines[5])
        self.assertNotIn("time to dense loss", lm_report.table(rows, with_link=False))

    def test_no_dense_row(self):
        rows = [row("onebit", [(10.0, 2.0)])]
        lm_report.annotate(rows)
        self.assertIsNone(rows[0]["delta_pct"])
        self.assertIsNone(rows[0]["time_to_dense_loss_s"])


if __name__ == "__main__":
    unittest.main()
