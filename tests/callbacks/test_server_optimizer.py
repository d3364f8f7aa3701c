"""The FedOpt update rules against a NumPy transcription of Reddi et al. 2021, Alg. 2 (and FedAvgM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi

ROUNDS = 3


def _rounds(seed: int = 0):
    """Three rounds of two clients' deltas for a model with two parameter tensors, and their sample counts."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 2), (2,)]
    x0 = [rng.normal(size=s) for s in shapes]
    rounds = []
    for _ in range(ROUNDS):
        clients = [([rng.normal(scale=0.1, size=s) for s in shapes], int(rng.integers(1, 50))) for _ in range(2)]
        rounds.append(clients)
    return x0, rounds


def _run(server, x0, rounds):
    params = [torch.tensor(p, dtype=torch.float64) for p in x0]
    for r, clients in enumerate(rounds):
        updates = [
            ClientUpdate(client_id=i, delta=[torch.tensor(d) for d in deltas], num_samples=n, num_steps=1, loss=0.0)
            for i, (deltas, n) in enumerate(clients)
        ]
        server.server_update(params, updates)
    return [p.numpy() for p in params]


def _pseudo_gradient(clients, weighting="num_samples"):
    w = np.array([n for _, n in clients], dtype=float) if weighting == "num_samples" else np.ones(len(clients))
    w = w / w.sum()
    return [sum(wi * deltas[k] for wi, (deltas, _) in zip(w, clients)) for k in range(len(clients[0][0]))]


def _reference_alg2(rule, x0, rounds, lr, tau, beta1=0.9, beta2=0.99, bias_correction=False, weighting="num_samples"):
    """Reddi et al. 2021, Alg. 2, l. 10-15, written out independently with NumPy."""
    x = [p.copy() for p in x0]
    m = [np.zeros_like(p) for p in x0]
    v = [np.full_like(p, tau**2) for p in x0]
    for t, clients in enumerate(rounds):
        delta = _pseudo_gradient(clients, weighting)
        for k in range(len(x)):
            m[k] = beta1 * m[k] + (1 - beta1) * delta[k]
            d2 = delta[k] ** 2
            if rule == "adagrad":
                v[k] = v[k] + d2
            elif rule == "yogi":
                v[k] = v[k] - (1 - beta2) * d2 * np.sign(v[k] - d2)
            elif rule == "adam":
                v[k] = beta2 * v[k] + (1 - beta2) * d2
            mh, vh = m[k], v[k]
            if bias_correction:
                mh = m[k] / (1 - beta1 ** (t + 1))
                vh = v[k] / (1 - (0.0 if rule == "adagrad" else beta2) ** (t + 1))
            x[k] = x[k] + lr * mh / (np.sqrt(vh) + tau)
    return x


@pytest.mark.parametrize(
    "cls,rule", [(FedAdagrad, "adagrad"), (FedAdam, "adam"), (FedYogi, "yogi")]
)
@pytest.mark.parametrize("bias_correction", [False, True])
def test_adaptive_matches_numpy_alg2(cls, rule, bias_correction):
    x0, rounds = _rounds()
    server = cls(lr=0.3, tau=1e-2, bias_correction=bias_correction)
    got = _run(server, x0, rounds)
    want = _reference_alg2(rule, x0, rounds, lr=0.3, tau=1e-2, bias_correction=bias_correction)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)


def test_yogi_sign_branch_is_exercised():
    """With tau large, v starts above Δ² (v shrinks); with tau tiny it starts below (v grows): both signs."""
    x0, rounds = _rounds(seed=3)
    for tau in (1.0, 1e-6):
        got = _run(FedYogi(lr=0.1, tau=tau), x0, rounds)
        want = _reference_alg2("yogi", x0, rounds, lr=0.1, tau=tau)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)


def test_uniform_weighting():
    x0, rounds = _rounds(seed=1)
    got = _run(FedAdam(lr=0.1, weighting="uniform"), x0, rounds)
    want = _reference_alg2("adam", x0, rounds, lr=0.1, tau=1e-3, weighting="uniform")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)


