"""bench/peers/peer_table.py: with --repeat, each gradcomp run is compared with Horovod's run of the same round."""
import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "peers" / "peer_table.py"


def row(framework, compression, s_per_step, label="1gbit"):
    return {"framework": framework, "model": "mlp", "compression": compression, "ranks": 4, "batch_per_rank": 8,
            "s_per_step": s_per_step, "samples_per_s": 32 / s_per_step, "final_loss": 0.5, "label": label}


def table(tmp_path, rows):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(SCRIPT), str(path)], check=True, capture_output=True, text=True).stdout
    return [line.split(" | ") for line in out.splitlines()[2:]]


def test_rounds_pair_with_their_own_horovod_row(tmp_path):
    lines = table(tmp_path, [row("horovod", "none", 5.0), row("gradcomp", "none", 4.0),
                             row("horovod", "none", 2.0), row("gradcomp", "none", 4.0)])
    assert [line[6] for line in lines] == ["–", "1.25x", "–", "0.50x"]


def test_unshaped_fraction_pairs_by_round_and_a_single_peer_serves_every_round(tmp_path):
    lines = table(tmp_path, [row("gradcomp", "none", 1.0, "none"), row("gradcomp", "none", 2.0, "none"),
                             row("gradcomp", "none", 4.0), row("gradcomp", "none", 4.0),
                             row("horovod", "fp16", 2.0), row("gradcomp", "fp16", 1.0), row("gradcomp", "fp16", 4.0)])
    assert [line[7].rstrip(" |") for line in lines[2:4]] == ["0.25", "0.50"]
    assert [line[6] for line in lines[5:7]] == ["2.00x", "0.50x"]
