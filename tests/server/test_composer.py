"""ServerComposer: weighting → aggregator chain → rule over their states, apart from Lightning (issue #52): its
init/update against NumPy, frozen parameters, its state round trip, its refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.server.aggregators import CoordinateMedian
from lightning_fed.server.composer import ServerComposer
from lightning_fed.server.rules import SGD, Momentum


def _updates(deltas, samples):
    return [ClientUpdate(i, [torch.tensor(d, dtype=torch.float32) for d in delta], n, 1, 0.0)
            for i, (delta, n) in enumerate(zip(deltas, samples))]


def test_two_rounds_of_heavy_ball_on_the_sample_weighted_mean_equal_numpy():
    deltas = [([1.0, -2.0], [0.5]), ([3.0, 0.0], [-1.5])]
    composer = ServerComposer("num_samples", None, Momentum(lr=0.5, momentum=0.9))
    params = [torch.zeros(2), torch.ones(1)]
    x, b = [np.zeros(2), np.ones(1)], [np.zeros(2), np.zeros(1)]
    for _ in range(2):
        composer.update(params, _updates(deltas, [1, 3]))
        for j in range(2):  # Δ = (1·Δ_0 + 3·Δ_1)/4; g = −Δ; b ← 0.9·b + g; x ← x − 0.5·b
            delta = (1 * np.array(deltas[0][j]) + 3 * np.array(deltas[1][j])) / 4
            b[j] = 0.9 * b[j] - delta
            x[j] = x[j] - 0.5 * b[j]
    for p, expected in zip(params, x):
        np.testing.assert_allclose(p.numpy(), expected, rtol=1e-6)
    assert composer.num_steps == 2
    np.testing.assert_allclose(composer.round_report.weights.numpy(), [0.25, 0.75])
    assert composer.round_report.client_ids == [0, 1]


def test_frozen_positions_keep_x_bit_for_bit_and_get_a_zero_pseudo_gradient():
    composer = ServerComposer("uniform", None, SGD(1.0))
    params = [torch.tensor([0.1, 0.2]), torch.tensor([0.3])]
    kept = params[1].clone()
    pseudo_gradient = composer.update(params, _updates([([1.0, 3.0], [5.0]), ([3.0, 5.0], [7.0])], [1, 1]), frozen=[1])
    np.testing.assert_allclose(params[0].numpy(), [0.1 + 2.0, 0.2 + 4.0], rtol=1e-6)
    assert torch.equal(params[1], kept) and pseudo_gradient[1].tolist() == [0.0]


def test_a_chain_replaces_the_mean_and_its_state_round_trips():
    composer = ServerComposer("num_samples", [CoordinateMedian()], SGD(1.0))
    params = [torch.zeros(3)]
    updates = _updates([([1.0, 9.0, -1.0],), ([2.0, 0.0, -5.0],), ([7.0, 1.0, -2.0],)], [1, 1, 5])
    composer.update(params, updates)
    assert params[0].tolist() == [2.0, 1.0, -2.0]  # the coordinate-wise median, whatever the weights
    assert composer.aggregation_requirement(3) is None and composer.stage_hooks("no_such_hook") == []
    saved = composer.state_dict()
    assert saved["num_steps"] == 1 and len(saved["aggregators"]) == 1
    other = ServerComposer("num_samples", [CoordinateMedian()], SGD(1.0))
    other.load_state_dict(saved)
    assert other.num_steps == 1 and other.aggregator_state is None and other.saved_aggregator_state is not None
    assert len(other.init(params)) == 1 and other.saved_aggregator_state is None


def test_init_makes_the_rule_state_for_the_shapes_of_params():
    composer = ServerComposer("uniform", None, Momentum(lr=1.0, momentum=0.5))
    assert composer.init([torch.zeros(2), torch.zeros(1, 3)]) == ()
    assert [t.shape for t in composer.rule_state.momentum_buffer] == [torch.Size([2]), torch.Size([1, 3])]


def test_an_unknown_weighting_is_named_with_the_allowed_values():
    with pytest.raises(ValueError, match=r"`weighting` must be one of \('num_samples', 'uniform'\), got 'mean'"):
        ServerComposer("mean", None, SGD(1.0))


def test_the_state_view_is_the_rule_states_tensors_and_assigning_keeps_its_scalars():
    """ServerComposer.state (ServerOptimizer.state reads it): the tensor fields by name, the tensors themselves;
    assigning sets them and keeps the scalar fields (AdaptiveStepSize's η, θ); ``{}`` drops the rule state."""
    from lightning_fed.server.rules import AdaptiveStepSize

    composer = ServerComposer("uniform", None, Momentum(lr=1.0, momentum=0.5))
    assert composer.state == {}
    composer.update([torch.zeros(2)], _updates([([1.0, 2.0],)], [1]))
    assert list(composer.state) == ["momentum_buffer"] and composer.state["momentum_buffer"][0].tolist() == [-1.0, -2.0]
    assert composer.state["momentum_buffer"][0] is composer.rule_state.momentum_buffer[0]  # a view, not a copy
    composer.state = {"momentum_buffer": [torch.tensor([3.0, 4.0])]}
    assert composer.rule_state.momentum_buffer[0].tolist() == [3.0, 4.0]
    composer.state = {}
    assert composer.rule_state is None and composer.state == {}
    adaptive = ServerComposer("uniform", None, AdaptiveStepSize())
    adaptive.update([torch.zeros(2)], _updates([([1.0, 2.0],)], [1]))
    scalars = {k: v for k, v in adaptive.rule_state._asdict().items() if k not in adaptive.state}
    assert scalars  # η and θ, not in the view
    adaptive.state = {k: [torch.full_like(t, 7.0) for t in v] for k, v in adaptive.state.items()}
    assert {k: v for k, v in adaptive.rule_state._asdict().items() if k in scalars} == scalars
    assert all(t.tolist() == [7.0, 7.0] for v in adaptive.state.values() for t in v)
