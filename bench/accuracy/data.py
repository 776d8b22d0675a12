"""Fashion-MNIST from Debian's dataset-fashion-mnist package: IDX files read with numpy and gzip.

The loader knows nothing about ranks; sharding and ordering live in the trainer so that every compressor sees the same
sample order (see epoch_order()).
"""
from __future__ import annotations

import gzip
import os
import struct

import numpy as np

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# Mean and standard deviation of the training images' pixels in [0, 1].
MEAN, STD = 0.2860, 0.3530


def _read_idx(path: str) -> np.ndarray:
    """Reads one (optionally gzipped) IDX file into a numpy array of its declared shape (uint8 data only)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for an IDX header")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not a uint8 IDX file (magic 0x{zero:04x}, type 0x{dtype_code:02x})")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    count = int(np.prod(dims))
    body = raw[4 + 4 * ndim:]
    if len(body) != count:
        raise ValueError(f"{path}: header says {dims} = {count} bytes, file has {len(body)}")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


def find_dir(path: str | None = None) -> str:
    """The folder holding the four IDX files: `path`, $FASHION_MNIST_DIR, or Debian's install location."""
    candidates = [p for p in (path, os.environ.get("FASHION_MNIST_DIR"), DEFAULT_DIR) if p]
    for d in candidates:
        if os.path.exists(os.path.join(d, "train-images-idx3-ubyte.gz")) or \
           os.path.exists(os.path.join(d, "train-images-idx3-ubyte")):
            return d
    raise FileNotFoundError(
        f"Fashion-MNIST not found in {candidates}; install Debian's dataset-fashion-mnist "
        "(scripts/deps.sh does) or set FASHION_MNIST_DIR")


def load(split: str, path: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [N,1,28,28] normalised, labels int64 [N]) for split 'train' or 't10k'."""
    d = find_dir(path)

    def pick(stem: str) -> str:
        p = os.path.join(d, stem)
        return p + ".gz" if os.path.exists(p + ".gz") else p

    images = _read_idx(pick(f"{split}-images-idx3-ubyte"))
    labels = _read_idx(pick(f"{split}-labels-idx1-ubyte"))
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{split}: {images.shape[0]} images but {labels.shape[0]} labels")
    x = (images.astype(np.float32) / 255.0 - MEAN) / STD
    return x.reshape(-1, 1, 28, 28), labels.astype(np.int64)


def subset(n_total: int, n: int | None, seed: int) -> np.ndarray:
    """A fixed, class-agnostic random subset of n indices out of n_total (all of them, in order, when n is None)."""
    if n is None or n >= n_total:
        return np.arange(n_total)
    return np.sort(np.random.default_rng(seed).permutation(n_total)[:n])


def epoch_order(indices: np.ndarray, epoch: int, seed: int) -> np.ndarray:
    """The global sample order of one epoch: a permutation of `indices` that depends only on (seed, epoch)."""
    return indices[np.random.default_rng([seed, epoch]).permutation(len(indices))]
