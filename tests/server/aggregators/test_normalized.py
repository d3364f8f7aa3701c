"""NormalizedDirections (Nastya, Malinovsky et al., Alg. 1, l. 8-9) against NumPy: Δ_i/(γ_g·K_i) per parameter
group, zero-step clients weight 0; the Normalized* server optimizers are that stage composed with a rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import NormalizedFedAdam, ServerStepSize
from lightning_fed.server.aggregators import (
    ClientDeltas, EmptyState, NormalizedDirections, RoundInfo, WeightedMean, run_chain,
)


def _round(seed=0):
    rng = np.random.default_rng(seed)
    lrs = [0.1, 0.03]  # two parameter groups: a [2, 3] weight and a [3] bias
    steps = [3, 0, 5, 1]
    sizes = [4, 9, 2, 7]
    updates = [ClientUpdate(i, [torch.tensor(rng.normal(size=(2, 3))), torch.tensor(rng.normal(size=3))],
                            num_samples=n, num_steps=k, loss=0.0, client_lrs=list(lrs))
               for i, (k, n) in enumerate(zip(steps, sizes))]
    return updates, lrs, np.array(steps, float), np.array(sizes, float)


@pytest.mark.parametrize("uniform", [True, False])
def test_stage_matches_numpy_per_group(uniform):
    updates, lrs, steps, sizes = _round()
    counts = np.ones(4) if uniform else sizes
    x = ClientDeltas([u.client_id for u in updates], [u.delta for u in updates], torch.tensor(counts), updates)
    out, state = NormalizedDirections().apply(x, EmptyState(), RoundInfo(0, 0, 4, 4))
    assert state == EmptyState()
    want_counts = counts * (steps > 0)
    np.testing.assert_array_equal(out.counts.numpy(), want_counts)
    for i, u in enumerate(updates):
        for j, (d, lr) in enumerate(zip(u.delta, lrs)):
            want = d.numpy() / (lr * steps[i]) if steps[i] > 0 else np.zeros_like(d.numpy())
            np.testing.assert_allclose(out.deltas[i][j].numpy(), want, rtol=1e-15, atol=0)
    delta_t, _ = run_chain([NormalizedDirections(), WeightedMean()], x, (EmptyState(), EmptyState()),
                           RoundInfo(0, 0, 4, 4))
    w = want_counts / want_counts.sum()
    for j, lr in enumerate(lrs):
        want = sum(w[i] * updates[i].delta[j].numpy() / (lr * steps[i]) for i in range(4) if steps[i] > 0)
        np.testing.assert_allclose(delta_t[j].numpy(), want, rtol=1e-13, atol=1e-15)


def test_server_optimizers_report_the_stage_weights_and_step_with_the_rule():
    updates, lrs, steps, _ = _round(seed=1)
    server = ServerStepSize(lr=0.5)
    np.testing.assert_array_equal(server.client_weights(updates).numpy(), (steps > 0) / (steps > 0).sum())
    params = [torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)]
    server.server_update(params, updates)
    for j, lr in enumerate(lrs):
        g = sum(updates[i].delta[j].numpy() / (lr * steps[i]) for i in range(4) if steps[i] > 0) / 3
        np.testing.assert_allclose(params[j].numpy(), 0.5 * g, rtol=1e-13)
    # the logged diversity is computed on the normalised directions Δ_i/(γ·K_i)
    assert [type(s).__name__ for s in NormalizedFedAdam().aggregators] == ["NormalizedDirections", "WeightedMean"]
    np.testing.assert_allclose(server.client_delta(updates[0])[1].numpy(), updates[0].delta[1].numpy() / (lrs[1] * 3))


def test_errors_are_named():
    updates, _, _, _ = _round()
    x = ClientDeltas([0], [updates[0].delta], torch.ones(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="`ClientDeltas.updates`"):
        NormalizedDirections().apply(x, EmptyState(), RoundInfo(0, 0, 1, 1))
    idle = [updates[1]]
    with pytest.raises(ValueError, match="No client in the round took a local step"):
        ServerStepSize(lr=1.0).client_weights(idle)
