"""Staleness weightings s(τ) of asynchronous federated training (issue #54).

τ is a client update's staleness: the server steps taken since the model version the client started from
(τ = 0: it trained on the current model). An update is scaled by s(τ) before it enters the buffer:

* ``"fedbuff"``: s(τ) = 1/√(1 + τ), the weighting of FedBuff's experiments (Nguyen et al., "Federated Learning with
  Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1 scales each client update by s(τ_i) as it is buffered);
* ``"constant"``: s(τ) = 1 (Xie, Koyejo, Gupta, "Asynchronous Federated Optimization", 2019: constant s);
* ``"polynomial"``: s_a(τ) = (τ + 1)^(−a), a > 0 (Xie et al. 2019: s_a(t − τ) = (t − τ + 1)^(−a));
* ``"hinge"``: s_{a,b}(τ) = 1 if τ <= b, else 1 / (a·(τ − b) + 1), a > 0, b >= 0 (Xie et al. 2019, hinge).

(Xie et al. write the staleness as t − τ with τ the client's start version; here τ is that difference.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lightning_fed.checks import ArgumentError, check_choice, check_int, check_positive

__all__ = ["STALENESS_WEIGHTINGS", "StalenessWeighting"]

#: The staleness weightings by name.
STALENESS_WEIGHTINGS = ("fedbuff", "constant", "polynomial", "hinge")


class StalenessWeighting:
    """s(τ), one of :data:`STALENESS_WEIGHTINGS` (the module doc gives the formulas and their sources).

    Args:
        name: ``"fedbuff"`` (default), ``"constant"``, ``"polynomial"`` or ``"hinge"``.
        a: The exponent of ``"polynomial"`` / the slope of ``"hinge"``, a finite number > 0 (default 0.5).
        b: The staleness up to which ``"hinge"`` keeps s = 1, an integer >= 0 (default 4).

    Raises:
        ArgumentError: an unknown ``name``, ``a <= 0``, ``b < 0`` (named, with the allowed values).

    Example: τ = 0, 3, 8::

        >>> tau = np.array([0, 3, 8])
        >>> StalenessWeighting()(tau)  # 1/√1, 1/√4, 1/√9
        array([1.        , 0.5       , 0.33333333])
        >>> StalenessWeighting("polynomial", a=1.0)(tau)  # 1/1, 1/4, 1/9
        array([1.        , 0.25      , 0.11111111])
        >>> StalenessWeighting("hinge", a=0.5, b=4)(tau)  # 1, 1, 1/(0.5·4 + 1)
        array([1.        , 1.        , 0.33333333])
        >>> StalenessWeighting("linear")
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `staleness` must be one of ('fedbuff', 'constant', 'polynomial', 'hinge'), got 'linear'.
    """

    def __init__(self, name: str = "fedbuff", a: float = 0.5, b: int = 4) -> None:
        self.name = check_choice("staleness", name, STALENESS_WEIGHTINGS)
        self.a = check_positive("a", a)
        self.b = check_int("b", b, 0)

    def __call__(self, tau: Any) -> np.ndarray:
        """s(τ) for integer staleness ``tau >= 0`` (any shape): float64 of the same shape."""
        tau = np.asarray(tau)
        if tau.size and (not np.issubdtype(tau.dtype, np.integer) or tau.min() < 0):
            raise ArgumentError(f"staleness τ must be integers >= 0, got {tau!r}.")
        t = tau.astype(np.float64)
        if self.name == "fedbuff":
            return 1.0 / np.sqrt(1.0 + t)
        if self.name == "constant":
            return np.ones_like(t)
        if self.name == "polynomial":
            return (t + 1.0) ** (-self.a)
        return np.where(t <= self.b, 1.0, 1.0 / (self.a * (t - self.b) + 1.0))

    def settings(self) -> dict[str, Any]:
        """``{"name", "a", "b"}`` (the run record)."""
        return {"name": self.name, "a": self.a, "b": self.b}

    def __repr__(self) -> str:
        return f"StalenessWeighting({self.name!r}, a={self.a}, b={self.b})"
