"""Deterministic k-bit min-max quantisation against its NumPy transcription; size 64 + d·k bits."""

import numpy as np
import pytest
import torch

from lightning_fed.checks import ArgumentError
from lightning_fed.communication import UniformQuantization
from communication.reference import uniform

V = np.random.default_rng(2).normal(size=10).astype(np.float32)


@pytest.mark.parametrize("k, nbytes", [(1, 10), (3, 12), (8, 18)])  # 64 + 10, 64 + 30, 64 + 80 bits
def test_56_uniform_k_bit_equals_its_numpy_transcription(k, nbytes):
    out, size = UniformQuantization(bits=k).compress(torch.tensor(V))
    want, want_size = uniform(V, k)
    np.testing.assert_array_equal(out.numpy(), want)
    assert size == want_size == nbytes
    assert len(np.unique(out.numpy())) <= 2 ** k


def test_56_uniform_constant_vector_and_bad_bits():
    assert torch.equal(UniformQuantization().compress(torch.full((3,), 0.25))[0], torch.full((3,), 0.25))
    for bad in (0, 17, 2.5):
        with pytest.raises(ArgumentError, match=r"`bits` must be an integer"):
            UniformQuantization(bits=bad)
