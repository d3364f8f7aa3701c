"""Fed-LAMB / Fed-AMS (Karimi, Li, Li, Alg. 1) and ServerLAMB (You et al. 2020, Alg. 2) against NumPy
transcriptions of the papers' update rules."""

from __future__ import annotations

import math
import numpy as np
import pytest
import torch
from lightning_fed import ClientUpdate
from lightning_fed.callbacks.server_lamb import ServerLAMB


SHAPES = [(3, 2), (2,)]


def np_server_lamb(x0, rounds, *, lr, beta1=0.9, beta2=0.999, eps=1e-6, wd=0.0, bias=True, phi=(0.0, math.inf),
                   weighting="num_samples"):
    """You et al. 2020, Alg. 2 on g_t = −Δ_t, one step per round."""
    x = [p.copy() for p in x0]
    m = [np.zeros_like(p) for p in x0]
    v = [np.zeros_like(p) for p in x0]
    for t, clients in enumerate(rounds, start=1):
        delta = pseudo_gradient(clients, weighting)
        for k in range(len(x)):
            g = -delta[k]
            m[k] = beta1 * m[k] + (1 - beta1) * g
            v[k] = beta2 * v[k] + (1 - beta2) * g**2
            mh = m[k] / (1 - beta1**t) if bias else m[k]
            vh = v[k] / (1 - beta2**t) if bias else v[k]
            u = mh / (np.sqrt(vh) + eps) + wd * x[k]
            phi_k = min(max(np.linalg.norm(x[k]), phi[0]), phi[1])
            u_norm = np.linalg.norm(u)
            scale = phi_k / u_norm if phi_k > 0 and u_norm > 0 else 1.0
            x[k] = x[k] - lr * scale * u
    return x


def pseudo_gradient(clients, weighting="num_samples"):
    w = np.array([n for _, n in clients], dtype=float) if weighting == "num_samples" else np.ones(len(clients))
    w = w / w.sum()
    return [sum(wi * deltas[k] for wi, (deltas, _) in zip(w, clients)) for k in range(len(clients[0][0]))]


# ---------------------------------------------------------------------------------------------- ServerLAMB
def _rounds(seed, shapes=SHAPES, zero_first=False):
    rng = np.random.default_rng(seed)
    x0 = [rng.normal(size=s) for s in shapes]
    if zero_first:
        x0[-1] = np.zeros(shapes[-1])
    rounds = [[([rng.normal(scale=0.1, size=s) for s in shapes], int(rng.integers(1, 50))) for _ in range(3)]
              for _ in range(4)]
    return x0, rounds


def _run_server(server, x0, rounds):
    params = [torch.tensor(p, dtype=torch.float64) for p in x0]
    for clients in rounds:
        updates = [ClientUpdate(i, [torch.tensor(d) for d in deltas], n, 1, 0.0)
                   for i, (deltas, n) in enumerate(clients)]
        server.server_update(params, updates)
    return [p.numpy() for p in params]


@pytest.mark.parametrize("kwargs,np_kwargs", [
    (dict(lr=0.05), dict(lr=0.05)),
    (dict(lr=0.1, weight_decay=0.1, bias_correction=False, weighting="uniform"),
     dict(lr=0.1, wd=0.1, bias=False, weighting="uniform")),
    (dict(lr=0.02, beta1=0.5, beta2=0.9, eps=1e-3, phi_min=0.5, phi_max=1.0),
     dict(lr=0.02, beta1=0.5, beta2=0.9, eps=1e-3, phi=(0.5, 1.0))),
])
@pytest.mark.parametrize("zero_first", [False, True])
def test_server_lamb_matches_numpy(kwargs, np_kwargs, zero_first):
    x0, rounds = _rounds(8, zero_first=zero_first)
    got = _run_server(ServerLAMB(**kwargs), x0, rounds)
    want = np_server_lamb(x0, rounds, **np_kwargs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)


def test_server_lamb_state_round_trip():
    x0, rounds = _rounds(9)
    full = _run_server(ServerLAMB(lr=0.05), x0, rounds)
    first = ServerLAMB(lr=0.05)
    mid = _run_server(first, x0, rounds[:2])
    second = ServerLAMB(lr=0.05)
    second.load_state_dict(first.state_dict())
    assert second.num_steps == 2
    for a, b in zip(full, _run_server(second, mid, rounds[2:])):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