def test_fedavg_and_fedavgm_match_numpy():
    x0, rounds = _rounds(seed=2)
    # FedAvg: x ← x + ηΔ.
    x = [p.copy() for p in x0]
    for clients in rounds:
        x = [xk + 0.7 * dk for xk, dk in zip(x, _pseudo_gradient(clients))]
    for g, w in zip(_run(FedAvg(lr=0.7), x0, rounds), x):
        np.testing.assert_allclose(g, w, atol=1e-12)
    # FedAvgM: heavy ball on g = −Δ: b ← μb + g; x ← x − ηb.
    x = [p.copy() for p in x0]
    b = [np.zeros_like(p) for p in x0]
    for clients in rounds:
        delta = _pseudo_gradient(clients)
        b = [0.9 * bk - dk for bk, dk in zip(b, delta)]
        x = [xk - 0.5 * bk for xk, bk in zip(x, b)]
    for g, w in zip(_run(FedAvgM(lr=0.5, momentum=0.9), x0, rounds), x):
        np.testing.assert_allclose(g, w, atol=1e-12)


def test_fedavgm_equals_torch_sgd_momentum():
    """Server momentum is exactly torch's SGD(momentum) applied to −Δ."""
    x0, rounds = _rounds(seed=4)
    ref = [torch.tensor(p, requires_grad=True) for p in x0]
    opt = torch.optim.SGD(ref, lr=0.5, momentum=0.9)
    for clients in rounds:
        for p, d in zip(ref, _pseudo_gradient(clients)):
            p.grad = -torch.tensor(d)
        opt.step()
    for g, w in zip(_run(FedAvgM(lr=0.5, momentum=0.9), x0, rounds), ref):
        np.testing.assert_allclose(g, w.detach().numpy(), atol=1e-12)


def test_state_dict_round_trip_continues_identically():
    x0, rounds = _rounds(seed=5)
    full = _run(FedYogi(lr=0.2), x0, rounds)
    first = FedYogi(lr=0.2)
    mid = _run(first, x0, rounds[:2])
    second = FedYogi(lr=0.2)
    second.load_state_dict(first.state_dict())
    assert second.num_steps == 2
    resumed = _run(second, mid, rounds[2:])
    for a, b in zip(full, resumed):
        np.testing.assert_allclose(a, b, atol=1e-12)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: FedAvg(lr=0), "`lr`"),
        (lambda: FedAvg(lr=-1.0), "`lr`"),
        (lambda: FedAvg(lr=float("nan")), "`lr`"),
        (lambda: FedAdam(tau=0), "`tau`"),
        (lambda: FedYogi(tau=-1e-3), "`tau`"),
        (lambda: FedAdam(beta1=1.0), "`beta1`"),
        (lambda: FedAdam(beta2=-0.1), "`beta2`"),
        (lambda: FedAvgM(momentum=1.5), "`momentum`"),
        (lambda: FedAdagrad(initial_accumulator=-1.0), "`initial_accumulator`"),
        (lambda: FedAvg(weighting="tokens"), "`weighting`"),
    ],
)
def test_bad_hyperparameters_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_gradient_diversity_matches_numpy():
    _, rounds = _rounds(seed=6)
    clients = rounds[0]
    updates = [
        ClientUpdate(client_id=i, delta=[torch.tensor(d) for d in deltas], num_samples=n, num_steps=1, loss=0.0)
        for i, (deltas, n) in enumerate(clients)
    ]
    server = FedAvg()
    pseudo_gradient = server.aggregate(updates)
    w = np.array([n for _, n in clients], dtype=float)
    w /= w.sum()
    flat = [np.concatenate([d.ravel() for d in deltas]) for deltas, _ in clients]
    mean = sum(wi * f for wi, f in zip(w, flat))
    want = np.sqrt(sum(wi * f @ f for wi, f in zip(w, flat)) / (mean @ mean))  # FedAWARE Eq. 3: the square root
    assert server.gradient_diversity(updates, pseudo_gradient) == pytest.approx(want, rel=1e-12)
    assert want >= 1.0  # Jensen: diversity is at least 1


# ------------------------------------------------------------------ #43.7 a wrong argument names the class written
def test_every_ready_made_server_optimizer_names_itself_for_a_wrong_argument():
    import inspect

    import lightning_fed.callbacks as callbacks
    from lightning_fed.callbacks import ServerOptimizer

    classes = [getattr(callbacks, n) for n in callbacks.__all__]
    classes = [c for c in classes if inspect.isclass(c) and issubclass(c, ServerOptimizer)]
    assert {"FedAdam", "FedYogi", "FedAdagrad", "FedAvgM", "DPFedAdam", "FedProx", "SCAFFOLD"} <= {c.__name__ for c in classes}
    for cls in classes:
        with pytest.raises(TypeError, match=rf"^{cls.__name__} got an unexpected keyword argument 'lrr'; did you mean "
                                            rf"'lr'\? \({cls.__name__}'s arguments: .*\blr\b"):
            cls(lrr=0.1)
    with pytest.raises(TypeError, match=r"^FedAvgM got an unexpected keyword argument 'momentun'; did you mean 'momentum'\?"):
        callbacks.FedAvgM(lr=1.0, momentun=0.9)
    with pytest.raises(TypeError, match=r"^FedProx: too many positional arguments \(FedProx's arguments: mu, lr, weighting\)"):
        callbacks.FedProx(0.1, 1.0, "uniform", 3)
    with pytest.raises(TypeError, match=r"^DPFedAdam: missing a required argument: 'noise_multiplier'"):
        callbacks.DPFedAdam(clip_norm=1.0)


