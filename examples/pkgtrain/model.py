"""The model and its synthetic data (random weights, random batches: nothing is downloaded)."""

from __future__ import annotations

import torch
import torch.nn as nn


def build_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(256, hidden), nn.ReLU(), nn.Linear(hidden, 256), nn.ReLU(), nn.Linear(256, 10))


def batch(rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    return torch.randn(size, 256, generator=gen), torch.randint(0, 10, (size,), generator=gen)
