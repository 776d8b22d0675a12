"""The byte-level decoder-only transformer of `run.py --task lm` (torch.nn only): byte embedding + learned position
embedding, `layers` pre-LayerNorm blocks (causal multi-head self-attention, 4x GELU MLP), a final LayerNorm and an
untied 256-way output layer. No dropout: every run is deterministic given the seed."""
from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, context: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads) + self.mask[:t, :t]
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, context)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ByteTransformer(nn.Module):
    """Maps (batch, t) int64 bytes, t <= context, to (batch, t, 256) next-byte logits."""

    def __init__(self, layers: int = 4, width: int = 128, heads: int = 4, context: int = 128):
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(256, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads, context) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, 256)
        # N(0, 1/sqrt(width)) weights, residual projections scaled by 1/sqrt(2 * layers) (GPT-2's scheme, with
        # GPT-2's fixed 0.02 replaced by 1/sqrt(width): in a single-process pilot at width 128 (AdamW 3e-3, 16 x 128
        # bytes per step) 0.02 was 0.48 bits per byte behind 0.08 on validation at step 80, and 0.14 0.18 behind at
        # step 40).
        base = 1.0 / math.sqrt(width)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = base / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight")) else base
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.embed(x) + self.pos(torch.arange(t, device=x.device))[None]
        return self.head(self.ln(self.blocks(h)))


def build(seed: int, layers: int, width: int, heads: int, context: int) -> ByteTransformer:
    """The model with weights from `seed` alone (identical on every rank and for every compressor)."""
    torch.manual_seed(seed)
    return ByteTransformer(layers, width, heads, context)


def loss_nats(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-byte cross-entropy in nats (divide by ln 2 for bits per byte)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)
