"""Gradient diversity D (Zeng et al. 2024, FedAWARE, Def. 3.1 Eq. 3 / Def. 3.2 Eq. 6) is the square root of
Σλ_i‖g_i‖² / ‖Σλ_i g_i‖², checked against NumPy."""

import numpy as np
import pytest
import torch

from lightning_fed import ClientUpdate
from lightning_fed.callbacks import FedAvg, FedAWARE


def _updates(deltas, sizes):
    return [
        ClientUpdate(client_id=i, delta=[torch.tensor(p, dtype=torch.float64) for p in d], num_samples=n,
                     num_steps=1, loss=0.0)
        for i, (d, n) in enumerate(zip(deltas, sizes))
    ]


def test_fedavg_diversity_is_the_square_root_of_the_ratio():
    # Two parameters (a 2-vector and a 1x2 matrix) and three clients of 1, 2 and 5 samples.
    deltas = [
        [np.array([1.0, 0.0]), np.array([[2.0, -1.0]])],
        [np.array([-1.0, 3.0]), np.array([[0.5, 0.0]])],
        [np.array([0.0, 1.0]), np.array([[1.0, 1.0]])],
    ]
    sizes = [1, 2, 5]
    server = FedAvg()
    updates = _updates(deltas, sizes)
    pseudo = server.aggregate(updates)
    lam = np.array(sizes, float) / sum(sizes)
    flat = [np.concatenate([p.ravel() for p in d]) for d in deltas]
    mean = sum(w * f for w, f in zip(lam, flat))
    ratio = sum(w * f @ f for w, f in zip(lam, flat)) / (mean @ mean)
    got = server.gradient_diversity(updates, pseudo)
    assert got == pytest.approx(np.sqrt(ratio), rel=1e-13)
    assert got != pytest.approx(ratio, rel=1e-3)  # the old (squared) quantity
    assert got >= 1.0


def test_identical_clients_have_diversity_exactly_one_and_orthogonal_ones_sqrt_n():
    server = FedAvg(weighting="uniform")
    same = _updates([[np.array([3.0, -4.0])]] * 4, [1, 2, 3, 4])
    assert server.gradient_diversity(same, server.aggregate(same)) == pytest.approx(1.0, rel=1e-15)
    # N orthogonal unit vectors, uniform λ: Σλ‖g‖² = 1, ‖mean‖² = 1/N, so D = √N (the squared version gave N).
    eye = _updates([[row] for row in np.eye(4)], [1, 1, 1, 1])
    assert server.gradient_diversity(eye, server.aggregate(eye)) == pytest.approx(2.0, rel=1e-15)


def test_zero_pseudo_gradient_gives_nan():
    server = FedAvg(weighting="uniform")
    updates = _updates([[np.array([1.0, 2.0])], [np.array([-1.0, -2.0])]], [1, 1])
    assert np.isnan(server.gradient_diversity(updates, server.aggregate(updates)))


def test_fedaware_diversity_is_the_square_root_of_eq6():
    # Two clients with orthogonal unit momenta after one round with α·m + (1−α)·g, m_0 = 0: the min-norm weights
    # are (1/2, 1/2), ‖Σλ v‖² = 1/2 and Σλ‖v‖² = 1, so D̃ = √2 (Eq. 6 / Eq. 7).
    server = FedAWARE(lr=1.0, num_clients=2, fedavg_warmup=False, normalize=True)
    params = [torch.zeros(2, dtype=torch.float64)]
    updates = _updates([[np.array([2.0, 0.0])], [np.array([0.0, 5.0])]], [1, 1])
    pseudo = server.server_update(params, updates)
    np.testing.assert_allclose(server.last_weights, [0.5, 0.5], atol=1e-6)
    lam = server.last_weights
    gram = server.gram.numpy()
    unit = gram / np.sqrt(np.outer(np.diag(gram), np.diag(gram)))
    want = np.sqrt((lam @ np.diag(unit)) / (lam @ unit @ lam))
    got = server.gradient_diversity(updates, pseudo)
    assert got == pytest.approx(want, rel=1e-12)
    assert got == pytest.approx(np.sqrt(2.0), rel=1e-5)


def test_norms_kept_by_the_loops_finiteness_check_give_the_same_diversity_bit_for_bit():
    """Issue #44: the loop's finiteness check keeps each Δ_i's per-tensor norms (``delta_norms``) so the diversity
    reads Δ_i once; the value is exactly the one computed from scratch, and norms of a Δ_i changed in place since, or
    of another list (a chain's transformed g_i), are not used."""
    from lightning_fed.loop import FederatedFitLoop
    from lightning_fed.server.aggregators import NormalizedDirections, WeightedMean  # g_i = Δ_i/(γ·n_i): new

    generator = torch.Generator().manual_seed(0)
    updates = [ClientUpdate(client_id=i, delta=[torch.randn(7, 3, generator=generator), torch.randn(5, generator=generator)],
                            num_samples=n, num_steps=2, loss=0.0, client_lr=0.1, client_lrs=[0.1, 0.1])
               for i, n in enumerate([3, 1, 4])]
    server = FedAvg()
    pseudo = server.aggregate(updates)
    kept: dict = {}
    assert FederatedFitLoop._finite_updates(updates, kept) == [True, True, True]
    assert set(kept) == {id(u) for u in updates}
    assert server.gradient_diversity(updates, pseudo, delta_norms=kept) == server.gradient_diversity(updates, pseudo)
    # a stale entry (Δ_0 scaled in place after the check) is recomputed, not read
    updates[0].delta[1].mul_(3.0)
    pseudo = server.aggregate(updates)
    assert server.gradient_diversity(updates, pseudo, delta_norms=kept) == server.gradient_diversity(updates, pseudo)
    # entries that are not g_i (a transform stage makes new tensors) are not read: poison them to be sure
    poisoned = {k: v._replace(norms=torch.full_like(v.norms, float("nan"))) for k, v in kept.items()}
    assert np.isnan(server.gradient_diversity(updates[1:], server.aggregate(updates[1:]), delta_norms=poisoned))  # read
    scaled = FedAvg(aggregators=[NormalizedDirections(), WeightedMean()])
    pseudo = scaled.aggregate(updates)
    want = scaled.gradient_diversity(updates, pseudo)
    assert np.isfinite(want) and scaled.gradient_diversity(updates, pseudo, delta_norms=poisoned) == want
