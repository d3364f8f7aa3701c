"""The loss gradient and Hessian-vector product at another point than the model's (issue #55: APFL, pFedMe,
Per-FedAvg) against NumPy for least squares (∇f = 2/n·Xᵀ(Xw − y), ∇²f = 2/n·XᵀX); the module is left as it was."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import LinearRegression, linear_weights, mse_grad, regression_data
from lightning_fed.client.personal_grad import StepBatches, hessian_vector_product_at, loss_gradient_at


def _setup():
    x, y = regression_data(n=8, d=3, seed=4)
    model = LinearRegression()
    params = list(model.parameters())  # weight (1, 3), bias (1,)
    point = [torch.tensor([[0.3, -0.2, 0.5]], dtype=torch.float64), torch.tensor([0.1], dtype=torch.float64)]
    return x, y, model, params, point, (torch.tensor(x), torch.tensor(y))


def test_loss_gradient_at_a_point_equals_numpy_and_leaves_the_module_as_it_was():
    x, y, model, params, point, batch = _setup()
    before = linear_weights(model)
    for p in params:
        p.grad = torch.full_like(p, 7.0)
    g = loss_gradient_at(model, params, point, batch)
    want = mse_grad(np.array([0.3, -0.2, 0.5, 0.1]), x, y)
    np.testing.assert_allclose(np.concatenate([g[0].numpy().ravel(), g[1].numpy()]), want, rtol=1e-12)
    assert np.array_equal(linear_weights(model), before)
    assert all(torch.equal(p.grad, torch.full_like(p, 7.0)) for p in params)


def test_hessian_vector_product_equals_numpy():
    x, y, model, params, point, batch = _setup()
    u = [torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)]
    h = hessian_vector_product_at(model, params, point, u, batch)
    xb = np.hstack([x, np.ones((len(x), 1))])
    want = 2.0 / len(x) * xb.T @ xb @ np.array([1.0, 2.0, -1.0, 0.5])
    np.testing.assert_allclose(np.concatenate([h[0].numpy().ravel(), h[1].numpy()]), want, rtol=1e-12)


def test_step_batches_refuse_a_context_without_batches_and_an_extra_step():
    with pytest.raises(RuntimeError, match="Half needs the client's batches"):
        StepBatches(SimpleNamespace(client_batches=None), "Half")
    steps = StepBatches(SimpleNamespace(client_batches=lambda: ["only"]), "Half")
    assert steps.next() == (0, "only")
    with pytest.raises(RuntimeError, match="more local steps than it has batches"):
        steps.next()


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning")
@pytest.mark.parametrize("method", ["APFL", "PFedMe", "PerFedAvg"])
def test_with_a_frozen_encoder_the_personal_steps_cover_only_the_trained_parameters(tmp_path, method):
    """The halves built on these gradients (issue #55) differentiate and keep the federated parameters only: with a
    frozen encoder (requires_grad=False) the head, the clients' tables and the personal models equal those of the
    same function without the encoder among the parameters, bit for bit."""
    from helpers import fit_frozen_pair, same_head
    from lightning_fed.callbacks import APFL, PerFedAvg, PFedMe

    make = {"APFL": lambda: APFL(alpha_lr=0.03), "PFedMe": lambda: PFedMe(lam=2.0, inner_steps=2, personal_lr=0.05),
            "PerFedAvg": lambda: PerFedAvg(alpha=0.1, variant="hf")}[method]
    frozen, head_only, trainer, reference = fit_frozen_pair(tmp_path, make)
    assert same_head(frozen, head_only)
    (table,) = trainer.fit_loop.server_optimizer.client_algorithm_states.values()
    (expected,) = reference.fit_loop.server_optimizer.client_algorithm_states.values()
    assert table.ids() == expected.ids() and all(torch.equal(table.get(i), expected.get(i)) for i in table.ids())
    encoder = frozen.encoder.weight.clone()
    half = trainer.fit_loop.client_runner.client_halves.algorithms[0]
    half.personal_model(frozen, table.get(table.ids()[0]))
    reference.fit_loop.client_runner.client_halves.algorithms[0].personal_model(head_only, expected.get(table.ids()[0]))
    assert torch.equal(frozen.encoder.weight, encoder) and same_head(frozen, head_only)


def test_point_gradients_equal_the_plain_gradient_bit_for_bit_and_put_the_module_back():
    """Issue #55's cost change: several gradients in one :class:`PointGradients` (one save/restore of the
    parameters) equal, bit for bit, the gradient of a fresh copy of the model at each point and
    :func:`loss_gradient_at`; afterwards the parameters, BatchNorm's running statistics (changed by every
    ``training_step`` in train mode) and the metric the step updates are as they were."""
    from helpers import MetricBNClassifier, classifier_batches, gradient_at_copy
    from lightning_fed.client.personal_grad import PointGradients

    model = MetricBNClassifier().train()
    params = list(model.parameters())
    before = [t.detach().clone() for t in [*params, *model.buffers()]]
    metric_before = {k: getattr(model.train_acc, k).clone() for k in model.train_acc._defaults}
    gen = torch.Generator().manual_seed(3)
    points = [[p.detach() + 0.1 * torch.randn(p.shape, generator=gen) for p in params] for _ in range(3)]
    batches = classifier_batches(3)
    want = [gradient_at_copy(model, pt, b) for pt, b in zip(points, batches)]
    with PointGradients(model, params) as at:
        got = [at.gradient(pt, b, i) for i, (pt, b) in enumerate(zip(points, batches))]
    plain = [loss_gradient_at(model, params, pt, b, i) for i, (pt, b) in enumerate(zip(points, batches))]
    for g, p, w in zip(got, plain, want):
        assert all(torch.equal(a, b) for a, b in zip(g, w)) and all(torch.equal(a, b) for a, b in zip(p, w))
    assert all(torch.equal(a, b) for a, b in zip([*params, *model.buffers()], before))
    assert all(torch.equal(getattr(model.train_acc, k), v) for k, v in metric_before.items())
    assert model.train_acc._update_count == 0
