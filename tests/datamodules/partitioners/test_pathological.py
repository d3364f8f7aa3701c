"""PathologicalPartitioner's class_assignment_mode (Flower's random / deterministic / first-deterministic)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.datamodules import PathologicalPartitioner

LABELS = np.random.default_rng(0).permutation(np.arange(60) % 5)  # 5 classes x 12


def reference(held, seed_rng, labels=LABELS):
    """Each class (sorted) shuffled and split evenly, larger pieces first, among its holders in client order."""
    out = {c: [] for c in range(len(held))}
    for k in np.unique(labels):
        members = seed_rng.permutation(np.flatnonzero(labels == k))
        holders = [c for c in range(len(held)) if k in held[c]]
        for c, piece in zip(holders, np.array_split(members, len(holders))):
            out[c].extend(piece.tolist())
    return out


def check(p, expected):
    for c, idx in expected.items():
        assert sorted(p.client_indices(c).tolist()) == sorted(idx)


def test_deterministic_hand_computed():
    p = PathologicalPartitioner(5, 2, seed=3, class_assignment_mode="deterministic").partition(60, labels=LABELS)
    held = [[0, 1], [1, 2], [2, 3], [3, 4], [4, 0]]  # client c: (c + t) % 5
    assert [sorted(np.unique(LABELS[p.client_indices(c)]).tolist()) for c in range(5)] == [sorted(h) for h in held]
    check(p, reference(held, np.random.default_rng(3)))
    assert (p.sizes() == 12).all()


def test_random_matches_reference():
    rng = np.random.default_rng(1)
    held = [rng.choice(5, size=3, replace=False).tolist() for _ in range(6)]
    p = PathologicalPartitioner(6, 3, seed=1, class_assignment_mode="random").partition(60, labels=LABELS)
    check(p, reference(held, rng))


def test_first_deterministic_matches_reference():
    rng = np.random.default_rng(2)
    held = []
    for c in range(7):
        first = c % 5
        held.append([first] + rng.choice([k for k in range(5) if k != first], size=1, replace=False).tolist())
    p = PathologicalPartitioner(7, 2, seed=2, class_assignment_mode="first-deterministic").partition(60, labels=LABELS)
    check(p, reference(held, rng))
    for c in range(7):
        assert c % 5 in LABELS[p.client_indices(c)]


def test_unused_class_is_an_error_not_dropped_data():
    # 5 clients x 1 random class over 5 classes: seed 0 draws some class twice, so another one is held by nobody
    rng = np.random.default_rng(0)
    assert len({int(rng.choice(5, size=1, replace=False)[0]) for _ in range(5)}) < 5
    with pytest.raises(ValueError, match="gave no client class"):
        PathologicalPartitioner(5, 1, seed=0, class_assignment_mode="random").partition(60, labels=LABELS)


def test_bad_mode():
    with pytest.raises(ValueError, match="class_assignment_mode.*'balanced', 'random', 'deterministic'"):
        PathologicalPartitioner(5, 2, class_assignment_mode="first_deterministic")