# ------------------------------------------------------------------ #43.4 a client half's state of the wrong size
@pytest.mark.parametrize("state_dim,returned,expected", [(4, 3, 4), (0, 2, 0)])
def test_a_client_halfs_state_of_the_wrong_size_names_the_half_and_both_sizes(tmp_path, state_dim, returned, expected):
    from torch.utils.data import TensorDataset

    from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
    from lightning_fed import FederatedTrainer
    from lightning_fed.client.algorithm import ClientAlgorithm
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    class Sloppy(ClientAlgorithm):
        def state_dim(self, num_params):
            return state_dim and num_params  # LinearRegression(3): 4 parameters

        def finish(self, module, context):
            return {}, torch.zeros(returned)

    x, y = regression_data(n=20)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(2, seed=0),
                             clients_per_round=2, batch_size=10)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAvg(client=[Sloppy()])], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=rf"Client half Sloppy \(`client\[0\]` of FedAvg\) returned a per-client state "
                                         rf"of {returned} numbers from finish\(\) for client \d, but its state_dim\(4\) "
                                         rf"is {expected}"):
        trainer.fit(LinearRegression(), datamodule=dm)
    assert trainer.current_epoch == 0


def test_select_federated_cuts_an_all_parameter_state_to_the_federated_entries_exactly():
    from lightning_fed.server.client_state import ClientStateTable

    # a model of two parameters of 2 and 3 numbers; the first is frozen now: F = [1], its numbers are columns 2..4
    rows = ClientStateTable(3, 5)
    rows.put(1, torch.arange(5.0))
    server = FedAdam(lr=0.1)
    moments = [torch.full((2,), 7.0), torch.tensor([1.0, 2.0, 3.0])]
    server.load_state_dict({"num_steps": 2, "state": {"exp_avg": moments, "exp_avg_sq": moments},
                            "aggregators": [{"control": moments, "table": {"client_state_table": rows.state_dict()}}],
                            "client_algorithms": {"FedDynClient": rows.state_dict()}})
    cut = server.select_federated([1], [2, 3])
    assert cut == ["state.exp_avg", "state.exp_avg_sq", "aggregators.0.control", "aggregators.0.table",
                   "client_algorithms.FedDynClient"]
    assert [t.tolist() for t in server.state["exp_avg"]] == [[1.0, 2.0, 3.0]]
    table = server.client_algorithm_states["FedDynClient"]
    assert table.dim == 3 and table.ids() == [1] and table.get(1).tolist() == [2.0, 3.0, 4.0]
    assert server._saved_aggregator_state[0]["table"]["client_state_table"]["dim"] == 3


def test_select_federated_refuses_a_dense_table_over_every_entry():
    from lightning_fed.server.client_state import ClientStateTable

    server = FedAvg()
    dense = ClientStateTable(3, 5, dense=True)
    saved = [{"table": {"client_state_table": dense.state_dict()}}]
    server.load_state_dict({"num_steps": 1, "state": {}, "aggregators": saved})
    with pytest.raises(ValueError, match=r"state 'aggregators.0.table' .* dense per-client table over all 5 entries"):
        server.select_federated([1], [2, 3])


