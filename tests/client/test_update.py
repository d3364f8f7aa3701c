"""Nastya's normalised direction Δ/(γ·n) with several optimizer parameter groups of different client learning
rates: each parameter is divided by its own group's γ (Malinovsky, Mishchenko, Richtárik, Alg. 1, l. 8: g_{t,m} is
the mean of the local gradients), checked against NumPy."""

from __future__ import annotations

import math
import torch
from lightning_fed.client import parameter_client_lrs
GAMMA_W, GAMMA_B = 0.05, 0.2  # client learning rates of the weight group and of the bias group


def test_parameter_client_lrs_maps_groups_and_flags_missing_or_conflicting():
    a, b, c, d = (torch.nn.Parameter(torch.zeros(1)) for _ in range(4))
    groups = [[{"params": [a]}, {"params": [b, d]}], [{"params": [d]}]]
    lrs = parameter_client_lrs([a, b, c, d], groups, [[0.1, 0.2], [0.3]])
    assert lrs[:2] == [0.1, 0.2]
    assert math.isnan(lrs[2]) and math.isnan(lrs[3])  # c in no group; d in groups of 0.2 and 0.3
    assert parameter_client_lrs([d], groups, [[0.1, 0.3], [0.3]]) == [0.3]  # same rate twice is fine
