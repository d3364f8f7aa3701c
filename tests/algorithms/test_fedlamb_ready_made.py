"""Fed-LAMB / Fed-AMS (Karimi, Li, Li, Alg. 1) and ServerLAMB (You et al. 2020, Alg. 2) against NumPy
transcriptions of the papers' update rules."""
from __future__ import annotations

import math
import types
import warnings
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import TensorDataset
from helpers import CHECKPOINT_DIR_REUSED, LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import ClientUpdate, FederatedTrainer
from lightning_fed.algorithms.fedlamb import FedAMS, FedLAMB
from lightning_fed.algorithms.fedlamb import AMSGradClient, FedLAMBClient
from lightning_fed.callbacks.server_lamb import ServerLAMB
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner


SHAPES = [(3, 2), (2,)]


# ---------------------------------------------------------------------------------------------- NumPy references
def np_local_amsgrad(theta, grad_fn, steps, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.0, bias="both",
                     ratio="amsgrad", v_init=None, m_init=None, layerwise=True, phi=(0.0, math.inf)):
    """Karimi et al., Alg. 1, l. 7-13 for one client: returns (θ^T, m^T, v^T), all uncorrected.

    l. 9: m = β₁m + (1−β₁)g, corrected by 1−β₁ᵗ; l. 10: v = β₂v + (1−β₂)g², corrected by 1−β₂ᵗ; the ratio's
    denominator is the AMSGrad max v̂ = max(v̂, v) from the broadcast (or the broadcast itself); l. 11:
    p = m̂/(√v̂ + ε); l. 12: θ^ℓ −= α·φ(‖θ^ℓ‖)(p^ℓ + λθ^ℓ)/‖p^ℓ + λθ^ℓ‖ (ratio 1 where a norm is 0)."""
    theta = [t.astype(np.float64).copy() for t in theta]
    v = [np.full_like(t, eps) if v_init is None else v_init[k].copy() for k, t in enumerate(theta)]
    m = [np.zeros_like(t) if m_init is None else m_init[k].copy() for k, t in enumerate(theta)]
    v_hat = [vk.copy() for vk in v]
    for t in range(1, steps + 1):
        grads = grad_fn(theta, t)
        for k in range(len(theta)):
            g = grads[k]
            m[k] = beta1 * m[k] + (1 - beta1) * g
            v[k] = beta2 * v[k] + (1 - beta2) * g**2
            c1 = 1 - beta1**t if bias in ("both", "first_moment") else 1.0
            c2 = 1.0
            if ratio == "amsgrad":
                v_hat[k] = np.maximum(v_hat[k], v[k])
                c2 = 1 - beta2**t if bias == "both" else 1.0
            p = (m[k] / c1) / (np.sqrt(v_hat[k] / c2) + eps)
            u = p + wd * theta[k]
            if layerwise:
                phi_k = min(max(np.linalg.norm(theta[k]), phi[0]), phi[1])
                u_norm = np.linalg.norm(u)
                scale = phi_k / u_norm if phi_k > 0 and u_norm > 0 else 1.0
                theta[k] = theta[k] - lr * scale * u
            else:
                theta[k] = theta[k] - lr * u
    return theta, m, v


def mse_grads(x, y):
    """∇ of mean((x·Wᵀ + b − y)²) for LinearRegression's (W [1, d], b [1])."""
    def grad_fn(theta, t):
        w, b = theta
        r = x @ w[0] + b[0] - y
        return [2.0 / len(x) * (r @ x)[None, :], np.array([2.0 / len(x) * r.sum()])]
    return grad_fn


def np_alg1(dm, x, y, theta0, rounds, local_steps, *, client_lr_by_round, weighting="uniform", server_lr=1.0,
            first_moment="reset", v0=1e-8, **client):
    """Karimi et al., Alg. 1 (l. 3-16) over the data module's cohorts: returns (θ̄_R, v̂_R, m̄_R)."""
    theta = [t.copy() for t in theta0]
    v_hat = [np.full_like(t, v0) for t in theta]
    m_bar = [np.zeros_like(t) for t in theta]
    for r in range(rounds):
        cohort = dm.sample_clients(r)
        results, sizes = [], []
        for cid in cohort:
            idx = dm.client_indices(int(cid))
            results.append(np_local_amsgrad(
                theta, mse_grads(x[idx], y[idx]), local_steps, lr=client_lr_by_round[r], v_init=v_hat,
                m_init=m_bar if first_moment == "average" else None, **client,
            ))
            sizes.append(len(idx))
        w = np.ones(len(cohort)) if weighting == "uniform" else np.array(sizes, dtype=float)
        w = w / w.sum()
        theta = [theta[k] + server_lr * sum(wi * (res[0][k] - theta[k]) for wi, res in zip(w, results))
                 for k in range(len(theta))]
        mean_v = [sum(wi * res[2][k] for wi, res in zip(w, results)) for k in range(len(theta))]
        v_hat = [np.maximum(v_hat[k], mean_v[k]) for k in range(len(theta))]
        if first_moment == "average":
            m_bar = [sum(wi * res[1][k] for wi, res in zip(w, results)) for k in range(len(theta))]
    return theta, v_hat, m_bar


