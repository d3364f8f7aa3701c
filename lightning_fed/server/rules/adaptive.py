"""The adaptive server rules of Reddi et al. 2021, Alg. 2 — Adagrad (l. 12), Yogi (l. 13), Adam (l. 14) — with the
peer frameworks' conventions (Flower, TensorFlow Federated) and torch-style bias correction.

Per round t (Alg. 2, l. 11-15; t counted from 0 in the paper, ``step`` = t + 1 here)::

    m_t = β₁·m_{t−1} + (1 − β₁)·Δ_t                      (l. 11; m_{−1} = 0)
    v_t = <Adagrad | Yogi | Adam rule>                    (l. 12 / 13 / 14; v_{−1} = initial_accumulator)
    x_{t+1} = x_t + η·m_t / (√v_t + τ)                   (l. 15)

The conventions (``convention=``) and their sources are documented on
:class:`~lightning_fed.callbacks.AdaptiveServerOptimizer`; the formulas are here.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.server.checks import check_positive, check_unit_interval
from lightning_fed.server.moments import first_moment_, second_moment_adam_
from lightning_fed.server.rules.base import Rule, zeros_like_all

#: The named conventions (``convention=``).
CONVENTIONS = ("reddi", "flower", "tff")

#: Default v_{−1} per (convention, rule) where the framework fixes or defaults it (``None``: τ², Reddi et al.).
_INITIAL_ACCUMULATOR = {
    ("flower", "adam"): 0.0, ("flower", "yogi"): 0.0, ("flower", "adagrad"): 0.0,
    ("tff", "adam"): 0.0, ("tff", "yogi"): 1e-6, ("tff", "adagrad"): 0.1,
}
#: (convention, rule) pairs whose framework has no option for v_{−1} (always zeros).
_FIXED_ZERO_ACCUMULATOR = {("flower", "adam"), ("flower", "yogi"), ("flower", "adagrad"), ("tff", "adam")}


class AdaptiveState(NamedTuple):
    """m (``exp_avg``) and v (``exp_avg_sq``), one tensor per parameter (the names of the checkpoints so far).

    Example::

        >>> import torch
        >>> Adam().init([torch.zeros(2)])  # m_{−1} = 0, v_{−1} = τ²
        AdaptiveState(exp_avg=[tensor([0., 0.])], exp_avg_sq=[tensor([1.0000e-06, 1.0000e-06])])
    """

    exp_avg: list[Tensor]
    exp_avg_sq: list[Tensor]


def adagrad_beta1(beta1: Optional[float], convention: str) -> float:
    """β₁ of Adagrad: ``None`` means 0.9 under ``"reddi"`` and 0 under ``"flower"``/``"tff"`` (no momentum there).

    Raises:
        ValueError: ``beta1`` ≠ 0 with ``convention="flower"``/``"tff"``.
    """
    if beta1 is None:
        return 0.9 if convention == "reddi" else 0.0
    if convention in ("flower", "tff") and beta1 != 0:
        raise ValueError(
            f"convention={convention!r}: the framework's Adagrad has no momentum (β₁ = 0), got `beta1`={beta1!r}. "
            "Leave `beta1` unset or use convention='reddi'."
        )
    return beta1


class AdaptiveRule(Rule):
    """Reddi et al. 2021, Alg. 2 with the second-moment rule :attr:`second_moment` of the subclass
    (:class:`Adam`, :class:`Yogi`, :class:`Adagrad`; see the module doc and
    :class:`~lightning_fed.callbacks.AdaptiveServerOptimizer` for the arguments, conventions, sources and errors).

    Example (through :class:`Adam`)::

        >>> Adam(lr=0.1, convention="flower").initial_accumulator  # Flower starts v at 0
        0.0
        >>> Adam(convention="keras")
        Traceback (most recent call last):
        ...
        ValueError: `convention` must be one of ('reddi', 'flower', 'tff'), got 'keras'.
    """

    State = AdaptiveState
    #: ``"adam"``, ``"yogi"`` or ``"adagrad"``: picks the framework's formula under ``"flower"``/``"tff"``.
    second_moment: str = "adam"

    def __init__(
        self,
        lr: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        initial_accumulator: Optional[float] = None,
        bias_correction: bool = False,
        convention: str = "reddi",
    ) -> None:
        self.lr = check_positive("lr", lr)
        if convention not in CONVENTIONS:
            raise ValueError(f"`convention` must be one of {CONVENTIONS}, got {convention!r}.")
        self.convention = convention
        self.beta1 = check_unit_interval("beta1", beta1)
        self.beta2 = check_unit_interval("beta2", beta2)
        self.tau = check_positive("tau", tau)
        if bias_correction and convention != "reddi":
            raise ValueError(
                f"`bias_correction=True` is the torch-style correction on top of convention='reddi'; "
                f"convention={convention!r} already fixes the framework's own correction. Pass one or the other."
            )
        key = (convention, self.second_moment)
        if initial_accumulator is None:
            initial_accumulator = _INITIAL_ACCUMULATOR.get(key, self.tau**2)
        if not isinstance(initial_accumulator, (int, float)) or not math.isfinite(initial_accumulator) or initial_accumulator < 0:
            raise ValueError(f"`initial_accumulator` must be a finite number >= 0, got {initial_accumulator!r}.")
        if key in _FIXED_ZERO_ACCUMULATOR and initial_accumulator != 0:
            raise ValueError(
                f"convention={convention!r} starts the second moment v at 0 for this optimizer (the framework has no "
                f"such option); got `initial_accumulator`={initial_accumulator!r}. Leave it unset or use "
                "convention='reddi'."
            )
        self.initial_accumulator = float(initial_accumulator)
        self.bias_correction = bool(bias_correction)

    def init(self, params: list[Tensor]) -> AdaptiveState:
        return AdaptiveState(zeros_like_all(params), zeros_like_all(params, self.initial_accumulator))

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        """Update v (in place) given Δ_t² (Alg. 2, l. 12-14)."""
        raise NotImplementedError

    def framework_step_size(self, k: int) -> float:
        """The step size η_k of round k (k = ``step``, 1 in the first round) under ``"flower"``/``"tff"``."""
        if self.convention == "flower" and self.second_moment == "adam":
            return self.lr * math.sqrt(1.0 - self.beta2 ** (k + 1)) / (1.0 - self.beta1 ** (k + 1))
        if self.convention == "tff" and self.second_moment in ("adam", "yogi"):
            return self.lr * math.sqrt(1.0 - self.beta2**k) / (1.0 - self.beta1**k)
        return self.lr

    def update(self, params: list[Tensor], delta: list[Tensor], state: AdaptiveState, step: int) -> AdaptiveState:
        m, v = state.exp_avg, state.exp_avg_sq
        first_moment_(m, delta, self.beta1)  # m ← β₁m + (1−β₁)Δ
        self.update_second_moment(v, torch._foreach_mul(delta, delta))
        if self.convention != "reddi":
            step_size = self.framework_step_size(step)
            if self.convention == "tff" and self.second_moment == "adagrad":
                denom = torch._foreach_sqrt(torch._foreach_add(v, self.tau))  # √(v + ε)
            else:
                denom = torch._foreach_add(torch._foreach_sqrt(v), self.tau)  # √v + ε
            torch._foreach_addcdiv_(params, m, denom, value=step_size)
            return state
        step_size = self.lr
        denom = torch._foreach_sqrt(v)
        if self.bias_correction:
            step_size = self.lr / (1.0 - self.beta1**step)
            torch._foreach_div_(denom, math.sqrt(1.0 - self.beta2**step))
        torch._foreach_add_(denom, self.tau)
        torch._foreach_addcdiv_(params, m, denom, value=step_size)
        return state


class Adam(AdaptiveRule):
    """Adam on the server: v_t = β₂·v_{t−1} + (1 − β₂)·Δ_t² (Reddi et al. 2021, Alg. 2, l. 14; FedAdam).

    Example: one round from x_0 = 0, Δ_0 = 0.1, η = 0.1 (Alg. 2 by hand, as FedAdam's example)::

        >>> import torch
        >>> params = [torch.tensor([0.0], dtype=torch.float64)]
        >>> rule = Adam(lr=0.1)
        >>> _ = rule.update(params, [torch.tensor([0.1], dtype=torch.float64)], rule.init(params), 1)
        >>> m, v = 0.1 * 0.1, 0.99 * 1e-3**2 + 0.01 * 0.1**2
        >>> round(params[0].item(), 10), round(0.1 * m / (v**0.5 + 1e-3), 10)
        (0.0905028312, 0.0905028312)
    """

    second_moment = "adam"

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        second_moment_adam_(v, delta_sq, self.beta2)  # v ← β₂v + (1−β₂)Δ²


class Yogi(AdaptiveRule):
    """Yogi on the server: v_t = v_{t−1} − (1 − β₂)·Δ_t²·sign(v_{t−1} − Δ_t²) (Reddi et al. 2021, Alg. 2, l. 13;
    FedYogi).

    Example: one round from x_0 = 0, Δ_0 = 0.1, η = 0.1::

        >>> import torch
        >>> params = [torch.tensor([0.0], dtype=torch.float64)]
        >>> rule = Yogi(lr=0.1)
        >>> _ = rule.update(params, [torch.tensor([0.1], dtype=torch.float64)], rule.init(params), 1)
        >>> m, v = 0.1 * 0.1, 1e-3**2 + 0.01 * 0.1**2
        >>> round(params[0].item(), 10), round(0.1 * m / (v**0.5 + 1e-3), 10)
        (0.0904987562, 0.0904987562)
    """

    second_moment = "yogi"

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        sign = torch._foreach_sub(v, delta_sq)
        for s in sign:
            s.sign_()
        torch._foreach_mul_(sign, delta_sq)
        torch._foreach_add_(v, sign, alpha=-(1.0 - self.beta2))  # v ← v − (1−β₂)Δ²·sign(v − Δ²)


class Adagrad(AdaptiveRule):
    """Adagrad on the server: v_t = v_{t−1} + Δ_t² (Reddi et al. 2021, Alg. 2, l. 12; FedAdagrad). No β₂.

    Args:
        beta1: β₁ in [0, 1); ``None`` (default) means 0.9 under ``"reddi"`` and 0 under ``"flower"``/``"tff"``
            (see :func:`adagrad_beta1`). The others as :class:`AdaptiveRule`.

    Example: one round from x_0 = 0, Δ_0 = 0.1, η = 0.1::

        >>> import torch
        >>> params = [torch.tensor([0.0], dtype=torch.float64)]
        >>> rule = Adagrad(lr=0.1)
        >>> _ = rule.update(params, [torch.tensor([0.1], dtype=torch.float64)], rule.init(params), 1)
        >>> m, v = 0.1 * 0.1, 1e-3**2 + 0.1**2
        >>> round(params[0].item(), 10), round(0.1 * m / (v**0.5 + 1e-3), 10)
        (0.0099005, 0.0099005)
    """

    second_moment = "adagrad"

    def __init__(
        self,
        lr: float = 1e-2,
        tau: float = 1e-3,
        initial_accumulator: Optional[float] = None,
        beta1: Optional[float] = None,
        bias_correction: bool = False,
        convention: str = "reddi",
    ) -> None:
        super().__init__(lr=lr, beta1=adagrad_beta1(beta1, convention), beta2=0.0, tau=tau,
                         initial_accumulator=initial_accumulator, bias_correction=bias_correction,
                         convention=convention)

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        torch._foreach_add_(v, delta_sq)  # v ← v + Δ²


#: The rule class of each second-moment name.
ADAPTIVE_RULES = {"adam": Adam, "yogi": Yogi, "adagrad": Adagrad}
