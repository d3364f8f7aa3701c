"""Nastya's normalised direction Δ/(γ·n) with several optimizer parameter groups of different client learning
rates: each parameter is divided by its own group's γ (Malinovsky, Mishchenko, Richtárik, Alg. 1, l. 8: g_{t,m} is
the mean of the local gradients), checked against NumPy."""

from __future__ import annotations

import math

import pytest
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


def test_49_overflow_safe_norms_match_numpy_where_float32_squares_overflow():
    """‖t‖₂ of float32 tensors whose squares overflow float32 (entries 4e19, 3e38), against NumPy in float64 on the
    same float32 values; zeros and empty tensors give 0, a NaN stays NaN."""
    import numpy as np

    from lightning_fed.client.update import overflow_safe_norms

    rng = np.random.default_rng(0)
    values = [rng.normal(size=(3, 4)).astype(np.float32) * np.float32(4e19),
              np.array([3e38, -3e38, 1.0], dtype=np.float32), rng.normal(size=5).astype(np.float32),
              np.zeros(3, dtype=np.float32), np.zeros(0, dtype=np.float32)]
    got = overflow_safe_norms([torch.from_numpy(v) for v in values])
    want = [float(np.sqrt(np.sum(v.astype(np.float64) ** 2))) for v in values]
    assert got.dtype == torch.float64 and got.tolist() == pytest.approx(want, rel=1e-14)
    assert math.isinf(float(torch.stack(torch._foreach_norm([torch.from_numpy(values[0])]))[0]))  # float32's own
    assert math.isnan(overflow_safe_norms([torch.tensor([float("nan"), 1.0])]).item())
