"""QSGD (Alistarh et al. 2017, Sec. 3.1) against its NumPy transcription with the same draws, its size (norm 32 bits,
sign bit and ⌈log₂(s+1)⌉ level bits an entry), unbiasedness, and its argument check."""

import numpy as np
import pytest
import torch

from lightning_fed.checks import ArgumentError
from lightning_fed.communication import QSGD, client_generator
from communication.reference import qsgd

V = np.random.default_rng(1).normal(size=10).astype(np.float32)


@pytest.mark.parametrize("s, nbytes", [(1, 7), (7, 9), (15, 11)])  # 32 + 10·2 = 52, 32 + 10·4 = 72, 32 + 10·5 = 82 bits
def test_56_qsgd_equals_its_numpy_transcription_with_the_same_draws(s, nbytes):
    out, size = QSGD(levels=s).compress(torch.tensor(V), client_generator(3, 2, 5))
    u = torch.rand(V.size, generator=client_generator(3, 2, 5)).numpy().astype(np.float64)
    want, want_size = qsgd(V, s, u)
    np.testing.assert_array_equal(out.numpy(), want)
    assert size == want_size == nbytes


def test_56_qsgd_is_unbiased_and_on_its_levels():
    v = torch.tensor([0.3, -0.1, 0.0, 0.9])
    draws = torch.stack([QSGD(levels=2).compress(v, client_generator(0, t, 0))[0] for t in range(1500)])
    np.testing.assert_allclose(draws.mean(0).numpy(), v.numpy(), atol=0.05)
    levels = draws.abs() / float(torch.linalg.vector_norm(v)) * 2
    assert torch.allclose(levels, levels.round(), atol=1e-5) and float(draws[:, 2].abs().max()) == 0.0


def test_56_qsgd_of_zero_is_zero_and_bad_levels_are_refused():
    assert torch.equal(QSGD().compress(torch.zeros(3), client_generator(0, 0, 0))[0], torch.zeros(3))
    with pytest.raises(ArgumentError, match=r"`levels` must be an integer >= 1, got 0"):
        QSGD(levels=0)
