"""Issue #55: the personal evaluation (fed_personal_<m>) covers APFL, pFedMe and Per-FedAvg — each evaluation
client's MSE with its personal model equals NumPy's from the method's own definition (APFL: α_i v_i + (1 − α_i) w;
pFedMe: θ̃_i; Per-FedAvg: w − α∇f_i(w; D_i)), a client never trained with the global model; the global model's
fed_<m> and the global model itself are unchanged by it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import LinearRegression, mse_grad, quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from test_evaluation import _fed_callback, _regression_dm


def _mse(x, y, w):
    return float(np.mean((x @ w[:-1] + w[-1] - y) ** 2))


@pytest.mark.parametrize("method", ["APFL", "PFedMe", "PerFedAvg"])
def test_55_personal_evaluation_of_the_new_methods_equals_numpy(tmp_path, method):
    from lightning_fed.callbacks import APFL, PerFedAvg, PFedMe

    server = {"APFL": APFL(alpha_lr=0.03), "PFedMe": PFedMe(lam=2.0, inner_steps=2, personal_lr=0.05),
              "PerFedAvg": PerFedAvg(alpha=0.1, variant="fo")}[method]
    dm, x, y = _regression_dm(eval_clients_per_round="all")
    torch.manual_seed(0)
    model = LinearRegression(lr=0.05)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[server], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    w = np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])
    table = next(iter(server.client_algorithm_states.values()))
    assert 0 < len(table.ids()) < 6  # some clients trained, some not
    glob, personal = [], []
    for c in range(6):
        idx = dm.client_eval_indices(c)
        mine = w
        if c in table:
            row = table.get(c).numpy()
            if method == "APFL":
                mine = row[-1] * row[:-1] + (1 - row[-1]) * w
            elif method == "PFedMe":
                mine = row
            else:
                d = dm.client_batches(c, int(row[0]))[0]
                mine = w - 0.1 * mse_grad(w, x[d], y[d])
        glob.append(_mse(x[idx], y[idx], w))
        personal.append(_mse(x[idx], y[idx], mine))
    last = _fed_callback(trainer).last
    np.testing.assert_allclose(last.metrics["val_loss"], glob, rtol=1e-10)
    np.testing.assert_allclose(last.personal["val_loss"], personal, rtol=1e-10)
    assert not np.allclose(glob, personal)
    after = np.concatenate([model.linear.weight.detach().numpy().ravel(), model.linear.bias.detach().numpy()])
    assert np.array_equal(after, w)  # the global model restored
