"""The small model and the data the strata.torch tests train: one definition for every test
file (import it as `from mlp import data, make_mlp`; pytest puts this folder on sys.path)."""

import torch
from torch import nn


def make_mlp() -> nn.Sequential:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 32), nn.GELU(),
                         nn.Linear(32, 4))


def data(rows: int = 64):
    """`rows` inputs of 16 features and targets of 4, the same for every caller and rank."""
    g = torch.Generator().manual_seed(7)
    return torch.randn(rows, 16, generator=g), torch.randn(rows, 4, generator=g)
