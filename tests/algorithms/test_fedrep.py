"""FedRep (issue #41) against a NumPy transcription of Collins et al. 2021, Alg. 1 — the client's own head trained
for τ_h local steps with the body fixed, then the body with the head fixed; the body averaged uniformly over the
round's cohort — several rounds, partial participation, returning clients, a resume equal to the uninterrupted run;
FedRep's body under FedAdam."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.test_fedper import BODY, GAMMA, HEAD, TwoLayer, datamodule, fit, grads, weights
from lightning_fed.algorithms import FedRepClient
from lightning_fed.callbacks import FedAdam, FedRep
from lightning_fed.checks import ArgumentError


def _fedrep_reference(w0, x, y, dm, rounds, head_steps=None, server_step=None, head_epochs=None):
    """Alg. 1: l. 7-9 (head steps, body fixed), l. 10-12 (body steps, head fixed), l. 14 (uniform mean of bodies).
    τ_h in steps (``head_steps``), or in epochs as the paper's experiments (Sec. 5, ``head_epochs`` = e_h): a step
    trains the head while the samples seen so far in the round are below e_h·n_i (the client's first e_h passes over
    its n_i samples)."""
    glob, own = dict(w0), {}
    for t in range(rounds):
        drifts = []
        for cid in dm.sample_clients(t):
            w = {**glob, **own.get(int(cid), {})}
            seen, n = 0, dm.client_num_samples(cid)
            for s, batch in enumerate(dm.client_batches(cid, t)):
                g = grads(w, x[batch], y[batch])
                head = s < head_steps if head_epochs is None else seen < head_epochs * n
                part = HEAD if head else BODY
                w = {k: (w[k] - GAMMA * g[k] if k in part else w[k]) for k in w}
                seen += len(batch)
            own[int(cid)] = {k: w[k] for k in HEAD}
            drifts.append({k: w[k] - glob[k] for k in BODY})
        delta = {k: np.mean([d[k] for d in drifts], axis=0) for k in BODY}
        if server_step is None:
            glob.update({k: glob[k] + delta[k] for k in BODY})
        else:
            server_step(glob, delta)
    return glob, own


def test_fedrep_equals_numpy_algorithm_1(tmp_path):
    x, y, dm = datamodule()
    steps = [len(dm.client_batches(c, t)) for t in range(5) for c in dm.sample_clients(t)]
    assert min(steps) <= 2 < max(steps)  # some clients train only their head, others both
    server = FedRep(head=["net.1"], head_steps=2)
    w0, model, _ = fit(tmp_path, server, rounds=5, dm=dm)
    _assert_equal_to_reference(server, model, w0, *_fedrep_reference(w0, x, y, dm, rounds=5, head_steps=2))


def _assert_equal_to_reference(server, model, w0, want, own):
    """The global body equals the reference's, the global head is w0's, every client's head its own."""
    got = weights(model)
    for k in BODY:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-13)
    assert all(np.array_equal(got[k], w0[k]) for k in HEAD)
    table = server.client_algorithm_states["FedRepClient"]
    assert sorted(table.ids()) == sorted(own)
    for cid, head in own.items():
        np.testing.assert_allclose(table.get(cid).numpy(), np.concatenate([head[k].ravel() for k in HEAD]),
                                   rtol=1e-12, atol=1e-13)


def test_fedreps_body_under_fedadam_equals_numpy(tmp_path):
    """Composable with any server rule: FedAdam (Reddi et al. 2021, Alg. 2, τ = 1e-3) on FedRep's uniform body mean."""
    x, y, dm = datamodule()
    server = FedAdam(lr=0.01, weighting="uniform")
    w0, model, _ = fit(tmp_path, server, rounds=3, dm=dm, client_algorithms=[FedRepClient(head=["net.1"], head_steps=2)])
    m = {k: np.zeros_like(w0[k]) for k in BODY}
    v = {k: np.full_like(w0[k], 1e-6) for k in BODY}

    def adam(glob, delta):
        for k in BODY:
            m[k] = 0.9 * m[k] + 0.1 * delta[k]
            v[k] = 0.99 * v[k] + 0.01 * delta[k] ** 2
            glob[k] = glob[k] + 0.01 * m[k] / (np.sqrt(v[k]) + 1e-3)

    want, _ = _fedrep_reference(w0, x, y, dm, rounds=3, head_steps=2, server_step=adam)
    got = weights(model)
    for k in BODY:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)
    assert all(np.array_equal(got[k], w0[k]) for k in HEAD)


