"""The ready-made FedNova callback: resolvable by name from the CLI, its run record and checkpoint, and its
gradient-diversity diagnostic over the normalised contributions (the algorithm itself is tested against NumPy in
tests/algorithms/test_fednova.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import CLI_ARGS_UNDER_PYTEST, LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.algorithms import FedNovaAveraging, FedProxClient
from lightning_fed.callbacks import FedNova
from lightning_fed.cli import FederatedCLI
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.filterwarnings(CLI_ARGS_UNDER_PYTEST)
def test_server_optimizer_fednova_resolves_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = ROOT / "examples" / "fashion_mnist_hybrid_plus_fedavg.yaml"
    cli = FederatedCLI(args=["--config", str(config), "--server_optimizer", "FedNova", "--server_optimizer.local_solver",
                             "proximal", "--server_optimizer.mu", "0.1"], run=False)
    server = cli.trainer.server_optimizer
    assert type(server) is FedNova and (server.local_solver, server.mu, server.lr) == ("proximal", 0.1, 1.0)
    assert repr(server.client_algorithms) == "[FedProxClient(mu=0.1)]" and server.client is None
    assert repr(server) == "FedNova(lr=1.0, weighting='num_samples', local_solver='proximal', momentum=0.0, mu=0.1)"


def test_the_proximal_variant_brings_fedprox_client_half_and_checkpoints(tmp_path):
    x, y = regression_data(n=60, d=3, seed=0)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                             local_work=SampledLocalWork(epochs=[1, 3], batch_size=[2, 5], seed=1))
    server = FedNova(local_solver="proximal", mu=0.5)
    assert server.client_algorithms == server._own_client and repr(server._own_client) == "[FedProxClient(mu=0.5)]"
    model = LinearRegression(lr=0.05)
    FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    state = server.state_dict()
    assert state["num_steps"] == 2 and state["aggregators"] == [{}]  # no server state
    again = FedNova(local_solver="proximal", mu=0.5)
    again.load_state_dict(state)
    assert again.num_steps == 2 and again.state_key == server.state_key != FedNova(local_solver="proximal", mu=0.1).state_key


def test_gradient_diversity_is_that_of_the_raw_updates():
    deltas = [np.array([1.0, 0.0]), np.array([0.0, 4.0]), np.array([2.0, 2.0])]
    steps, samples = [1, 4, 2], [1, 2, 1]
    updates = [ClientUpdate(i, [torch.tensor(d)], num_samples=n, num_steps=s, loss=0.0)
               for i, (d, s, n) in enumerate(zip(deltas, steps, samples))]
    server = FedNova()
    pseudo = server.aggregate(updates)
    p = np.array(samples, float) / sum(samples)
    tau_eff = float(p @ np.array(steps, float))
    g = [tau_eff * d / s for d, s in zip(deltas, steps)]
    mean = sum(pi * gi for pi, gi in zip(p, g))
    np.testing.assert_allclose(pseudo[0].numpy(), mean, rtol=1e-15)
    # round_gradient_diversity is the same metric for every method (issue #34): the raw Δ_i with the sample weights,
    # not the normalised g_i FedNova steps with
    raw = sum(pi * d for pi, d in zip(p, deltas))
    want = np.sqrt(sum(pi * d @ d for pi, d in zip(p, deltas)) / (raw @ raw))
    assert server.gradient_diversity(updates, pseudo) == pytest.approx(want, rel=1e-12)
    assert want >= 1.0


def test_fednova_averaging_repr_names_its_settings():
    assert repr(FedNovaAveraging("momentum", momentum=0.9)) == "FedNovaAveraging(local_solver='momentum', momentum=0.9, mu=0.0)"
    assert isinstance(FedNova(local_solver="proximal", mu=0.2).client_algorithms[0], FedProxClient)
