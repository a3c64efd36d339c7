"""Shared torch cases of the training tests: an indexed data set, a small float64 model and
make_private on one of :func:`training_cases.make_arts`'s records."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset

from mfcli.training.torch import make_private

F = torch.nn.functional


class Indexed(Dataset):
    """Example i is (x_i, y_i, i), so a batch says which examples it holds."""

    def __init__(self, n: int, features: int = 3, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g, dtype=torch.float64)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _model(features: int = 3, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(features, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()


def _setup(arts, kind: str, examples: int = 40, **kw):
    path, rid = arts[kind]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw.setdefault("seed", 3)
    kw.setdefault("clip_norm", 0.5)
    return make_private(model, opt, Indexed(examples), artifact=path, record=rid, loss_fn=F.cross_entropy, **kw)
