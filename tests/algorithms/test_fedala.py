"""FedALA (issue #55) against a NumPy transcription of Zhang et al., AAAI 2023, Alg. 1 — ALA's element-wise mix
of the client's top layers with the global model's, the clipped gradient steps on W over the sampled share of
the client's data (the start phase until the batch losses settle, then one pass), local training from Θ̂, the n_i/n
mean — several rounds, partial participation, returning clients, a resume equal to the uninterrupted run; FedAdam as
the server rule; the personal model (ALA's mix with the stored W) in ``fed_personal_*``. D_i^{s,t} is drawn by
``ala_batches`` (the documented sampler, as the references use ``dm.client_batches`` for the round's batches)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from algorithms.test_fedper import GAMMA, HEAD, TwoLayer, datamodule, fit, grads, weights
from helpers import federated_fit, numpy_fedadam, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import FedALAClient
from lightning_fed.algorithms.fedala import ala_batches
from lightning_fed.callbacks import FedAdam, FedALA
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, SampledLocalWork
from lightning_fed.evaluation import FederatedEvaluation

KW = dict(share=0.8, ala_lr=1.0, threshold=0.2, num_pre_loss=4, max_start_epochs=12)


def _loss(w, x, y):
    out = ((x @ w["net.0.weight"].T + w["net.0.bias"]) @ w["net.1.weight"].T + w["net.1.bias"])[:, 0]
    return float(np.mean((out - y) ** 2))


def _fedala_reference(w0, x, y, dm, rounds, share, ala_lr, threshold, num_pre_loss, max_start_epochs,
                      learn_w=True, server_step=None, passes=None):
    """Alg. 1 (see the module doc); ``learn_w=False`` is the deliberately wrong variant (W stays 1: FedAvg)."""
    glob, local = dict(w0), {}
    for t in range(rounds):
        drifts, sizes = [], []
        for cid in (int(c) for c in dm.sample_clients(t)):
            w_mix, started = {k: np.ones_like(w0[k]) for k in HEAD}, False
            start = dict(glob)
            if cid in local:
                theta, w_mix, started = local[cid]
                diff = {k: glob[k] - theta[k] for k in HEAD}
                batches = ala_batches(dm.client_indices(cid), share, dm.client_work(cid, t).batch_size, dm.seed, t, cid)
                losses, epochs = [], 0
                for _ in range(1 if started else max_start_epochs):
                    epochs += 1
                    for b in batches:
                        mixed = {**glob, **{k: theta[k] + diff[k] * w_mix[k] for k in HEAD}}  # ALA's mix
                        g = grads(mixed, x[b], y[b])
                        losses.append(_loss(mixed, x[b], y[b]))
                        if learn_w:
                            w_mix = {k: np.clip(w_mix[k] - ala_lr * g[k] * diff[k], 0, 1) for k in HEAD}  # W's step
                    if started or (len(losses) > num_pre_loss and np.std(losses[-num_pre_loss:]) < threshold):
                        break
                if passes is not None and not started:
                    passes.append(epochs)
                start.update({k: theta[k] + diff[k] * w_mix[k] for k in HEAD})
                started = True
            w = start
            for batch in dm.client_batches(cid, t):
                g = grads(w, x[batch], y[batch])
                w = {k: w[k] - GAMMA * g[k] for k in w}
            local[cid] = ({k: w[k] for k in HEAD}, w_mix, started)
            drifts.append({k: w[k] - glob[k] for k in w})
            sizes.append(dm.client_num_samples(cid))
        p = np.array(sizes, dtype=float) / sum(sizes)
        delta = {k: sum(pi * d[k] for pi, d in zip(p, drifts)) for k in glob}
        if server_step is None:
            glob = {k: glob[k] + delta[k] for k in glob}
        else:
            server_step(glob, delta)
    return glob, local


def _row(theta, w_mix, started):
    return np.concatenate([*(theta[k].ravel() for k in HEAD), *(w_mix[k].ravel() for k in HEAD), [float(started)]])


@pytest.mark.parametrize("learn_w", [True, False], ids=["algorithm_1", "wrong_reference_w_not_learned"])
def test_fedala_equals_numpy_algorithm_1(tmp_path, learn_w):
    x, y, dm = datamodule()
    server = FedALA(top=["net.1"], **KW)
    w0, model, _ = fit(tmp_path, server, rounds=5, dm=dm)
    passes = []
    want, local = _fedala_reference(w0, x, y, dm, 5, learn_w=learn_w, passes=passes, **KW)
    assert passes and 1 < min(passes) < KW["max_start_epochs"] == max(passes)  # start phases: settled, and capped
    assert any(started for _, _, started in local.values())  # some client ran ALA (it came back)
    got, table = weights(model), server.client_algorithm_states["FedALAClient"]
    close = all(np.allclose(got[k], want[k], rtol=1e-12, atol=1e-13) for k in got)
    close = close and all(np.allclose(table.get(c).numpy(), _row(*local[c]), rtol=1e-12, atol=1e-13) for c in local)
    assert close is learn_w
    assert sorted(table.ids()) == sorted(local)


def test_fedalas_server_step_under_fedadam_equals_numpy(tmp_path):
    """Composable with any server rule: FedAdam (Reddi et al. 2021, Alg. 2, τ = 1e-3) on the n_i/n mean."""
    x, y, dm = datamodule()
    half = FedALAClient(top=["net.1"], share=0.8, lr=1.0, threshold=0.2, num_pre_loss=4, max_start_epochs=12)
    w0, model, _ = fit(tmp_path, FedAdam(lr=0.01), rounds=4, dm=dm, client_algorithms=[half])
    steps = {k: numpy_fedadam() for k in w0}  # one FedAdam state per parameter

    def adam(glob, delta):
        glob.update({k: steps[k](glob[k], delta[k]) for k in w0})

    want, _ = _fedala_reference(w0, x, y, dm, 4, server_step=adam, **KW)
    got = weights(model)
    for k in got:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)


def test_fedala_resume_equals_the_uninterrupted_run(tmp_path):
    full_server = FedALA(top=["net.1"], **KW)
    _, full, _ = fit(tmp_path / "a", full_server, rounds=4)
    fit(tmp_path / "b", FedALA(top=["net.1"], **KW), rounds=2, ckpt_dir=tmp_path / "cb")
    server = FedALA(top=["net.1"], **KW)
    _, resumed, _ = fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                        ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    a, b = weights(full), weights(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    ta, tb = full_server.client_algorithm_states["FedALAClient"], server.client_algorithm_states["FedALAClient"]
    assert sorted(ta.ids()) == sorted(tb.ids()) and all(torch.equal(ta.get(c), tb.get(c)) for c in ta.ids())


class _Evaluated(TwoLayer):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x).squeeze(-1), y))


def test_the_personal_model_is_the_ala_mix_with_the_stored_weights(tmp_path):

    x, y = regression_data(n=60, d=3, seed=1)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                             local_work=SampledLocalWork(epochs=[1, 2], batch_size=[3, 6], seed=1),
                             eval_fraction=0.25, eval_clients_per_round="all", eval_batch_size=4)
    dm.setup()
    torch.manual_seed(0)
    model = _Evaluated()
    server = FedALA(top=["net.1"], **KW)
    trainer = federated_fit(tmp_path, model, dm, server, rounds=3)
    glob, table = weights(model), server.client_algorithm_states["FedALAClient"]
    last = next(cb for cb in trainer.callbacks if isinstance(cb, FederatedEvaluation)).last
    want = []
    for cid in last.client_ids.tolist():
        w = dict(glob)
        if cid in table:
            row = table.get(cid).numpy()
            theta = {"net.1.weight": row[0:2].reshape(1, 2), "net.1.bias": row[2:3]}
            w_mix = {"net.1.weight": row[3:5].reshape(1, 2), "net.1.bias": row[5:6]}
            w.update({k: theta[k] + (glob[k] - theta[k]) * w_mix[k] for k in HEAD})
        want.append(_loss(w, x[dm.client_eval_indices(cid)], y[dm.client_eval_indices(cid)]))
    np.testing.assert_allclose(last.personal["val_loss"], want, rtol=1e-9)
    assert not np.allclose(last.personal["val_loss"], last.metrics["val_loss"])


@pytest.mark.parametrize("kwargs, match", [
    ({"top": []}, r"`top` must be a non-empty list"),
    ({"top": ["net.1"], "share": 0.0}, r"`share` must be a number in the open interval \(0, 1\)"),
    ({"top": ["net.1"], "lr": -1.0}, r"`lr` must be"),
    ({"top": ["net.1"], "threshold": 0}, r"`threshold` must be"),
    ({"top": ["net.1"], "num_pre_loss": 1}, r"`num_pre_loss` must be an integer >= 2"),
    ({"top": ["net.1"], "max_start_epochs": 0}, r"`max_start_epochs` must be an integer >= 1"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedALAClient(**kwargs)


def test_top_selecting_nothing_is_refused_at_fit_start(tmp_path):
    trainer = FederatedTrainer(max_epochs=1, callbacks=[FedALA(top=["classifier"])], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"`top` \['classifier'\] selects no parameter of TwoLayer"):
        trainer.fit(TwoLayer(), datamodule=datamodule()[2])
    assert trainer.global_step == 0


def test_the_ready_made_name_only_fixes_parts():
    from helpers import assert_ready_made_name

    assert_ready_made_name(FedALA)