# ---------------------------------------------------------------------------------------------- client optimizers
def _run_client(cls, theta0, grads, v_init=None, m_init=None, **kwargs):
    params = [torch.tensor(t, dtype=torch.float64, requires_grad=True) for t in theta0]
    opt = cls(params, **kwargs)
    if v_init is not None:
        for k, p in enumerate(params):
            opt.state[p] = cls.make_state(
                p, torch.tensor(v_init[k]), None if m_init is None else torch.tensor(m_init[k])
            )
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = torch.tensor(g)
        opt.step()
    return [p.detach().numpy() for p in params], opt


def _grads(seed, steps=5, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=s) for s in shapes] for _ in range(steps)]


CLIENT_CASES = [
    dict(),
    dict(weight_decay=0.1),
    dict(bias_correction="first_moment", weight_decay=0.01),
    dict(bias_correction="none"),
    dict(ratio_denominator="broadcast"),
    dict(betas=(0.5, 0.9), eps=1e-3, initial_second_moment=0.2),
]


@pytest.mark.parametrize("layerwise", [True, False])
@pytest.mark.parametrize("case", CLIENT_CASES)
@pytest.mark.parametrize("seeded", [False, True])
def test_client_optimizer_matches_numpy(layerwise, case, seeded):
    rng = np.random.default_rng(0)
    theta0 = [rng.normal(size=s) for s in SHAPES]
    grads = _grads(1)
    v_init = [rng.uniform(0.1, 2.0, size=s) for s in SHAPES] if seeded else None
    m_init = [rng.normal(size=s) for s in SHAPES] if seeded else None
    cls = FedLAMBClient if layerwise else AMSGradClient
    got, _ = _run_client(cls, theta0, grads, v_init, m_init, lr=0.05, **case)
    betas = case.get("betas", (0.9, 0.999))
    eps = case.get("eps", 1e-8)
    if v_init is None:
        v_init = [np.full(s, case.get("initial_second_moment", eps)) for s in SHAPES]
    want, _, _ = np_local_amsgrad(
        theta0, lambda th, t: grads[t - 1], len(grads), lr=0.05, beta1=betas[0], beta2=betas[1], eps=eps,
        wd=case.get("weight_decay", 0.0), bias=case.get("bias_correction", "both"),
        ratio=case.get("ratio_denominator", "amsgrad"), v_init=v_init, m_init=m_init, layerwise=layerwise,
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10)


def test_layerwise_step_moves_each_tensor_by_lr_times_its_norm():
    """With φ = identity and λ = 0 every tensor moves by exactly α·‖θ^ℓ‖ per step (Alg. 1, l. 12)."""
    rng = np.random.default_rng(2)
    theta0 = [rng.normal(size=s) for s in SHAPES]
    got, _ = _run_client(FedLAMBClient, theta0, _grads(3, steps=1), lr=0.01)
    for g, t in zip(got, theta0):
        assert np.linalg.norm(g - t) == pytest.approx(0.01 * np.linalg.norm(t), rel=1e-12)


def test_phi_bounds_and_zero_tensor_trust_ratio_one():
    rng = np.random.default_rng(4)
    theta0 = [rng.normal(size=(3, 2)) * 10, np.zeros(2), rng.normal(size=(4,)) * 1e-3]
    shapes = [t.shape for t in theta0]
    grads = _grads(5, steps=4, shapes=shapes)
    for phi in [(0.0, math.inf), (0.5, 2.0)]:
        kwargs = dict(phi_min=phi[0], phi_max=None if math.isinf(phi[1]) else phi[1])
        got, _ = _run_client(FedLAMBClient, theta0, grads, lr=0.1, weight_decay=0.05, **kwargs)
        want, _, _ = np_local_amsgrad(
            theta0, lambda th, t: grads[t - 1], len(grads), lr=0.1, wd=0.05, phi=phi,
        )
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-10)
    # the zero tensor moved (trust ratio 1 on its first step) instead of staying frozen at 0
    assert np.abs(got[1]).min() > 0