def test_fedrep_resume_equals_the_uninterrupted_run(tmp_path):
    full_server = FedRep(head=["net.1"], head_steps=2)
    _, full, _ = fit(tmp_path / "a", full_server, rounds=4)
    fit(tmp_path / "b", FedRep(head=["net.1"], head_steps=2), rounds=2, ckpt_dir=tmp_path / "cb")
    server = FedRep(head=["net.1"], head_steps=2)
    _, resumed, _ = fit(tmp_path / "b", server, rounds=4, ckpt_dir=tmp_path / "cb2",
                        ckpt_path=str(tmp_path / "cb" / "last.ckpt"))
    a, b = weights(full), weights(resumed)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    ta, tb = full_server.client_algorithm_states["FedRepClient"], server.client_algorithm_states["FedRepClient"]
    assert sorted(ta.ids()) == sorted(tb.ids()) and all(torch.equal(ta.get(c), tb.get(c)) for c in ta.ids())


@pytest.mark.parametrize("head_steps", [-1, 1.5, True])
def test_head_steps_must_be_a_non_negative_integer(head_steps):
    with pytest.raises(ValueError, match=r"`head_steps` must be an integer >= 0"):
        FedRepClient(head=["net.1"], head_steps=head_steps)


@pytest.mark.parametrize("wrong", [False, True])
def test_fedrep_head_epochs_equals_numpy_with_epochs_counted(tmp_path, wrong):
    """head_epochs=1 (the paper's way): clients of 1 local epoch train only their head, clients of 2 the head for one
    pass and the body for the other, whatever their batch size (3 or 6 here, so 3 to 6 head steps); the wrong
    reference counts the epoch as one step (head_steps=1) and must differ."""
    x, y, dm = datamodule()
    passes = [sum(map(len, dm.client_batches(c, t))) / dm.client_num_samples(c) for t in range(3)
              for c in dm.sample_clients(t)]
    assert min(passes) <= 1 < max(passes)  # some clients train only the head, others the body too
    server = FedRep(head=["net.1"], head_epochs=1)
    w0, model, _ = fit(tmp_path, server, rounds=3, dm=dm)
    if wrong:
        want, own = _fedrep_reference(w0, x, y, dm, rounds=3, head_steps=1)
        assert not np.allclose(weights(model)["net.0.weight"], want["net.0.weight"], rtol=1e-6, atol=0)
        return
    _assert_equal_to_reference(server, model, w0, *_fedrep_reference(w0, x, y, dm, rounds=3, head_epochs=1))


def test_the_default_is_ten_head_steps_as_before():
    assert FedRepClient(head=["net.1"]).head_steps == 10 and FedRepClient(head=["net.1"]).head_epochs is None
    assert repr(FedRep(head=["net.1"])) == "FedRep(head=['net.1'], head_steps=10, lr=1.0, weighting='uniform')"


@pytest.mark.parametrize("kwargs, match", [
    ({"head_steps": 2, "head_epochs": 1}, r"Give exactly one of `head_steps` \(local steps\) and `head_epochs`"),
    ({"head_epochs": -1}, r"`head_epochs` must be an integer >= 0 or None, got -1"),
])
def test_head_epochs_bad_values_are_refused(kwargs, match):
    for make in (FedRepClient, FedRep):
        with pytest.raises(ArgumentError, match=match):
            make(head=["net.1"], **kwargs)


def test_head_epochs_outside_a_federated_trainer_is_refused_by_name():
    from lightning_fed.client.runner import ClientContext

    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    half = FedRepClient(head=["1"], head_epochs=1)
    half.setup(net)
    context = ClientContext(client_id=0, round_idx=0, global_params=list(net.parameters()), global_buffers=[],
                            client_lr=0.1)
    with pytest.raises(RuntimeError, match=r"FedRepClient\(head=\['1'\], head_epochs=1\) counts the head's local "
                                           r"epochs .* \(or give `head_steps`\)"):
        half.start(net, context, None)
