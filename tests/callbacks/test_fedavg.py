"""Aggregation precision: the weighted sum of client deltas is accumulated in float64 and rounded once
(:meth:`ServerOptimizer.aggregate`), checked against exact rational arithmetic (``fractions.Fraction``)."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import FedAvg


def _round_to_float32(q: Fraction) -> np.float32:
    """The float32 nearest to the rational ``q``, ties to even (IEEE round-to-nearest), found among the float64
    guess's float32 neighbours with exact arithmetic."""
    guess = np.float32(float(q))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - q), int(c.view(np.uint32)) & 1))


def _updates(deltas, sizes):
    return [
        ClientUpdate(client_id=i, delta=[torch.from_numpy(d)], num_samples=n, num_steps=1, loss=0.0)
        for i, (d, n) in enumerate(zip(deltas, sizes))
    ]


def test_float32_average_of_clients_with_1_and_2_samples_is_the_exact_mean_rounded_once():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(2000).astype(np.float32)
    b = rng.standard_normal(2000).astype(np.float32)
    got = FedAvg().aggregate(_updates([a, b], [1, 2]))[0]
    assert got.dtype == torch.float32
    exact = np.array([_round_to_float32((Fraction(float(x)) + 2 * Fraction(float(y))) / 3) for x, y in zip(a, b)])
    # Rounding twice in float32 (w₁·a, then + w₂·b, as a float32 accumulation does) misses the exact value here:
    w = np.float32(1.0) / np.float32(3.0)
    twice = (a * w + b * (np.float32(2.0) * w)).astype(np.float32)
    assert (twice != exact).sum() > 100
    np.testing.assert_array_equal(got.numpy(), exact)


def test_float32_three_clients_and_uniform_weighting_are_exact():
    rng = np.random.default_rng(1)
    deltas = [rng.standard_normal(500).astype(np.float32) for _ in range(3)]
    sizes = [1, 2, 4]
    got = FedAvg().aggregate(_updates(deltas, sizes))[0].numpy()
    total = sum(sizes)
    exact = [
        _round_to_float32(sum(n * Fraction(float(d[k])) for n, d in zip(sizes, deltas)) / total)
        for k in range(500)
    ]
    np.testing.assert_array_equal(got, np.array(exact, dtype=np.float32))
    got_u = FedAvg(weighting="uniform").aggregate(_updates(deltas, sizes))[0].numpy()
    exact_u = [_round_to_float32(sum(Fraction(float(d[k])) for d in deltas) / 3) for k in range(500)]
    np.testing.assert_array_equal(got_u, np.array(exact_u, dtype=np.float32))


def test_float64_model_is_the_float64_weighted_sum():
    rng = np.random.default_rng(2)
    deltas = [rng.standard_normal(50) for _ in range(3)]
    sizes = [3, 1, 7]
    got = FedAvg().aggregate(_updates(deltas, sizes))[0]
    assert got.dtype == torch.float64
    want = (sizes[0] * deltas[0] + sizes[1] * deltas[1] + sizes[2] * deltas[2]) / sum(sizes)
    np.testing.assert_allclose(got.numpy(), want, rtol=4e-16, atol=0)  # float64 rounding (torch may fuse a·x + y)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_models_are_rounded_once(dtype):
    a = torch.tensor([0.1, 1.0, -3.0, 7.0], dtype=dtype)
    b = torch.tensor([0.2, 1.0 + 2**-7, 5.0, 0.3], dtype=dtype)
    updates = [
        ClientUpdate(client_id=0, delta=[a], num_samples=1, num_steps=1, loss=0.0),
        ClientUpdate(client_id=1, delta=[b], num_samples=2, num_steps=1, loss=0.0),
    ]
    got = FedAvg().aggregate(updates)[0]
    assert got.dtype == dtype
    want = ((a.double() + 2 * b.double()) / 3).to(dtype)  # exact in float64 up to one rounding, then once to dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