# Today's state keys (in every checkpoint: Lightning matches a callback's saved state by it) and reprs of every
# ready-made name, recorded before they were derived from the classes' field tables: old checkpoints keep resuming.
STATE_KEYS_AND_REPRS = [
    ('ServerOptimizer()',
     "ServerOptimizer{'lr': 1.0, 'weighting': 'num_samples'}",
     "ServerOptimizer(lr=1.0, weighting='num_samples')"),
    ('FedAvg(lr=0.5, weighting="uniform")',
     "FedAvg{'lr': 0.5, 'weighting': 'uniform'}",
     "FedAvg(lr=0.5, weighting='uniform')"),
    ('FedAvgM(lr=0.3, momentum=0.5)',
     "FedAvgM{'lr': 0.3, 'momentum': 0.5, 'weighting': 'num_samples'}",
     "FedAvgM(lr=0.3, weighting='num_samples', momentum=0.5)"),
    ('FedAdam(lr=0.1)',
     "FedAdam{'lr': 0.1, 'beta1': 0.9, 'beta2': 0.99, 'tau': 0.001, 'weighting': 'num_samples'}",
     "FedAdam(lr=0.1, weighting='num_samples', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi')"),
    ('FedYogi(convention="flower")',
     "FedYogi{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.99, 'tau': 0.001, 'weighting': 'num_samples'}",
     "FedYogi(lr=0.01, weighting='num_samples', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=0.0, bias_correction=False, convention='flower')"),
    ('FedAdagrad(tau=0.01)',
     "FedAdagrad{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.0, 'tau': 0.01, 'weighting': 'num_samples'}",
     "FedAdagrad(lr=0.01, weighting='num_samples', beta1=0.9, beta2=0.0, tau=0.01, initial_accumulator=0.0001, bias_correction=False, convention='reddi')"),
    ('AdaptiveServerOptimizer()',
     "AdaptiveServerOptimizer{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.99, 'tau': 0.001, 'weighting': 'num_samples'}",
     "AdaptiveServerOptimizer(lr=0.01, weighting='num_samples', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi')"),
    ('FedProx(mu=0.01)',
     "FedProx{'lr': 1.0, 'mu': 0.01, 'weighting': 'num_samples'}",
     "FedProx(mu=0.01, lr=1.0, weighting='num_samples')"),
    ('FedDyn(alpha=0.1)',
     "FedDyn{'lr': 1.0, 'alpha': 0.1}",
     'FedDyn(alpha=0.1, lr=1.0)'),
    ('FedNova(local_solver="momentum", momentum=0.9)',
     "FedNova{'lr': 1.0, 'weighting': 'num_samples', 'local_solver': 'momentum', 'momentum': 0.9, 'mu': 0.0}",
     "FedNova(lr=1.0, weighting='num_samples', local_solver='momentum', momentum=0.9, mu=0.0)"),
    ('FedMGDAPlus(epsilon=0.5, normalize=False)',
     "FedMGDAPlus{'lr': 1.0, 'epsilon': 0.5, 'normalize': False, 'weighting': 'uniform'}",
     "FedMGDAPlus(lr=1.0, weighting='uniform', epsilon=0.5, normalize=False)"),
    ('FedAWARE()',
     "FedAWARE{'lr': 1.0, 'alpha': 0.5, 'alpha_convention': 'paper', 'normalize': True, 'projection': False, 'weighting': 'num_samples'}",
     "FedAWARE(lr=1.0, weighting='num_samples', alpha=0.5, alpha_convention='paper', normalize=True, fedavg_warmup=False, projection=False, solver='active_set')"),
    ('FedAWARE(alpha=0.9, warmup_rounds=3, pairing="public_code", solver="frank_wolfe")',
     "FedAWARE{'lr': 1.0, 'alpha': 0.9, 'alpha_convention': 'paper', 'normalize': True, 'projection': False, 'weighting': 'num_samples'}",
     "FedAWARE(lr=1.0, weighting='num_samples', alpha=0.9, alpha_convention='paper', normalize=True, fedavg_warmup=False, projection=False, solver='frank_wolfe', warmup_rounds=3, pairing='public_code')"),
    ('SCAFFOLD(lr=0.5)',
     "SCAFFOLD{'lr': 0.5, 'weighting': 'uniform'}",
     "SCAFFOLD(lr=0.5, weighting='uniform')"),
    ('FedLAMB(phi_max=3.0)',
     "FedLAMB{'lr': 1.0, 'client_lr': None, 'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-08, 'weight_decay': 0.0, 'first_moment': 'reset', 'weighting': 'uniform'}",
     "FedLAMB(lr=1.0, weighting='uniform', client_lr=None, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.0, bias_correction='both', ratio_denominator='amsgrad', first_moment='reset', initial_second_moment=1e-08, phi_min=0.0, phi_max=3.0)"),
    ('FedAMS(client_lr=0.1)',
     "FedAMS{'lr': 1.0, 'client_lr': 0.1, 'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-08, 'weight_decay': 0.0, 'first_moment': 'reset', 'weighting': 'uniform'}",
     "FedAMS(lr=1.0, weighting='uniform', client_lr=0.1, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.0, bias_correction='both', ratio_denominator='amsgrad', first_moment='reset', initial_second_moment=1e-08)"),
    ('LocalAdaptiveServer()',
     "LocalAdaptiveServer{'lr': 1.0, 'client_lr': None, 'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-08, 'weight_decay': 0.0, 'first_moment': 'reset', 'weighting': 'uniform'}",
     "LocalAdaptiveServer(lr=1.0, weighting='uniform', client_lr=None, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.0, bias_correction='both', ratio_denominator='amsgrad', first_moment='reset', initial_second_moment=1e-08)"),
    ('ServerLAMB(phi_max=2.0)',
     "ServerLAMB{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-06, 'weight_decay': 0.0, 'weighting': 'num_samples'}",
     "ServerLAMB(lr=0.01, weighting='num_samples', beta1=0.9, beta2=0.999, eps=1e-06, weight_decay=0.0, bias_correction=True, phi_min=0.0, phi_max=2.0)"),
    ('ServerLAMB()',
     "ServerLAMB{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.999, 'eps': 1e-06, 'weight_decay': 0.0, 'weighting': 'num_samples'}",
     "ServerLAMB(lr=0.01, weighting='num_samples', beta1=0.9, beta2=0.999, eps=1e-06, weight_decay=0.0, bias_correction=True, phi_min=0.0, phi_max=None)"),
    ('FedMedian(lr=0.5)',
     "FedMedian{'lr': 0.5, 'weighting': 'num_samples'}",
     'FedMedian(lr=0.5)'),
    ('FedTrimmedAvg(beta=0.1)',
     "FedTrimmedAvg{'lr': 1.0, 'beta': 0.1}",
     'FedTrimmedAvg(beta=0.1, lr=1.0)'),
    ('Krum(num_malicious_clients=1)',
     "Krum{'lr': 1.0, 'weighting': 'num_samples', 'num_malicious_clients': 1, 'num_clients_to_keep': 0}",
     "Krum(num_malicious_clients=1, num_clients_to_keep=0, lr=1.0, weighting='num_samples')"),
    ('FedBN()',
     "FedBN{'lr': 1.0, 'weighting': 'uniform'}",
     "FedBN(lr=1.0, weighting='uniform')"),
    ('FedPer(head=["net.2"])',
     "FedPer{'lr': 1.0, 'weighting': 'num_samples'}",
     "FedPer(head=['net.2'], lr=1.0, weighting='num_samples')"),
    ('FedRep(head=["net.2"], head_steps=3)',
     "FedRep{'lr': 1.0, 'weighting': 'uniform'}",
     "FedRep(head=['net.2'], head_steps=3, lr=1.0, weighting='uniform')"),
    ('Ditto(lam=0.5, personal_lr=0.01)',
     "Ditto{'lr': 1.0, 'weighting': 'uniform'}",
     "Ditto(lam=0.5, personal_lr=0.01, lr=1.0, weighting='uniform')"),
    ('ServerStepSize(lr=0.5)',
     "ServerStepSize{'lr': 0.5, 'weighting': 'uniform'}",
     "ServerStepSize(lr=0.5, weighting='uniform')"),
    ('AdaptiveServerStepSize()',
     "AdaptiveServerStepSize{'lr': 1e-06, 'weighting': 'uniform'}",
     "AdaptiveServerStepSize(lr=1e-06, weighting='uniform', eta=None, theta=inf)"),
    ('NormalizedFedAvgM(lr=0.5)',
     "NormalizedFedAvgM{'lr': 0.5, 'momentum': 0.9, 'weighting': 'uniform'}",
     "NormalizedFedAvgM(lr=0.5, weighting='uniform', momentum=0.9)"),
    ('NormalizedFedAdam()',
     "NormalizedFedAdam{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.99, 'tau': 0.001, 'weighting': 'uniform'}",
     "NormalizedFedAdam(lr=0.01, weighting='uniform', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi')"),
    ('NormalizedFedYogi(tau=0.01)',
     "NormalizedFedYogi{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.99, 'tau': 0.01, 'weighting': 'uniform'}",
     "NormalizedFedYogi(lr=0.01, weighting='uniform', beta1=0.9, beta2=0.99, tau=0.01, initial_accumulator=0.0001, bias_correction=False, convention='reddi')"),
    ('NormalizedFedAdagrad()',
     "NormalizedFedAdagrad{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.0, 'tau': 0.001, 'weighting': 'uniform'}",
     "NormalizedFedAdagrad(lr=0.01, weighting='uniform', beta1=0.9, beta2=0.0, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi')"),
    ('DPFedAvg(clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-5)',
     "DPFedAvg{'lr': 1.0, 'weighting': 'uniform'}",
     "DPFedAvg(lr=1.0, weighting='uniform', clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-05, adaptive_clipping=False, target_epsilon=None, sampling='fixed_size', accounting='rdp')"),
    ('DPFedAdam(clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-5, sampling="poisson")',
     "DPFedAdam{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.99, 'tau': 0.001, 'weighting': 'uniform'}",
     "DPFedAdam(lr=0.01, weighting='uniform', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi', clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-05, adaptive_clipping=False, target_epsilon=None, sampling='poisson', accounting='rdp')"),
    ('DPFedYogi(clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-5)',
     "DPFedYogi{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.99, 'tau': 0.001, 'weighting': 'uniform'}",
     "DPFedYogi(lr=0.01, weighting='uniform', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi', clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-05, adaptive_clipping=False, target_epsilon=None, sampling='fixed_size', accounting='rdp')"),
    ('DPFedAdagrad(clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-5)',
     "DPFedAdagrad{'lr': 0.01, 'beta1': 0.9, 'beta2': 0.0, 'tau': 0.001, 'weighting': 'uniform'}",
     "DPFedAdagrad(lr=0.01, weighting='uniform', beta1=0.9, beta2=0.0, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi', clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-05, adaptive_clipping=False, target_epsilon=None, sampling='fixed_size', accounting='rdp')"),
]


