"""FedDyn (issue #30) against a NumPy transcription of Acar et al. 2021, Alg. 1 — heterogeneous local work, partial
participation, several rounds, clients that come back (their stored ∇L_k(θ_k^{t−1}) matters) — its refusals at fit
start, and a checkpoint resume equal to the uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset

from helpers import (
    CLI_ARGS_UNDER_PYTEST, LinearRegression, linear_weights, mse_grad, quiet_trainer_kwargs, regression_data)
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedDynClient, FedDynCorrection, FedProxClient
from lightning_fed.callbacks import FedAdam, FedAvg, FedDyn
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork

ROOT = Path(__file__).resolve().parents[2]


def _datamodule(seed=0):
    x, y = regression_data(n=60, d=3, seed=seed)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                             local_work=SampledLocalWork(epochs=[1, 3], batch_size=[2, 5], seed=1))
    dm.setup()
    return x, y, dm


def _feddyn_reference(w0, x, y, dm, rounds, gamma, alpha, eta=1.0, keep_state=True):
    """Acar et al. 2021, Alg. 1 (A1-A4 as labelled in lightning_fed.algorithms.feddyn), local solver: the client's
    mini-batch SGD of step γ on the A1 objective."""
    n = dm.num_clients
    w, h = w0.copy(), np.zeros_like(w0)
    g = {}  # ∇L_k(θ_k^{t−1}); a client never seen has 0
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            gk = g.get(int(cid), np.zeros_like(w)) if keep_state else np.zeros_like(w)
            wk = w.copy()
            for batch in dm.client_batches(cid, t):  # A1: ∇[L_k(θ) − ⟨g_k, θ⟩ + α/2‖θ − θ^{t−1}‖²]
                wk = wk - gamma * (mse_grad(wk, x[batch], y[batch]) + alpha * (wk - w) - gk)
            g[int(cid)] = gk - alpha * (wk - w)           # A2
            drifts.append(wk - w)
        h = h - alpha / n * np.sum(drifts, axis=0)        # A3: N = all clients
        w = w + eta * (np.mean(drifts, axis=0) - h / alpha)  # A4: θ^t = mean_k θ_k^t − h/α (uniform over P_t)
    return w, g, h, np.array(drifts)


def _fit(tmp_path, server, rounds=4, **trainer_kwargs):
    x, y, dm = _datamodule()
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    kwargs = quiet_trainer_kwargs(tmp_path) | trainer_kwargs
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[server], **kwargs)
    trainer.fit(model, datamodule=dm)
    return x, y, dm, w0, model, trainer


def test_feddyn_equals_numpy_algorithm_1(tmp_path):
    server = FedDyn(alpha=0.1)
    x, y, dm, w0, model, trainer = _fit(tmp_path, server, rounds=5)
    cohorts = [list(dm.sample_clients(t)) for t in range(5)]
    assert len({c for cohort in cohorts for c in cohort}) < sum(map(len, cohorts))  # some client comes back
    steps = {len(dm.client_batches(c, t)) for t, cohort in enumerate(cohorts) for c in cohort}
    assert len(steps) > 1  # heterogeneous local work
    want_w, want_g, want_h, last = _feddyn_reference(w0, x, y, dm, rounds=5, gamma=0.05, alpha=0.1)
    np.testing.assert_allclose(linear_weights(model), want_w, rtol=1e-12, atol=1e-13)
    table = server.client_algorithm_states["FedDynClient"]
    assert sorted(table.ids()) == sorted(want_g)
    for cid, gk in want_g.items():
        np.testing.assert_allclose(table.get(cid).numpy(), gk, rtol=1e-12, atol=1e-13)
    (state,) = server.aggregator_state
    np.testing.assert_allclose(torch.cat([t.reshape(-1) for t in state.h]).numpy(), want_h, rtol=1e-12, atol=1e-13)
    # the stored g_k and h changed the result: without them (g_k = 0 on every visit) it is another run
    forgetful, *_ = _feddyn_reference(w0, x, y, dm, rounds=5, gamma=0.05, alpha=0.1, keep_state=False)
    assert np.abs(forgetful - want_w).max() > 1e-6
    # round_gradient_diversity (FedAWARE, Def. 3.1) describes the clients' updates: √(mean‖Δ_k‖² / ‖mean Δ_k‖²) of the
    # last round, not of the h-corrected step Δ_t
    diversity = np.sqrt(np.mean(np.sum(last**2, axis=1)) / np.sum(np.mean(last, axis=0) ** 2))
    assert float(trainer.callback_metrics["round_gradient_diversity"]) == pytest.approx(diversity, rel=1e-6)


def test_feddyn_is_fedavg_with_both_halves_bit_for_bit(tmp_path):
    runs = []
    for server in (FedDyn(alpha=0.01, lr=0.8),
                   FedAvg(lr=0.8, weighting="uniform", aggregators=[FedDynCorrection(0.01)],
                          client=[FedDynClient(0.01)])):
        *_, model, _ = _fit(tmp_path, server, rounds=3)
        runs.append(linear_weights(model))
    assert np.array_equal(runs[0], runs[1])


def test_feddyn_with_a_server_learning_rate_scales_the_corrected_step(tmp_path):
    x, y, dm, w0, model, _ = _fit(tmp_path, FedDyn(alpha=0.01, lr=0.5), rounds=3)
    want, *_ = _feddyn_reference(w0, x, y, dm, rounds=3, gamma=0.05, alpha=0.01, eta=0.5)
    np.testing.assert_allclose(linear_weights(model), want, rtol=1e-12, atol=1e-13)


def _refused(tmp_path, server, match):
    _, _, dm = _datamodule()
    model = LinearRegression(lr=0.05)
    w0 = linear_weights(model)
    trainer = FederatedTrainer(max_epochs=1, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=match):
        trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 0 and np.array_equal(linear_weights(model), w0)  # before any round trained


@pytest.mark.parametrize("server, match", [
    (FedAvg(weighting="uniform", client=[FedDynClient(0.1)]),
     r"FedDynClient\(alpha=0.1\) \(FedDyn's client half\) needs FedDyn's server half in FedAvg's `aggregators`"),
    (FedAdam(weighting="uniform", client=[FedProxClient(0.1), FedDynClient(0.1)]),
     r"FedDynClient\(alpha=0.1\) \(FedDyn's client half\) needs FedDyn's server half in FedAdam's `aggregators`"),
    (FedAvg(weighting="uniform", aggregators=[FedDynCorrection(0.1)]),
     r"FedDynCorrection\(alpha=0.1\) \(FedDyn's server half\) in FedAvg's `aggregators` needs FedDyn's client half"),
    (FedAvg(weighting="uniform", aggregators=[FedDynCorrection(0.1)], client=[FedDynClient(0.01)]),
     r"disagree on α: FedDynClient\(alpha=0.01\) in FedAvg's `client` and FedDynCorrection\(alpha=0.1\)"),
    (FedAvg(aggregators=[FedDynCorrection(0.1)], client=[FedDynClient(0.1)]),
     r"FedDynClient\(alpha=0.1\) with FedDynCorrection\(alpha=0.1\) needs `weighting`='uniform' on FedAvg.*"
     r"got 'num_samples'"),
    (FedDyn(alpha=0.1, client=[FedDynClient(0.1)]), r"FedDyn runs FedDyn's client half twice"),
], ids=["client-without-server", "client-without-server-fedadam", "server-without-client", "different-alpha",
        "num_samples-weighting", "client-twice"])
def test_meaningless_combinations_are_refused_at_fit_start(tmp_path, server, match):
    _refused(tmp_path, server, match)


@pytest.mark.parametrize("make", [FedDynClient, FedDynCorrection, FedDyn])
@pytest.mark.parametrize("alpha", [0, -0.1, float("nan"), True])
def test_alpha_must_be_positive(make, alpha):
    with pytest.raises(ValueError, match=r"`alpha` must be a finite number > 0"):
        make(alpha=alpha)


def test_feddyn_halves_under_fedadam_equal_numpy(tmp_path):
    """The corrected pseudo-gradient of A4 through FedAdam (Reddi et al. 2021, Alg. 2, v₋₁ = τ²): not Alg. 1, but
    a combination the seam allows; checked so the composition is exactly what it says."""
    server = FedAdam(lr=0.03, weighting="uniform", aggregators=[FedDynCorrection(0.1)], client=[FedDynClient(0.1)])
    x, y, dm, w0, model, _ = _fit(tmp_path, server, rounds=3)
    w, h, m, v, g, tau = w0.copy(), np.zeros_like(w0), np.zeros_like(w0), np.full_like(w0, 1e-6), {}, 1e-3
    for t in range(3):
        drifts = []
        for cid in dm.sample_clients(t):
            gk, wk = g.get(int(cid), np.zeros_like(w)), w.copy()
            for batch in dm.client_batches(cid, t):
                wk = wk - 0.05 * (mse_grad(wk, x[batch], y[batch]) + 0.1 * (wk - w) - gk)
            g[int(cid)] = gk - 0.1 * (wk - w)
            drifts.append(wk - w)
        h = h - 0.1 / dm.num_clients * np.sum(drifts, axis=0)
        delta = np.mean(drifts, axis=0) - h / 0.1
        m = 0.9 * m + 0.1 * delta
        v = 0.99 * v + 0.01 * delta**2
        w = w + 0.03 * m / (np.sqrt(v) + tau)
    np.testing.assert_allclose(linear_weights(model), w, rtol=1e-12, atol=1e-13)


def _resume_run(tmp_path, max_epochs, ckpt_dir, ckpt_path=None):
    _, _, dm = _datamodule()
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    server = FedDyn(alpha=0.1)
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"enable_checkpointing": True}
    trainer = FederatedTrainer(max_epochs=max_epochs, callbacks=[server, checkpoint], **kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model, server


def test_checkpoint_resume_equals_the_uninterrupted_run(tmp_path):
    full, full_server = _resume_run(tmp_path / "a", 5, tmp_path / "ca")
    _resume_run(tmp_path / "b", 2, tmp_path / "cb")
    ckpt = torch.load(tmp_path / "cb" / "last.ckpt", weights_only=True)
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith("FedDyn")]
    assert state["num_steps"] == 2 and state["client_algorithms"]["FedDynClient"]["rows"] and state["aggregators"][0]["h"]
    assert ckpt["lightning_fed"]["run_config"]["server_optimizer.alpha"] == 0.1  # a resume with another α is refused
    resumed, server = _resume_run(tmp_path / "b", 5, tmp_path / "cb", ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    assert server.num_steps == 5
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    for p, q in zip(full_server.aggregator_state[0].h, server.aggregator_state[0].h):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    a, b = full_server.client_algorithm_states["FedDynClient"], server.client_algorithm_states["FedDynClient"]
    assert sorted(a.ids()) == sorted(b.ids()) and len(a.ids()) > 3  # clients of rounds before and after the resume
    for cid in a.ids():
        torch.testing.assert_close(a.get(cid), b.get(cid), rtol=0, atol=0)


@pytest.mark.filterwarnings(CLI_ARGS_UNDER_PYTEST)
def test_the_cli_resolves_feddyn_by_name(tmp_path, monkeypatch):
    from lightning_fed.cli import FederatedCLI

    monkeypatch.chdir(tmp_path)
    config = ROOT / "examples" / "fashion_mnist_hybrid_plus_fedyogi.yaml"
    server = FederatedCLI(args=["--config", str(config), "--server_optimizer", "FedDyn",
                                "--server_optimizer.alpha", "0.1"], run=False).trainer.server_optimizer
    assert type(server) is FedDyn and (server.alpha, server.lr, server.weighting) == (0.1, 1.0, "uniform")
    assert repr(server) == "FedDyn(alpha=0.1, lr=1.0)"


# ------------------------------------------------------------------ #41: per-client state by name, checked on resume
from lightning_fed.client import ClientAlgorithm  # noqa: E402


class Idle(ClientAlgorithm):
    """A stateless client half that changes nothing (inserted before FedDyn's on resume)."""


def _halves_run(tmp_path, max_epochs, ckpt_dir, client, ckpt_path=None, num_clients=6, **trainer_kwargs):
    x, y = regression_data(n=60, d=3, seed=0)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=num_clients, seed=0), clients_per_round=3,
                             local_work=SampledLocalWork(epochs=[1, 3], batch_size=[2, 5], seed=1))
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    server = FedAvg(weighting="uniform", aggregators=[FedDynCorrection(0.1)], client=client)
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"enable_checkpointing": True} | trainer_kwargs
    trainer = FederatedTrainer(max_epochs=max_epochs, callbacks=[server, checkpoint], **kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model, server, trainer


def test_41_inserting_a_client_half_before_feddyns_on_resume_keeps_its_g_k(tmp_path):
    """#41: per-client state was keyed by the half's position in `client=[...]`: a half inserted before
    FedDynClient on resume got FedDyn's saved g_k and FedDyn restarted from zeros, silently. Keyed by name
    (`state_key`), the resumed run equals the uninterrupted one bit for bit."""
    full, full_server, _ = _halves_run(tmp_path / "a", 4, tmp_path / "ca", [FedDynClient(0.1)])
    _halves_run(tmp_path / "b", 2, tmp_path / "cb", [FedDynClient(0.1)])
    resumed, server, _ = _halves_run(tmp_path / "b", 4, tmp_path / "cb", [Idle(), FedDynClient(0.1)],
                                     ckpt_path=str(tmp_path / "cb" / "last.ckpt"),
                                     allow_resume_changes=["server_optimizer.client"])
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    a, b = full_server.client_algorithm_states["FedDynClient"], server.client_algorithm_states["FedDynClient"]
    assert sorted(a.ids()) == sorted(b.ids())
    for cid in a.ids():
        torch.testing.assert_close(a.get(cid), b.get(cid), rtol=0, atol=0)


def test_41_a_changed_population_on_resume_is_refused_before_any_client_trains(tmp_path):
    """#41: FedDyn resumed with another number of clients (an allowed change of the partition) discarded every g_k
    but kept h, built for the old N, silently. Each g_k belongs to a client of the old partition: refused at fit
    start, naming the half and both populations, before any client trains."""
    _halves_run(tmp_path / "b", 2, tmp_path / "cb", [FedDynClient(0.1)])
    with pytest.raises(ValueError, match=r"Cannot resume client half FedDynClient: .*the population changed from "
                                         r"N = 6 to N = 5 clients"):
        _halves_run(tmp_path / "c", 4, tmp_path / "cc", [FedDynClient(0.1)], num_clients=5,
                    ckpt_path=str(tmp_path / "cb" / "last.ckpt"), allow_resume_changes=True)
    assert not (tmp_path / "cc").exists() or not any((tmp_path / "cc").iterdir())  # no round ran


def test_41_a_format_2_checkpoint_with_positional_client_state_resumes_bit_for_bit(tmp_path):
    """#41: a checkpoint written before the halves' state was keyed by name (format 2: key "1" for the second half
    of `client=[...]`) loads through lightning_fed/migrations.py and resumes exactly."""
    full, _, _ = _halves_run(tmp_path / "a", 4, tmp_path / "ca", [Idle(), FedDynClient(0.1)])
    _halves_run(tmp_path / "b", 2, tmp_path / "cb", [Idle(), FedDynClient(0.1)])
    path = tmp_path / "cb" / "last.ckpt"
    ckpt = torch.load(path, weights_only=False)
    (key,) = [k for k in ckpt["callbacks"] if k.startswith("FedAvg")]
    tables = ckpt["callbacks"][key]["client_algorithms"]
    ckpt["callbacks"][key]["client_algorithms"] = {"1": tables.pop("FedDynClient")}
    ckpt["lightning_fed"]["format"] = 2
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    resumed, server, _ = _halves_run(tmp_path / "b", 4, tmp_path / "cb2", [Idle(), FedDynClient(0.1)],
                                     ckpt_path=str(old))
    for p, q in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_41_halves_given_to_the_trainer_are_checked_together_with_the_server_half(tmp_path):
    """#41: FedDyn's client half given to the trainer (a part of the run of its own) still needs its server half in
    the server optimizer's chain: refused at fit start naming both; with both, the run is FedDyn's, bit for bit."""
    _, _, dm = _datamodule()
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedAvg(weighting="uniform")],
                               client_algorithms=[FedDynClient(0.1)], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"FedDynClient\(alpha=0.1\) \(FedDyn's client half\) needs FedDyn's server "
                                         r"half in FedAvg's `aggregators`"):
        trainer.fit(LinearRegression(lr=0.05), datamodule=dm)
    assert trainer.global_step == 0
    *_, composed, _ = _fit(tmp_path, FedAvg(weighting="uniform", aggregators=[FedDynCorrection(0.1)]), rounds=3,
                           client_algorithms=[FedDynClient(0.1)])
    *_, ready, _ = _fit(tmp_path, FedDyn(alpha=0.1), rounds=3)
    assert np.array_equal(linear_weights(composed), linear_weights(ready))


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
def test_with_a_frozen_encoder_h_and_the_g_k_table_cover_only_the_trained_parameters(tmp_path):
    from helpers import fit_frozen_pair, same_head

    frozen, head_only, trainer, _ = fit_frozen_pair(tmp_path, lambda: FedDyn(alpha=0.1))
    assert same_head(frozen, head_only)
    server = trainer.fit_loop.server_optimizer
    assert server.client_algorithm_states["FedDynClient"].dim == 7  # |F| = 6 + 1, not the model's 31
    assert all(len(v) == 2 for st in server.aggregator_state for v in st if isinstance(v, list))
