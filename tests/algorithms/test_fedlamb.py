"""MaxSecondMoment (Karimi et al., Alg. 1, l. 16) as a stage against NumPy: Δ_t the weighted mean of the deltas,
v̂ ← max(v̂, Σ w_i v_i), m̄ ← Σ w_i m_i; FedAMS/FedLAMB's server is that stage composed with the SGD rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import FedAMS
from lightning_fed.server.aggregators import ClientDeltas, MaxSecondMoment, RoundInfo
from lightning_fed.server.rules import SGD


def _round(rng, sizes):
    return [ClientUpdate(i, [torch.tensor(rng.normal(size=3))], num_samples=n, num_steps=1, loss=0.0,
                         extras={"exp_avg_sq": [torch.tensor(rng.uniform(0, 2, size=3))],
                                 "exp_avg": [torch.tensor(rng.normal(size=3))]})
            for i, n in enumerate(sizes)]


def test_stage_matches_numpy_over_two_rounds():
    rng = np.random.default_rng(0)
    stage = MaxSecondMoment(initial_second_moment=0.3, average_first_moment=True)
    state = stage.init_state([torch.zeros(3, dtype=torch.float64)])
    v_hat, m_bar = np.full(3, 0.3), np.zeros(3)
    for t, sizes in enumerate([(1, 4, 2), (3, 3)]):
        updates = _round(rng, sizes)
        counts = torch.tensor([float(n) for n in sizes], dtype=torch.float64)
        x = ClientDeltas([u.client_id for u in updates], [u.delta for u in updates], counts, updates)
        delta, state = stage.apply(x, state, RoundInfo(t, 0, 3, len(sizes)))
        w = np.array(sizes, float) / sum(sizes)
        stack = lambda key: np.stack([u.extras[key][0].numpy() for u in updates])  # noqa: E731
        np.testing.assert_allclose(delta[0].numpy(), w @ np.stack([u.delta[0].numpy() for u in updates]), rtol=1e-14)
        v_hat = np.maximum(v_hat, w @ stack("exp_avg_sq"))
        m_bar = w @ stack("exp_avg")
        np.testing.assert_allclose(state.second_moment[0].numpy(), v_hat, rtol=1e-14)
        np.testing.assert_allclose(state.first_moment[0].numpy(), m_bar, rtol=1e-14)


def test_fedams_is_the_stage_with_sgd():
    server = FedAMS(lr=0.5, eps=1e-3)
    assert isinstance(server.server_rule, SGD) and server.server_rule.lr == 0.5
    assert server.aggregators == [server.moment_stage] and server.moment_stage.initial_second_moment == 1e-3
    updates = [ClientUpdate(0, [torch.tensor([1.0])], 1, 1, 0.0, extras={"exp_avg_sq": [torch.tensor([4.0])]}),
               ClientUpdate(1, [torch.tensor([3.0])], 1, 1, 0.0, extras={"exp_avg_sq": [torch.tensor([0.0])]})]
    params = [torch.tensor([1.0])]
    server.server_update(params, updates)
    assert params[0].item() == 2.0 and server.state["second_moment"][0].item() == 2.0  # 1 + 0.5·2; max(1e-3, 2)


def test_stage_needs_the_clients_moments():
    u = ClientUpdate(0, [torch.ones(1)], 1, 1, 0.0)
    x = ClientDeltas([0], [u.delta], torch.ones(1, dtype=torch.float64), [u])
    with pytest.raises(ValueError, match=r"client 0's update has no `extras\['exp_avg_sq'\]`"):
        MaxSecondMoment().apply(x, MaxSecondMoment.State(), RoundInfo(0, 0, 1, 1))
    with pytest.raises(ValueError, match="needs `ClientDeltas.updates`"):
        MaxSecondMoment().apply(x._replace(updates=None), MaxSecondMoment.State(), RoundInfo(0, 0, 1, 1))
