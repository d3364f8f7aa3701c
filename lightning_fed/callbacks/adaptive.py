"""Shared machinery of the adaptive server optimizers of Reddi et al. 2021, Alg. 2 (FedAdagrad/FedAdam/FedYogi)."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from lightning_fed.callbacks.server_optimizer import (
    ServerOptimizer,
    check_positive,
    check_unit_interval,
    zeros_like_all,
)


class AdaptiveServerOptimizer(ServerOptimizer):
    """Reddi et al. 2021, Alg. 2, with the second-moment rule left to subclasses (:meth:`update_second_moment`).

    Per round t (Alg. 2, l. 11-15)::

        m_t = β₁·m_{t−1} + (1 − β₁)·Δ_t                      (l. 11; m_{−1} = 0)
        v_t = <FedAdagrad | FedYogi | FedAdam rule>           (l. 12 / 13 / 14; v_{−1} = initial_accumulator)
        x_{t+1} = x_t + η·m_t / (√v_t + τ)                   (l. 15)

    Defaults are the paper's: β₁ = 0.9, β₂ = 0.99, τ = 1e-3, v_{−1} = τ², no bias correction. With
    ``bias_correction=True`` (Keras/Flower-style, the paper's public code) the step uses
    m̂_t = m_t/(1 − β₁^{t+1}) and v̂_t = v_t/(1 − β₂^{t+1}) (t counted from 0) in place of m_t, v_t.

    State: ``exp_avg`` (m) and ``exp_avg_sq`` (v), one tensor per parameter.

    Args:
        lr: Server learning rate η (> 0).
        beta1: β₁ in [0, 1) (default 0.9).
        beta2: β₂ in [0, 1) (default 0.99; unused by FedAdagrad).
        tau: Adaptivity τ (> 0, default 1e-3); smaller is more adaptive.
        initial_accumulator: v_{−1}, ≥ 0 (default τ², the paper's "v_{−1} ≥ τ²").
        bias_correction: Apply Adam-style bias correction (default ``False``, as the paper).
        weighting: ``"num_samples"`` (default) or ``"uniform"``.

    Raises:
        ValueError: ``lr``/``tau`` not finite and > 0, ``beta1``/``beta2`` outside [0, 1), a negative or
            non-finite ``initial_accumulator``, or an unknown ``weighting``.
    """

    def __init__(
        self,
        lr: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        initial_accumulator: Optional[float] = None,
        bias_correction: bool = False,
        weighting: str = "num_samples",
    ) -> None:
        super().__init__(lr=lr, weighting=weighting)
        self.beta1 = check_unit_interval("beta1", beta1)
        self.beta2 = check_unit_interval("beta2", beta2)
        self.tau = check_positive("tau", tau)
        if initial_accumulator is None:
            initial_accumulator = self.tau**2
        if not isinstance(initial_accumulator, (int, float)) or not math.isfinite(initial_accumulator) or initial_accumulator < 0:
            raise ValueError(f"`initial_accumulator` must be a finite number >= 0, got {initial_accumulator!r}.")
        self.initial_accumulator = float(initial_accumulator)
        self.bias_correction = bool(bias_correction)

    def init_state(self, params: list[Tensor]) -> dict[str, list[Tensor]]:
        return {"exp_avg": zeros_like_all(params), "exp_avg_sq": zeros_like_all(params, self.initial_accumulator)}

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        """Update v (in place) given Δ_t² (Alg. 2, l. 12-14)."""
        raise NotImplementedError

    def step(self, params: list[Tensor], pseudo_gradient: list[Tensor]) -> None:
        m, v = self.state["exp_avg"], self.state["exp_avg_sq"]
        torch._foreach_lerp_(m, pseudo_gradient, 1.0 - self.beta1)  # m ← β₁m + (1−β₁)Δ
        self.update_second_moment(v, torch._foreach_mul(pseudo_gradient, pseudo_gradient))
        step_size = self.lr
        denom = torch._foreach_sqrt(v)
        if self.bias_correction:
            t = self.num_steps
            step_size = self.lr / (1.0 - self.beta1**t)
            torch._foreach_div_(denom, math.sqrt(1.0 - self.beta2**t))
        torch._foreach_add_(denom, self.tau)
        torch._foreach_addcdiv_(params, m, denom, value=step_size)

    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            lr=self.lr, beta1=self.beta1, beta2=self.beta2, tau=self.tau, weighting=self.weighting
        )

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, beta1={self.beta1}, beta2={self.beta2}, tau={self.tau}, "
            f"initial_accumulator={self.initial_accumulator}, bias_correction={self.bias_correction}"
        )