@pytest.mark.parametrize(("made", "state_key", "shown"), STATE_KEYS_AND_REPRS, ids=[c[0].split("(")[0] + str(i) for i, c in enumerate(STATE_KEYS_AND_REPRS)])
def test_derived_state_keys_and_reprs_equal_the_recorded_strings(made, state_key, shown):
    import lightning_fed.callbacks as callbacks

    # every public name, resolved: the package imports its method modules on first use (a lazy module __getattr__),
    # so vars(callbacks) holds only those some earlier test happened to touch
    server = eval(made, {name: getattr(callbacks, name) for name in callbacks.__all__})
    assert server.state_key == state_key
    assert repr(server) == shown


def test_a_subclass_state_key_and_repr_come_from_its_field_tables():
    from lightning_fed.callbacks import ServerOptimizer

    class Damped(FedAvg):
        state_key_fields = ("lr", "damping", "weighting")
        repr_fields = ("damping", "lr", "weighting", "mode", "note")
        repr_hidden = {"note": None}

        def __init__(self, damping: float = 0.5, lr: float = 1.0, note=None) -> None:
            super().__init__(lr=lr)
            self.damping, self.mode, self.note = damping, "fast", note

    assert Damped().state_key == Damped.__qualname__ + "{'lr': 1.0, 'damping': 0.5, 'weighting': 'num_samples'}"
    assert repr(Damped(0.25)) == "Damped(damping=0.25, lr=1.0, weighting='num_samples', mode='fast')"
    assert repr(Damped(note="x")).endswith("mode='fast', note='x')")
    assert ServerOptimizer.state_key_fields == ServerOptimizer.repr_fields == ("lr", "weighting")


def test_client_halves_given_to_the_server_optimizer_warn_naming_the_kept_way_and_the_removal(recwarn):
    import warnings

    from lightning_fed import FederatedTrainer
    from lightning_fed.algorithms import FedProxClient
    from lightning_fed.callbacks import FedBN, ServerOptimizer

    for make in (lambda: FedAvg(client=[FedProxClient(0.1)]), lambda: FedBN(client=[FedProxClient(0.1)]),
                 lambda: ServerOptimizer(client=[])):
        with pytest.warns(DeprecationWarning, match=r"FederatedTrainer\(client_algorithms=\[\.\.\.\]\).*") as caught:
            make()
        assert "removed in lightning_fed 0.3.0" in str(caught[0].message)
        assert caught[0].filename == __file__  # the user's line, not the subclass's super().__init__
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        FedBN(), FedAvg()  # a ready-made name's own half is no deprecated client=
        trainer = FederatedTrainer(callbacks=[FedAvg()], client_algorithms=[FedProxClient(0.1)], logger=False,
                                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    assert [type(a).__name__ for a in trainer.client_algorithms] == ["FedProxClient"]
