"""The sign compressor (Bernstein et al. 2018: sign(v), 1 bit an entry; Karimireddy et al. 2019, Alg. 1: the scaled
sign ‖v‖₁/d·sign(v), 32 + d bits) against NumPy."""

import numpy as np
import pytest
import torch

from lightning_fed.communication import Sign

V = np.array([0.5, -2.0, 0.0, 1.5, -0.25, 3.0, -1.0, 0.125, 2.0], dtype=np.float32)


def test_56_sign_sends_one_bit_an_entry():
    out, nbytes = Sign().compress(torch.tensor(V))
    np.testing.assert_array_equal(out.numpy(), np.where(V < 0, -1.0, 1.0))  # 0 is sent as +1
    assert nbytes == 2  # 9 bits


def test_56_scaled_sign_is_ef_signsgds_compressor():
    out, nbytes = Sign(scaled=True).compress(torch.tensor(V))
    scale = np.float32(np.abs(V.astype(np.float64)).sum() / V.size)
    np.testing.assert_array_equal(out.numpy(), (np.where(V < 0, -1.0, 1.0) * float(scale)).astype(np.float32))
    assert nbytes == 6  # 32 + 9 bits


def test_56_sign_refuses_a_non_bool_scaled():
    with pytest.raises(ValueError, match=r"`scaled` must be True or False"):
        Sign(scaled="yes")
