"""ScaffoldControl (Karimireddy et al. 2020, Alg. 1, l. 14-17) as a stage against NumPy: Δx the mean of Δy_i,
c ← c + (1/N)·ΣΔc_i, c_i ← c_i + Δc_i; SCAFFOLD is that stage composed with the SGD rule (η_g)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import SCAFFOLD
from lightning_fed.server.aggregators import ClientDeltas, RoundInfo, ScaffoldControl
from lightning_fed.server.rules import SGD


def _updates(rng, ids):
    return [ClientUpdate(i, [torch.tensor(rng.normal(size=(2, 2))), torch.tensor(rng.normal(size=2))],
                         num_samples=i + 1, num_steps=1, loss=0.0,
                         extras={"delta_control": [torch.tensor(rng.normal(size=(2, 2))), torch.tensor(rng.normal(size=2))]})
            for i in ids]


def _flat(tensors):
    return np.concatenate([t.numpy().ravel() for t in tensors])


def test_stage_matches_numpy_over_two_rounds():
    rng = np.random.default_rng(0)
    n = 5
    stage = ScaffoldControl(num_clients=n)
    state = stage.init_state([torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)], n)
    c, ci = np.zeros(6), np.zeros((n, 6))
    for t, ids in enumerate([(0, 3), (3, 4, 1)]):
        updates = _updates(rng, ids)
        counts = torch.tensor([float(u.num_samples) for u in updates], dtype=torch.float64)
        x = ClientDeltas(list(ids), [u.delta for u in updates], counts, updates)
        delta, state = stage.apply(x, state, RoundInfo(t, 0, n, len(ids)))
        w = counts.numpy() / counts.sum().item()
        np.testing.assert_allclose(_flat(delta), sum(wi * _flat(u.delta) for wi, u in zip(w, updates)), rtol=1e-14)
        for u in updates:
            dc = _flat(u.extras["delta_control"])
            c += dc / n
            ci[u.client_id] += dc
        np.testing.assert_allclose(_flat(state.control), c, rtol=1e-14, atol=1e-15)
        for i in range(n):
            np.testing.assert_allclose(state.table.get(i).numpy(), ci[i], rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(_flat(state.control), ci.mean(axis=0), rtol=1e-13)  # c = mean_i c_i


def test_scaffold_is_the_stage_with_sgd():
    server = SCAFFOLD(lr=0.5)
    server.num_clients = 4
    assert isinstance(server.server_rule, SGD) and server.server_rule.lr == 0.5
    assert server.aggregators == [server.control_stage] and server.control_stage.num_clients == 4
    updates = [ClientUpdate(0, [torch.tensor([1.0])], 1, 1, 0.0, extras={"delta_control": [torch.tensor([2.0])]}),
               ClientUpdate(3, [torch.tensor([3.0])], 1, 1, 0.0, extras={"delta_control": [torch.tensor([-6.0])]})]
    params = [torch.tensor([1.0])]
    server.server_update(params, updates)
    assert params[0].item() == 2.0  # 1 + 0.5·(1 + 3)/2
    assert server.state["control"][0].item() == -1.0 and server.client_control(3)[0].item() == -6.0
    assert server.client_state is server.aggregator_state[0].table


def test_stage_refuses_bad_rounds():
    u = ClientUpdate(7, [torch.ones(1)], 1, 1, 0.0, extras={"delta_control": [torch.ones(1)]})
    x = ClientDeltas([7], [u.delta], torch.ones(1, dtype=torch.float64), [u])
    with pytest.raises(RuntimeError, match="needs the number of clients N"):
        ScaffoldControl().apply(x, ScaffoldControl.State(), RoundInfo(0, 0, 8, 1))
    with pytest.raises(ValueError, match=r"Client id 7 is outside \[0, 4\)"):
        ScaffoldControl(num_clients=4).apply(x, ScaffoldControl.State(), RoundInfo(0, 0, 4, 1))
    with pytest.raises(RuntimeError, match="ClientDeltas.updates"):
        ScaffoldControl(num_clients=8).apply(x._replace(updates=None), ScaffoldControl.State(), RoundInfo(0, 0, 8, 1))
