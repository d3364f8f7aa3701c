"""Top-k sparsification (Stich et al. 2018, top_k) against its NumPy transcription, ties to the lower index; size
k values + k int32 indices; the k / fraction check."""

import numpy as np
import pytest
import torch

from lightning_fed.checks import ArgumentError
from lightning_fed.communication import TopK
from communication.reference import topk

V = np.array([0.5, -2.0, 2.0, 0.1, -0.5, 3.0, 0.0, 1.0, -1.0, 0.25], dtype=np.float32)


@pytest.mark.parametrize("kwargs, k", [({"k": 3}, 3), ({"k": 4}, 4), ({"fraction": 0.25}, 3), ({"k": 99}, 10)])
def test_56_top_k_equals_its_numpy_transcription(kwargs, k):
    out, size = TopK(**kwargs).compress(torch.tensor(V))
    want, want_size = topk(V, k)
    np.testing.assert_array_equal(out.numpy(), want)
    assert size == want_size == k * 8



def test_56_top_k_ties_go_to_the_lower_index():
    out, _ = TopK(k=2).compress(torch.tensor(V))  # 3.0, then |−2| = |2|: index 1 before index 2
    assert out.numpy().tolist()[1:3] == [-2.0, 0.0] and out.numpy()[5] == 3.0


@pytest.mark.parametrize("kwargs", [{}, {"k": 1, "fraction": 0.5}, {"k": 0}, {"fraction": 1.0}])
def test_56_top_k_needs_exactly_one_of_k_and_fraction(kwargs):
    with pytest.raises(ArgumentError, match=r"`k`|`fraction`"):
        TopK(**kwargs)


@pytest.mark.parametrize("d, k, seed", [(5000, 50, 0), (5000, 50, 1), (4096, 1000, 2), (20000, 7, 3)])
def test_56_top_k_of_a_long_vector_with_many_ties_equals_its_numpy_transcription(d, k, seed):
    # long enough for the candidate search of top_indices (d >= 1024, k <= d/4), with ties at the k-th largest
    rng = np.random.default_rng(seed)
    v = (rng.integers(-40, 41, size=d) / 8).astype(np.float32)
    out, size = TopK(k=k).compress(torch.tensor(v))
    want, want_size = topk(v, k)
    np.testing.assert_array_equal(out.numpy(), want)
    assert size == want_size
