"""The byte-level language-model corpus of `run.py --task lm`: the Python standard library's own .py sources, as
Debian's python3.11 package ships them (/usr/lib/python3.11, or $LM_CORPUS_DIR), read as raw bytes (vocabulary 256).

Split rule (by file, fixed): a file whose path relative to the corpus root (with '/' separators) has
int(sha1(path).hexdigest(), 16) % 10 == 0 is validation, every other file is training. site-packages and
dist-packages are skipped (third-party code, and it differs between machines). Files are taken in the order of that
same hash (a fixed shuffle, so a byte cap does not keep only the alphabetically first modules) and appended until the
split's cap is reached; the last file is cut at the cap.

Batches: global step s draws B * world window offsets from numpy.random.default_rng([seed, s]) over the training
bytes and rank r takes offsets [r*B, (r+1)*B): the same for every compressor.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

DEFAULT_DIR = "/usr/lib/python3.11"
SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")


def find_dir(path: str | None = None) -> str:
    """The corpus root: `path`, $LM_CORPUS_DIR, or Debian's python3.11 lib directory; raises when it has no .py."""
    root = path or os.environ.get("LM_CORPUS_DIR") or DEFAULT_DIR
    if not os.path.isdir(root):
        raise FileNotFoundError(f"LM corpus folder {root} not found: install Debian's python3.11 (or set "
                                "LM_CORPUS_DIR to a folder of .py files)")
    return root


def file_hash(rel: str) -> int:
    """The split/order hash of a corpus file: sha1 of its relative path (with '/'), as an integer."""
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16)


def list_files(root: str) -> list[str]:
    """Relative paths of the corpus's .py files (site-packages, dist-packages skipped), in hash order."""
    rels = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                rels.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return sorted(rels, key=lambda r: (file_hash(r), r))


def is_validation(rel: str) -> bool:
    """The fixed split rule: sha1(relative path) mod 10 == 0 -> validation."""
    return file_hash(rel) % 10 == 0


def load(split: str, max_bytes: int, path: str | None = None) -> tuple[np.ndarray, int]:
    """(the split's bytes as a uint8 array of at most `max_bytes`, the number of files used). `split` is 'train' or
    'val'."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not '{split}'")
    root = find_dir(path)
    chunks, size, files = [], 0, 0
    for rel in list_files(root):
        if is_validation(rel) != (split == "val"):
            continue
        with open(os.path.join(root, rel), "rb") as f:
            blob = f.read(max_bytes - size)
        chunks.append(blob)
        size += len(blob)
        files += 1
        if size >= max_bytes:
            break
    if size == 0:
        raise ValueError(f"no {split} bytes in {root}")
    return np.frombuffer(b"".join(chunks), dtype=np.uint8).copy(), files


def batch_offsets(n_bytes: int, context: int, step: int, seed: int, rank: int, world: int, batch: int) -> np.ndarray:
    """Start offsets of this rank's `batch` training windows (context + 1 bytes each) at global step `step`."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, n_bytes - context - 1, size=batch * world)
    return starts[rank * batch:(rank + 1) * batch]


def windows(data: np.ndarray, starts: np.ndarray, context: int):
    """(inputs, targets) int64 tensors of shape (len(starts), context): bytes [s, s+context) and [s+1, s+context+1)."""
    import torch
    idx = starts[:, None] + np.arange(context + 1)[None, :]
    block = torch.from_numpy(data[idx].astype(np.int64))
    return block[:, :-1], block[:, 1:]


def val_starts(n_bytes: int, context: int, count: int) -> np.ndarray:
    """The validation windows: up to `count` non-overlapping windows from the start of the validation bytes."""
    count = min(count, (n_bytes - 1) // context)
    return np.arange(count, dtype=np.int64) * context
