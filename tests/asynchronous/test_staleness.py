"""s(τ) against the papers' formulas, by hand (Nguyen et al. 2022; Xie, Koyejo, Gupta 2019)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_fed.asynchronous import StalenessWeighting
from lightning_fed.checks import ArgumentError

TAU = np.array([0, 1, 2, 5, 10])


def test_fedbuff_is_one_over_root_one_plus_tau():
    expected = [1.0, 1 / math.sqrt(2), 1 / math.sqrt(3), 1 / math.sqrt(6), 1 / math.sqrt(11)]
    np.testing.assert_allclose(StalenessWeighting("fedbuff")(TAU), expected, rtol=0, atol=1e-15)


def test_constant_polynomial_and_hinge_follow_xie_et_al():
    np.testing.assert_array_equal(StalenessWeighting("constant")(TAU), np.ones(5))
    # s_a(t − τ) = (t − τ + 1)^(−a), a = 0.5 and 2
    np.testing.assert_allclose(StalenessWeighting("polynomial", a=0.5)(TAU), [1, 2**-0.5, 3**-0.5, 6**-0.5, 11**-0.5],
                               rtol=1e-15)
    np.testing.assert_allclose(StalenessWeighting("polynomial", a=2.0)(TAU), [1, 1 / 4, 1 / 9, 1 / 36, 1 / 121],
                               rtol=1e-15)
    # s_{a,b}: 1 up to b = 2, then 1 / (a(τ − b) + 1) with a = 10: τ = 5 → 1/31, τ = 10 → 1/81
    np.testing.assert_allclose(StalenessWeighting("hinge", a=10.0, b=2)(TAU), [1, 1, 1, 1 / 31, 1 / 81], rtol=1e-15)


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "exp"}, "`staleness` must be one of"),
    ({"name": "polynomial", "a": 0.0}, "`a` must be a finite number > 0"),
    ({"name": "hinge", "b": -1}, "`b` must be an integer >= 0"),
])
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        StalenessWeighting(**kwargs)


def test_negative_or_fractional_staleness_is_refused():
    with pytest.raises(ArgumentError, match="staleness τ must be integers >= 0"):
        StalenessWeighting()(np.array([-1]))
    with pytest.raises(ArgumentError, match="staleness τ must be integers >= 0"):
        StalenessWeighting()(np.array([0.5]))
