#!/usr/bin/env python3
"""bench/accuracy/report.plot: a sweep whose python lacks matplotlib warns and goes on (False) instead of raising
after its CSV and JSON are written (a 2-seed LM sweep lost its second seed that way); any other import error, and
any other failure of the plot, still raises. No training; a second."""
import contextlib
import io
import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "accuracy"))
import report  # noqa: E402


def missing(module):
    def write_png(rows, path, title):
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)
    return write_png


class PlotFallbackTest(unittest.TestCase):
    def test_missing_matplotlib_warns_and_returns_false(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertFalse(report.plot(missing("matplotlib.pyplot"), [], "out/accuracy.png", "t"))
        self.assertIn("out/accuracy.png", err.getvalue())
        self.assertIn("matplotlib is not installed", err.getvalue())

    def test_other_import_errors_propagate(self):
        with self.assertRaises(ImportError):
            report.plot(missing("numpy"), [], "out/accuracy.png", "t")

    def test_a_plot_that_fails_otherwise_propagates(self):
        def broken(rows, path, title):
            raise ValueError("bad rows")
        with self.assertRaises(ValueError):
            report.plot(broken, [], "out/accuracy.png", "t")

    def test_a_plot_that_works_returns_true(self):
        calls = []
        self.assertTrue(report.plot(lambda r, p, t: calls.append((p, t)), [], "a.png", "title"))
        self.assertEqual(calls, [("a.png", "title")])


if __name__ == "__main__":
    unittest.main()
