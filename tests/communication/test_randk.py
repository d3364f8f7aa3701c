"""Random-k sparsification (Stich et al. 2018, rand_k; unbiased: scaled by d/k) against its NumPy transcription with
the same permutation drawn from the client's generator."""

import numpy as np
import pytest
import torch

from lightning_fed.communication import RandK, client_generator
from communication.reference import randk

V = np.random.default_rng(3).normal(size=12)


@pytest.mark.parametrize("unbiased", [False, True])
def test_56_rand_k_equals_its_numpy_transcription(unbiased):
    out, size = RandK(k=4, unbiased=unbiased).compress(torch.tensor(V), client_generator(1, 4, 9))
    permutation = torch.randperm(12, generator=client_generator(1, 4, 9)).numpy()
    want, want_size = randk(V, 4, permutation, unbiased)
    np.testing.assert_array_equal(out.numpy(), want)
    assert size == want_size == 4 * (8 + 4)
    other = RandK(k=4).compress(torch.tensor(V), client_generator(1, 4, 8))[0]  # another client: other entries
    assert not torch.equal(other != 0, out != 0)


def test_56_rand_k_refuses_a_non_bool_unbiased():
    with pytest.raises(ValueError, match=r"`unbiased` must be True or False"):
        RandK(k=1, unbiased=1)
