"""float16 / bfloat16 casts of the update (issue #56): 2 bytes an entry, decoded values against NumPy's float16 and
a bit-level bfloat16 rounding (round to nearest even)."""

import numpy as np
import torch

from lightning_fed.communication import BFloat16, Float16
from communication.reference import bfloat16

V = np.random.default_rng(0).normal(scale=[1e-3, 1.0, 300.0], size=(40, 3)).astype(np.float32).ravel()


def test_56_float16_equals_numpy_float16():
    out, nbytes = Float16().compress(torch.tensor(V))
    np.testing.assert_array_equal(out.numpy(), V.astype(np.float16).astype(np.float32))
    assert nbytes == 2 * V.size == 240


def test_56_bfloat16_equals_round_to_nearest_even_of_the_upper_16_bits():
    out, nbytes = BFloat16().compress(torch.tensor(V))
    np.testing.assert_array_equal(out.numpy(), bfloat16(V))
    assert nbytes == 240
    halfway = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8], dtype=np.float32)  # ties: to even
    np.testing.assert_array_equal(BFloat16().compress(torch.tensor(halfway))[0].numpy(), [1.0, 1.0 + 2.0 ** -6])
