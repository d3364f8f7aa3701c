"""ServerOptimizer composes an aggregator chain and a server rule; the ready-made names are such compositions."""

import math

import pytest
import torch
from jsonargparse import ArgumentParser

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import AdaptiveServerStepSize, FedAdam, FedAvg, FedAvgM, FedYogi, ServerOptimizer
from lightning_fed.callbacks.adaptive import AdaptiveServerOptimizer
from lightning_fed.server.aggregators import WeightedMean
from lightning_fed.server.rules import Adam, Momentum

YAML = """
server_optimizer:
  class_path: lightning_fed.callbacks.ServerOptimizer
  init_args:
    rule:
      class_path: lightning_fed.server.rules.Adam
      init_args: {lr: 0.03, tau: 0.01, beta2: 0.9}
    aggregators:
      - class_path: lightning_fed.server.aggregators.WeightedMean
"""


def _from_yaml(text):
    parser = ArgumentParser()
    parser.add_subclass_arguments(ServerOptimizer, "server_optimizer")
    return parser.instantiate_classes(parser.parse_string(text)).server_optimizer


def _rounds(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append([
            ClientUpdate(i, [torch.randn(3, 2, generator=g), torch.randn(2, generator=g)], num_samples=i + 1,
                         num_steps=1, loss=0.0)
            for i in range(3)
        ])
    return out


def _run(server, rounds):
    params = [torch.ones(3, 2), torch.zeros(2)]
    for updates in rounds:
        server.server_update(params, updates)
    return params


def test_yaml_composition_equals_fedadam_bit_for_bit():
    composed = _from_yaml(YAML)
    assert isinstance(composed.server_rule, Adam) and isinstance(composed.aggregators[0], WeightedMean)
    assert composed.lr == 0.03
    got, want = _run(composed, _rounds()), _run(FedAdam(lr=0.03, tau=0.01, beta2=0.9), _rounds())
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_default_rule_is_fedavg_and_momentum_rule_is_fedavgm():
    for a, b in zip(_run(ServerOptimizer(), _rounds()), _run(FedAvg(), _rounds())):
        assert torch.equal(a, b)
    got = _run(ServerOptimizer(rule=Momentum(lr=0.5, momentum=0.8)), _rounds())
    for a, b in zip(got, _run(FedAvgM(lr=0.5, momentum=0.8), _rounds())):
        assert torch.equal(a, b)


def test_old_format_state_dict_loads_and_continues():
    """Checkpoints so far store {"num_steps", "state": {name: [tensors]}} (plus "eta"/"theta" for the adaptive
    stepsize); the typed states keep those names, so they load as they are."""
    rounds = _rounds(5)
    full = FedYogi(lr=0.1)
    params_full = _run(full, rounds)
    first = FedYogi(lr=0.1)
    params = _run(first, rounds[:2])
    old = {"num_steps": 2, "state": {"exp_avg": [t.clone() for t in first.state["exp_avg"]],
                                     "exp_avg_sq": [t.clone() for t in first.state["exp_avg_sq"]]}}
    resumed = FedYogi(lr=0.1)
    resumed.load_state_dict(old)
    for updates in rounds[2:]:
        resumed.server_update(params, updates)
    for a, b in zip(params, params_full):
        assert torch.equal(a, b)
    assert set(resumed.state_dict()) == {"num_steps", "state"}

    step = AdaptiveServerStepSize(lr=0.1)
    step.load_state_dict({"num_steps": 1, "state": {"prev_params": [torch.zeros(2)], "prev_direction": [torch.ones(2)]},
                          "eta": 0.1, "theta": math.inf})
    assert (step.eta, step.theta, step.num_steps) == (0.1, math.inf, 1)
    assert set(step.state_dict()) == {"num_steps", "state", "eta", "theta"}


def test_state_dict_before_the_first_round_has_the_scalar_defaults():
    assert AdaptiveServerStepSize().state_dict() == {"num_steps": 0, "state": {}, "eta": None, "theta": math.inf}


def test_lr_given_twice_must_agree():
    with pytest.raises(ValueError, match="`lr`=0.5 disagrees with the rule's learning rate 0.1"):
        ServerOptimizer(lr=0.5, rule=Adam(lr=0.1))
    with pytest.raises(TypeError, match="`rule` must be a server rule"):
        ServerOptimizer(rule="adam")


def test_overriding_update_second_moment_is_refused():
    class MyAdaptive(AdaptiveServerOptimizer):
        def update_second_moment(self, v, delta_sq):
            pass

    with pytest.raises(TypeError, match="overrides `update_second_moment`"):
        MyAdaptive()


def test_the_round_report_holds_the_weights_once_and_the_stages_reports():
    """One report per round (issue #30): the normalised weights w_i = |D_i|/Σ|D_j| of the clients that reported, and
    each chain stage's report (None for a stage without one; FedMGDA+'s λ* here)."""
    import numpy as np

    from lightning_fed import ClientUpdate
    from lightning_fed.algorithms import FedMGDAMinNorm
    from lightning_fed.callbacks import FedAvg, ServerOptimizer
    from lightning_fed.server.aggregators import ClipUpdates

    updates = [ClientUpdate(4, [torch.tensor([3.0, 0.0], dtype=torch.float64)], 1, 1, 0.0),
               ClientUpdate(9, [torch.tensor([0.0, 1.0], dtype=torch.float64)], 3, 1, 0.0)]
    plain = FedAvg()
    assert plain.round_report is None
    plain.server_update([torch.zeros(2, dtype=torch.float64)], updates)
    assert plain.round_report.client_ids == [4, 9] and plain.round_report.stages == ()
    np.testing.assert_array_equal(plain.round_report.weights.numpy(), [0.25, 0.75])
    chained = ServerOptimizer(aggregators=[ClipUpdates(clip_norm=10.0), FedMGDAMinNorm()])
    chained.server_update([torch.zeros(2, dtype=torch.float64)], updates)
    clip_report, mgda_report = chained.round_report.stages
    assert clip_report is None
    np.testing.assert_allclose(mgda_report.weights, [0.5, 0.5], atol=1e-12)  # unit vectors e_0, e_1: λ* = (½, ½)
    assert chained.round_weights(updates) is chained.round_report.weights  # not computed again


@pytest.mark.parametrize("name", ["step", "init_state", "aggregate", "client_delta", "client_weight_counts"])
def test_a_subclass_defining_a_removed_override_is_refused_when_defined(name):
    """The one way to write a server method is stages + rule (issue #30): an override the server optimizer would not
    call is refused with what to write instead, not silently ignored."""
    from lightning_fed.callbacks import FedAvg

    with pytest.raises(TypeError, match=rf"Mine defines `{name}`, which a server optimizer no longer lets a subclass"):
        type("Mine", (FedAvg,), {name: lambda self, *args: None})
