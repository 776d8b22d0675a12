"""The two models of the benchmark: a small MLP for the quick demo and a CNN for --full."""
from __future__ import annotations

import torch
from torch import nn


def mlp() -> nn.Module:
    """784-128-10 MLP (~100K parameters): the quick demo's model (83% test accuracy after one pass over 16K images
    in 500 steps)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn() -> nn.Module:
    """Two 3x3 conv layers (16, 32 channels, padded) with max-pooling, then 1568-128-10 with dropout (~207K
    parameters, ~1.2M multiply-adds per image: cheap enough for CPU ranks): the --full model."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 28x28 -> 14x14
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 14x14 -> 7x7
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))


MODELS = {"mlp": mlp, "cnn": cnn}


def build(name: str, seed: int) -> nn.Module:
    """The named model with weights initialised from `seed` alone (identical on every rank and every run)."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}' (choose from {', '.join(MODELS)})")
    torch.manual_seed(seed)
    return MODELS[name]()
