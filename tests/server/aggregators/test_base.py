"""The aggregator chain interface (lightning_fed/server/aggregators/base.py) and its use by ServerOptimizer."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAdam, FedAvg
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.aggregators import ClientDeltas, EmptyState, RoundInfo, Stage, WeightedMean, check_chain


def _fit(server, rounds=3):
    torch.manual_seed(0)
    x, y = regression_data(n=60)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=4)
    model = LinearRegression()
    FederatedTrainer(max_epochs=rounds, callbacks=[server], **quiet_trainer_kwargs("/tmp/lf-chain")).fit(model, datamodule=dm)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("make", [lambda **k: FedAvg(lr=1.0, **k), lambda **k: FedAdam(lr=0.05, tau=1e-2)])
def test_weighted_mean_chain_equals_the_default_aggregation_bit_for_bit(make):
    plain = _fit(make())
    chained_server = make()
    chained_server.aggregators = check_chain([WeightedMean()])
    chained = _fit(chained_server)
    for a, b in zip(plain, chained):
        assert torch.equal(a, b)


class _Scale(Stage):
    kind = "delta"

    class State(NamedTuple):
        calls: torch.Tensor

    def __init__(self, factor):
        self.factor = factor

    def init_state(self, params, num_clients):
        return self.State(torch.zeros((), dtype=torch.long))

    def apply(self, delta, state, info):
        return [d * self.factor for d in delta], self.State(state.calls + 1)


def test_a_stateful_stage_runs_after_the_reducer_and_its_state_is_checkpointed():
    server = FedAvg(aggregators=[WeightedMean(), _Scale(0.5)])
    half = _fit(server, rounds=1)
    assert int(server.aggregator_state[1].calls) == 1
    saved = server.state_dict()
    assert saved["aggregators"][1]["calls"].item() == 1
    fresh = FedAvg(aggregators=[WeightedMean(), _Scale(0.5)])
    fresh.load_state_dict(saved)
    x = ClientDeltas([0], [[torch.ones(1)]], torch.ones(1, dtype=torch.float64))
    delta = fresh.aggregators[0].apply(x, EmptyState(), RoundInfo(0, 0, 1, 1))[0]
    assert torch.equal(delta[0], torch.ones(1))
    full = _fit(FedAvg(lr=0.5), rounds=1)  # η = 0.5 ≡ Δ scaled by 0.5 with η = 1
    for a, b in zip(half, full):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "stages, match",
    [([], "exactly one reducer"), ([WeightedMean(), WeightedMean()], "exactly one reducer"),
     ([WeightedMean(), "median"], "Stage objects"), ([_Scale(1.0), WeightedMean()], "comes too late")],
)
def test_bad_chains_are_refused(stages, match):
    with pytest.raises((ValueError, TypeError), match=match):
        check_chain(stages)


def test_a_server_optimizer_with_its_own_aggregation_refuses_a_chain(tmp_path):
    from lightning_fed.callbacks import FedAWARE

    server = FedAWARE()
    server.aggregators = check_chain([WeightedMean()])
    x, y = regression_data(n=30)
    ds = TensorDataset(torch.tensor(x), torch.tensor(y))
    dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=3, seed=0), clients_per_round=3)
    with pytest.raises(ValueError, match="FedAWARE aggregates in its own way"):
        FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(LinearRegression(), datamodule=dm)


def test_41_weighted_sum_is_the_loop_it_replaced_bit_for_bit():
    """#41: one weighted sum of client updates (base.weighted_sum) for WeightedMean, DPMean, the robust means,
    FedNova and Fed-LAMB's moment averages: the same operations, in the same order, as their own loops were."""
    from lightning_fed.server.aggregators.base import accumulation_dtype, weighted_sum

    g = torch.Generator().manual_seed(0)
    deltas = [[torch.randn(3, 2, generator=g), torch.randn(2, generator=g)] for _ in range(4)]
    coefficients = [3.0, 0.0, 1.5, 7.25]
    want = [torch.mul(d.to(accumulation_dtype(d)), coefficients[0]) for d in deltas[0]]
    for a, delta in zip(coefficients[1:], deltas[1:]):
        torch._foreach_add_(want, delta, alpha=a)
    got = weighted_sum(deltas, coefficients)
    assert all(w.dtype == torch.float64 and torch.equal(w, r) for w, r in zip(want, got))
    same = weighted_sum(deltas, coefficients, accumulate=False)  # Fed-LAMB's: in the updates' own dtype
    assert all(r.dtype == torch.float32 for r in same)
    # skip_zero (FedNova's): a client weighted 0 is left out, so a −0.0 stays −0.0 (adding 0·Δ would make it +0.0)
    zero = [[torch.tensor([-0.0])], [torch.tensor([1.0])]]
    assert torch.signbit(weighted_sum(zero, [1.0, 0.0], skip_zero=True)[0]).item()
    assert not torch.signbit(weighted_sum(zero, [1.0, 0.0])[0]).item()