def test_amsgrad_client_equals_torch_adam_amsgrad():
    rng = np.random.default_rng(6)
    theta0 = [rng.normal(size=s) for s in SHAPES]
    grads = _grads(7, steps=6)
    got, _ = _run_client(AMSGradClient, theta0, grads, lr=0.03, initial_second_moment=0.0)
    ref = [torch.tensor(t, requires_grad=True) for t in theta0]
    opt = torch.optim.Adam(ref, lr=0.03, amsgrad=True, eps=1e-8)
    for step_grads in grads:
        for p, g in zip(ref, step_grads):
            p.grad = torch.tensor(g)
        opt.step()
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r.detach().numpy(), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------- end to end
def _data_module(x, y, **kwargs):
    kwargs = dict(num_clients=4, clients_per_round=2, batch_size=100, local_epochs=3) | kwargs
    num_clients = kwargs.pop("num_clients")
    dm = FederatedDataModule(
        TensorDataset(torch.tensor(x), torch.tensor(y)),
        partitioner=IIDPartitioner(num_clients=num_clients, seed=0), **kwargs,
    )
    dm.setup()
    return dm


def _weights(model):
    return [p.detach().numpy().copy() for p in model.parameters()]


class StepDecayed(LinearRegression):
    """LinearRegression whose client learning rate halves every round (an epoch-interval StepLR)."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


E2E_CASES = [
    # (id, callback factory, keyword arguments of the NumPy reference)
    ("fedlamb-default", lambda: FedLAMB(client_lr=0.05), dict()),
    ("fedlamb-user-lr", lambda: FedLAMB(weight_decay=0.01), dict(wd=0.01)),
    ("fedlamb-options", lambda: FedLAMB(
        client_lr=0.05, first_moment="average", ratio_denominator="broadcast", weighting="num_samples",
        phi_min=0.2, phi_max=0.9, lr=0.8,
    ), dict(first_moment="average", ratio="broadcast", weighting="num_samples", phi=(0.2, 0.9), server_lr=0.8)),
    ("fedams-default", lambda: FedAMS(client_lr=0.05), dict(layerwise=False)),
    ("fedams-options", lambda: FedAMS(
        client_lr=0.05, bias_correction="first_moment", first_moment="average", initial_second_moment=0.5,
        weight_decay=0.1, beta2=0.99,
    ), dict(layerwise=False, bias="first_moment", first_moment="average", v0=0.5, wd=0.1, beta2=0.99)),
    ("fedams-broadcast", lambda: FedAMS(
        client_lr=0.05, ratio_denominator="broadcast", initial_second_moment=1.0, weighting="num_samples",
    ), dict(layerwise=False, ratio="broadcast", v0=1.0, weighting="num_samples")),
]


@pytest.mark.parametrize("name,make,np_kwargs", E2E_CASES, ids=[c[0] for c in E2E_CASES])
def test_alg1_end_to_end_matches_numpy(tmp_path, name, make, np_kwargs):
    """Three rounds of 2 of 4 clients (so v̂ is broadcast to a new cohort), 3 full-batch local steps each,
    through FederatedTrainer, against the NumPy transcription of Alg. 1 (weights and the server's v̂)."""
    x, y = regression_data(n=30, seed=3)
    dm = _data_module(x, y)
    model = LinearRegression(lr=0.04)
    theta0 = _weights(model)
    server = make()
    trainer = FederatedTrainer(max_epochs=3, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert type(trainer.optimizers[0]) is server.client_optimizer_class
    assert isinstance(model.configure_optimizers(), torch.optim.SGD)  # the user's module is unchanged
    client_lr = 0.04 if server.client_lr is None else server.client_lr
    want, v_hat, m_bar = np_alg1(dm, x, y, theta0, 3, 3, client_lr_by_round=[client_lr] * 3, **np_kwargs)
    for g, w in zip(_weights(model), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10)
    for g, w in zip(server.state["second_moment"], v_hat):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-10, atol=1e-14)
    if server.first_moment == "average":
        for g, w in zip(server.state["first_moment"], m_bar):
            np.testing.assert_allclose(g.numpy(), w, rtol=0, atol=1e-12)
    # v̂ never decreases and was broadcast: it changed from its initial value
    assert all((v >= server.initial_second_moment).all() for v in server.state["second_moment"])
    assert server.num_steps == 3


def test_lr_scheduler_is_rebound_to_the_client_optimizer(tmp_path):
    """An epoch-interval StepLR of the user's SGD keeps scheduling the installed AMSGradClient (from client_lr),
    without torch's 'optimizer.step() has been overridden' warning."""
    x, y = regression_data(n=30, seed=4)
    dm = _data_module(x, y)
    model = StepDecayed(lr=0.5)
    theta0 = _weights(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = FederatedTrainer(max_epochs=3, callbacks=[FedAMS(client_lr=0.05)], **quiet_trainer_kwargs(tmp_path))
        trainer.fit(model, datamodule=dm)
    assert not [w for w in caught if "lr_scheduler" in str(w.message) or "overridden" in str(w.message)]
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.optimizer is trainer.optimizers[0]
    want, _, _ = np_alg1(dm, x, y, theta0, 3, 3, client_lr_by_round=[0.05, 0.025, 0.0125], layerwise=False)
    for g, w in zip(_weights(model), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10)


def test_module_that_returns_the_client_optimizer_keeps_it(tmp_path):
    """A module whose configure_optimizers already returns FedLAMBClient keeps it, with its hyper-parameters."""

    class OwnLamb(LinearRegression):
        def configure_optimizers(self):
            self.own = FedLAMBClient(self.parameters(), lr=0.03, weight_decay=0.05)
            return self.own

    x, y = regression_data(n=30, seed=5)
    dm = _data_module(x, y)
    model = OwnLamb()
    theta0 = _weights(model)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[FedLAMB(client_lr=0.9)], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    assert trainer.optimizers[0] is model.own
    want, _, _ = np_alg1(dm, x, y, theta0, 2, 3, client_lr_by_round=[0.03, 0.03], wd=0.05)
    for g, w in zip(_weights(model), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-10)


def _resume_run(tmp_path, max_epochs, ckpt_dir, ckpt_path=None):
    x, y = regression_data(n=30, seed=6)
    torch.manual_seed(0)
    model = LinearRegression(lr=0.04)
    server = FedLAMB(client_lr=0.05, first_moment="average", weight_decay=0.01)
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    kwargs = quiet_trainer_kwargs(tmp_path) | {"enable_checkpointing": True}
    trainer = FederatedTrainer(max_epochs=max_epochs, callbacks=[server, checkpoint], **kwargs)
    trainer.fit(model, datamodule=_data_module(x, y), ckpt_path=ckpt_path)
    return model, server


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED)
def test_checkpoint_resume_continues_identically(tmp_path):
    full, full_server = _resume_run(tmp_path / "a", 4, tmp_path / "ca")
    _resume_run(tmp_path / "b", 2, tmp_path / "cb")
    resumed, server = _resume_run(tmp_path / "b", 4, tmp_path / "cb", ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    assert server.num_steps == 4
    for a, b in zip(full.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for name in ("second_moment", "first_moment"):
        for a, b in zip(full_server.state[name], server.state[name]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_state_dict_round_trip():
    server = FedLAMB(first_moment="average")
    params = [torch.zeros(3, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]
    server.chain_state(params)  # v̂_0, m̄_0 = 0 (the server half's initial state)
    server.state["second_moment"][0].fill_(0.25)
    server.state["first_moment"][1].fill_(-1.5)
    server.num_steps = 7
    other = FedLAMB(first_moment="average")
    other.load_state_dict(server.state_dict())
    assert other.num_steps == 7
    for name in ("second_moment", "first_moment"):
        for a, b in zip(server.state[name], other.state[name]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_server_update_takes_max_of_weighted_mean_second_moment():
    """One server step on hand-made updates: θ̄ + ηΣw_iΔ_i and v̂ = max(v̂, Σw_i v_i) elementwise."""
    server = FedAMS(lr=0.5, weighting="num_samples", initial_second_moment=0.2)
    params = [torch.tensor([1.0, 2.0], dtype=torch.float64)]
    updates = [
        ClientUpdate(0, [torch.tensor([1.0, 0.0], dtype=torch.float64)], 1, 1, 0.0,
                     extras={"exp_avg_sq": [torch.tensor([0.1, 1.0], dtype=torch.float64)]}),
        ClientUpdate(1, [torch.tensor([0.0, 3.0], dtype=torch.float64)], 3, 1, 0.0,
                     extras={"exp_avg_sq": [torch.tensor([0.2, 0.0], dtype=torch.float64)]}),
    ]
    server.server_update(params, updates)
    np.testing.assert_allclose(params[0].numpy(), [1.0 + 0.5 * 0.25, 2.0 + 0.5 * 2.25], atol=1e-15)
    # Σw_i v_i = [0.25·0.1 + 0.75·0.2, 0.25·1.0] = [0.175, 0.25]; max with v̂ = 0.2
    np.testing.assert_allclose(server.state["second_moment"][0].numpy(), [0.2, 0.25], atol=1e-15)
    updates[0].extras.clear()
    with pytest.raises(ValueError, match="extras\\['exp_avg_sq'\\]"):
        server.server_update(params, updates)


# ---------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("make,match", [
    (lambda: FedLAMB(client_lr=0), "`client_lr`"),
    (lambda: FedLAMB(beta1=1.0), "`beta1`"),
    (lambda: FedAMS(beta2=-0.1), "`beta2`"),
    (lambda: FedLAMB(eps=0), "`eps`"),
    (lambda: FedLAMB(weight_decay=-0.1), "`weight_decay`"),
    (lambda: FedLAMB(weight_decay=float("inf")), "`weight_decay`"),
    (lambda: FedLAMB(bias_correction="yes"), "`bias_correction`.*'both'"),
    (lambda: FedAMS(ratio_denominator="local"), "`ratio_denominator`"),
    (lambda: FedLAMB(first_moment="keep"), "`first_moment`.*'reset'"),
    (lambda: FedAMS(initial_second_moment=-1.0), "`initial_second_moment`"),
    (lambda: FedLAMB(phi_min=-1.0), "`phi_min`"),
    (lambda: FedLAMB(phi_max=0.0), "`phi_max`"),
    (lambda: FedLAMB(phi_min=2.0, phi_max=1.0), "`phi_max`.*`phi_min`"),
    (lambda: FedLAMB(lr=0), "`lr`"),
    (lambda: FedAMS(weighting="tokens"), "`weighting`"),
    (lambda: FedLAMBClient([torch.zeros(2, requires_grad=True)], lr=-1.0), "`lr`"),
    (lambda: FedLAMBClient([torch.zeros(2, requires_grad=True)], betas=(0.9,)), "`betas`"),
    (lambda: AMSGradClient([torch.zeros(2, requires_grad=True)], betas=(0.9, 1.0)), "`beta2`"),
    (lambda: AMSGradClient([torch.zeros(2, requires_grad=True)], eps=float("nan")), "`eps`"),
    (lambda: FedLAMBClient([torch.zeros(2, requires_grad=True)], bias_correction=True), "`bias_correction`"),
    (lambda: ServerLAMB(eps=0), "`eps`"),
    (lambda: ServerLAMB(beta1=1.5), "`beta1`"),
    (lambda: ServerLAMB(weight_decay=-1), "`weight_decay`"),
    (lambda: ServerLAMB(bias_correction="yes"), "`bias_correction`"),
    (lambda: ServerLAMB(phi_max=-1.0), "`phi_max`"),
])
def test_bad_arguments_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_install_needs_exactly_one_optimizer():
    params = [torch.zeros(2, requires_grad=True)]
    two = types.SimpleNamespace(optimizers=[torch.optim.SGD(params, lr=0.1), torch.optim.SGD(params, lr=0.1)])
    with pytest.raises(ValueError, match="exactly one client optimizer"):
        FedLAMB().install_client_optimizer(two)


def test_41_fedlamb_keeps_no_behaviour_in_callbacks(tmp_path):
    """Fed-LAMB's client-optimizer install is its client half's (LocalAdaptiveClient.fit_start), its server moments
    its stage's (MaxSecondMoment.prepare_round); FedLAMB, FedAMS and their base only fix parts and defaults (the
    optimizer class and its hyper-parameters). The install still happens at fit start, before round 0."""
    from helpers import assert_ready_made_name
    from lightning_fed.algorithms.fedlamb import FedAMS, LocalAdaptiveServer

    for cls in (LocalAdaptiveServer, FedLAMB, FedAMS):
        assert_ready_made_name(cls, delegates=("_stage_state", "client_optimizer_kwargs", "install_client_optimizer",
                                               "extra_repr"))
