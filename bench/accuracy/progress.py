"""The live progress line of bench/accuracy/run.py: renders the ranks' '@@' events (start, progress, eval, result,
failed) of both tasks, one line per run, rewritten in place on a terminal."""
from __future__ import annotations

import sys

import report


class Progress:
    """Renders the ranks' '@@' events: one live line per run (rewritten in place on a terminal)."""

    def __init__(self, total: int, quiet: bool):
        self.total = total
        self.quiet = quiet
        self.tty = sys.stdout.isatty()
        self.count = 0
        self.open_line = False

    def line(self, text: str, final: bool = False) -> None:
        if self.quiet and not final:
            return
        if self.tty:
            sys.stdout.write("\r\033[K" + text + ("\n" if final else ""))
            self.open_line = not final
        else:
            sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def passthrough(self, text: str) -> None:
        if self.open_line:
            sys.stdout.write("\n")
            self.open_line = False
        sys.stdout.write(text)
        sys.stdout.flush()

    def event(self, ev: dict) -> None:
        kind = ev["event"]
        tag = f"[{self.count + 1}/{self.total}] {ev.get('spec', '')}"
        if kind == "start":
            codec = ev.get("codec_spec", ev.get("spec"))
            self.line(f"{tag}: {ev['params']:,} parameters, {ev['steps']} steps of {ev['global_batch']} "
                      f"{ev.get('unit', 'images')}, {ev.get('optimizer') or 'SGD momentum %g' % ev['momentum']}, "
                      f"via {ev['comm']}"
                      + (f" (codec spec {codec})" if codec != ev.get("spec") else ""))
        elif kind == "progress":
            sent = (f"sent {report.human_bytes(ev['wire_bytes'])}" if ev.get("wire_bytes") is not None
                    else f"payload {report.human_bytes(ev['payload_bytes'])}")
            self.line(f"{tag}  epoch {ev['epoch']}/{ev['epochs']}  step {ev['step']}/{ev['steps']}  "
                      f"loss {ev['loss']:.4f}  {sent}  {ev['train_s']:.1f} s")
        elif kind == "eval":
            self.line(f"{tag}  step {ev['step']}  " + (f"validation {ev['bpb']:.4f} bits/byte" if "bpb" in ev
                                                        else f"test accuracy {100 * ev['acc']:.2f}%"))
        elif kind == "result":
            self.count += 1
            metric = (f"validation {ev['val_bpb']:.4f} bits/byte" if "val_bpb" in ev
                      else f"test accuracy {100 * ev['test_acc']:.2f}%")
            pace = (f"{ev['time_per_100_steps_s']:.1f} s/100 steps" if "val_bpb" in ev
                    else f"{ev['time_per_epoch_s']:.1f} s/epoch")
            self.line(f"{tag}  done: {metric}, ratio "
                      f"{ev['compression_ratio']:.1f}x, payload {report.human_bytes(ev['payload_bytes_per_step'])}"
                      f"/step, {pace}", final=True)
        elif kind == "failed":
            self.count += 1
            self.line(f"{tag}  FAILED: {ev['error']}", final=True)
