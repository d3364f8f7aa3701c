"""Fed-LAMB's and Fed-AMS's client optimizers (issue #52: moved out of ``algorithms/fedlamb.py``): local AMSGrad
moments with (:class:`FedLAMBClient`) or without (:class:`AMSGradClient`) a layerwise trust ratio (Karimi, Li, Li,
*Layerwise and Dimensionwise Locally Adaptive Optimization*, Algorithm 1, l. 7-13). Ordinary ``torch.optim.Optimizer``
s that work without the federated server too; :mod:`lightning_fed.algorithms.fedlamb` (where every name stays
importable) installs and seeds them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch
from torch import Tensor
from torch.optim import Optimizer

from lightning_fed.server.checks import check_choice, check_in_range, check_phi_bounds
from lightning_fed.server.moments import adam_moments_, amsgrad_max_
from lightning_fed.server.rules.lamb import layerwise_scale

#: Accepted values of ``bias_correction``: correct m and v (Alg. 1, l. 9-10), m only, or neither.
BIAS_CORRECTIONS = ("both", "first_moment", "none")
#: Accepted values of ``ratio_denominator``: which second moment divides the ratio p of Alg. 1, l. 11.
RATIO_DENOMINATORS = ("amsgrad", "broadcast")


class LocalAMSGrad(Optimizer):
    """Local AMSGrad with Fed-LAMB's update rule, shared by :class:`FedLAMBClient` (``layerwise = True``) and
    :class:`AMSGradClient` (``layerwise = False``). Use one of those two.

    Per parameter tensor θ^ℓ with gradient g, at local step t = 1, 2, ... (Karimi et al., Alg. 1, l. 8-12)::

        m ← β₁·m + (1 − β₁)·g                              (l. 9;  m⁰ = 0 unless seeded)
        v ← β₂·v + (1 − β₂)·g²                             (l. 10; v⁰ = v₀ unless seeded)
        v̂ ← max(v̂, v)        [ratio_denominator="amsgrad"; v̂⁰ = v⁰]
        m̃ = m/(1 − β₁ᵗ),  ṽ = v̂/(1 − β₂ᵗ)                 (l. 9-10 bias corrections; see ``bias_correction``)
        p = m̃/(√ṽ + ε)                                      (l. 11)
        u = p + λ·θ
        θ ← θ − α·φ(‖θ‖)/‖u‖·u      (layerwise, Fed-LAMB, l. 12)
        θ ← θ − α·u                 (not layerwise, Fed-AMS)

    The corrected m̃, ṽ are temporaries (as in Adam); m, v, v̂ are stored uncorrected. Bias correction and
    max follow ``torch.optim.Adam(amsgrad=True)``: the max is over the uncorrected v and the correction divides
    the max. With v₀ = 0, λ = 0 and ``bias_correction="both"``, :class:`AMSGradClient` *is* torch's
    ``Adam(amsgrad=True)``.

    State per parameter: ``step`` (t), ``exp_avg`` (m), ``exp_avg_sq`` (v), ``max_exp_avg_sq`` (v̂; with
    ``ratio_denominator="broadcast"`` it is never updated and keeps its initial value).

    Args:
        params: Parameters or parameter groups.
        lr: α > 0.
        betas: (β₁, β₂), each in [0, 1) (default (0.9, 0.999), the paper's Sec. 4).
        eps: ε > 0 (default 1e-8).
        weight_decay: λ ≥ 0, added to p as in Alg. 1, l. 12 (decoupled from the moments; default 0).
        bias_correction: ``"both"`` (default, Alg. 1, l. 9-10), ``"first_moment"`` (m only) or ``"none"``.
        ratio_denominator: ``"amsgrad"`` (default: the running max v̂ above) or ``"broadcast"`` (the initial
            v̂⁰ — the server's v̂_r when seeded by the server — for the whole round, no correction).
        initial_second_moment: v₀ = v̂⁰ for a parameter whose state was not seeded (default ``None``: ε, the
            paper's v̂₀ = v₀ = ε·1, Alg. 1, l. 2); ≥ 0.
        phi_min: γ_l ≥ 0 of φ(z) = min(max(z, γ_l), γ_u) (layerwise only; default 0).
        phi_max: γ_u > 0 (layerwise only; default ``None``: ∞, so φ = identity).

    Raises:
        ValueError: an argument outside its range (the message names it).
        RuntimeError: a sparse gradient.

    Example: one step with the round's broadcast v̂⁰ = 4 as denominator and no bias correction, by hand::

        >>> import torch
        >>> theta = torch.nn.Parameter(torch.tensor([1.0, 1.0], dtype=torch.float64))
        >>> opt = AMSGradClient([theta], lr=0.5, bias_correction="none", ratio_denominator="broadcast",
        ...                     initial_second_moment=4.0)
        >>> theta.grad = torch.tensor([1.0, -2.0], dtype=torch.float64)
        >>> opt.step()
        >>> theta.detach()  # θ − α·m/(√v̂⁰ + ε), m = (1 − β₁)·g = [0.1, −0.2]: [1 − 0.5·0.1/2, 1 + 0.5·0.2/2]
        tensor([0.9750, 1.0500], dtype=torch.float64)
        >>> state = opt.state[theta]
        >>> state["step"], state["exp_avg_sq"], state["max_exp_avg_sq"]  # v = β₂·4 + (1 − β₂)·g²; v̂ kept
        (1, tensor([3.9970, 4.0000], dtype=torch.float64), tensor([4., 4.], dtype=torch.float64))
        >>> FedLAMBClient([theta], phi_min=2.0, phi_max=1.0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `phi_max` (1.0) must be >= `phi_min` (2.0).
    """

    #: Whether the step is normalised per parameter tensor (Fed-LAMB) or not (Fed-AMS).
    layerwise: bool = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        bias_correction: str = "both",
        ratio_denominator: str = "amsgrad",
        initial_second_moment: Optional[float] = None,
        phi_min: float = 0.0,
        phi_max: Optional[float] = None,
    ) -> None:
        lr = check_in_range("lr", lr, low=0.0, low_open=True)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"`betas` must be a pair (beta1, beta2), got {betas!r}.")
        beta1 = check_in_range("beta1", betas[0], low=0.0, low_open=False, high=1.0)
        beta2 = check_in_range("beta2", betas[1], low=0.0, low_open=False, high=1.0)
        eps = check_in_range("eps", eps, low=0.0, low_open=True)
        weight_decay = check_in_range("weight_decay", weight_decay, low=0.0, low_open=False)
        check_choice("bias_correction", bias_correction, BIAS_CORRECTIONS)
        check_choice("ratio_denominator", ratio_denominator, RATIO_DENOMINATORS)
        if initial_second_moment is None:
            initial_second_moment = eps
        initial_second_moment = check_in_range("initial_second_moment", initial_second_moment, low=0.0, low_open=False)
        phi_min, phi_max = check_phi_bounds(phi_min, phi_max)
        defaults = dict(
            lr=lr,
            betas=(beta1, beta2),
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            ratio_denominator=ratio_denominator,
            initial_second_moment=initial_second_moment,
            phi_min=phi_min,
            phi_max=phi_max,
        )
        super().__init__(params, defaults)

    # ------------------------------------------------------------------ state
    @staticmethod
    def make_state(
        param: Tensor, second_moment: Tensor | float, first_moment: Optional[Tensor] = None
    ) -> dict[str, Any]:
        """A fresh per-parameter state at local step 0 with v⁰ = v̂⁰ = ``second_moment`` and m⁰ =
        ``first_moment`` (zeros if ``None``); tensors are copied to ``param``'s device and dtype."""
        if isinstance(second_moment, Tensor):
            v = second_moment.detach().to(device=param.device, dtype=param.dtype).clone()
        else:
            v = torch.full_like(param, float(second_moment), memory_format=torch.preserve_format)
        if first_moment is None:
            m = torch.zeros_like(param, memory_format=torch.preserve_format)
        else:
            m = first_moment.detach().to(device=param.device, dtype=param.dtype).clone()
        return {"step": 0, "exp_avg": m, "exp_avg_sq": v, "max_exp_avg_sq": v.clone()}

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One local step of every parameter that has a gradient (see the class docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            correction = group["bias_correction"]
            amsgrad = group["ratio_denominator"] == "amsgrad"
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients.")
                state = self.state[p]
                if not state:
                    state.update(self.make_state(p, group["initial_second_moment"]))
                state["step"] += 1
                t = state["step"]
                m, v, v_hat = state["exp_avg"], state["exp_avg_sq"], state["max_exp_avg_sq"]
                adam_moments_(m, v, grad, beta1, beta2)  # l. 9-10
                c1 = 1.0 - beta1**t if correction in ("both", "first_moment") else 1.0
                c2 = 1.0
                if amsgrad:
                    amsgrad_max_(v_hat, v)
                    if correction == "both":
                        c2 = 1.0 - beta2**t
                denom = v_hat.div(c2).sqrt_().add_(group["eps"])
                update = m.div(c1).div_(denom)  # p, l. 11
                if group["weight_decay"] != 0:
                    update.add_(p, alpha=group["weight_decay"])  # p + λθ, l. 12
                if self.layerwise:
                    update.mul_(layerwise_scale(p, update, group["phi_min"], group["phi_max"]))
                p.add_(update, alpha=-group["lr"])
        return loss


class FedLAMBClient(LocalAMSGrad):
    """Fed-LAMB's client optimizer (Karimi et al., Alg. 1, l. 8-12): local AMSGrad moments and the layerwise
    step θ^ℓ ← θ^ℓ − α·φ(‖θ^ℓ‖)·(p^ℓ + λθ^ℓ)/‖p^ℓ + λθ^ℓ‖, one "layer" ℓ per parameter tensor.

    See :class:`LocalAMSGrad` for the full rule, the state and the arguments (φ(z) = min(max(z, γ_l), γ_u) with
    ``phi_min`` = γ_l, ``phi_max`` = γ_u; identity by default). When φ(‖θ^ℓ‖) = 0 or the update is zero the
    trust ratio is 1 (see :func:`layerwise_scale`).

    Example: the first step from θ = [3, 4] (‖θ‖ = 5) with g = [−1, −2] moves θ by α·‖θ‖ = 0.5 along
    −p/‖p‖ ≈ [1, 1]/√2; a zero tensor (‖θ‖ = 0) takes the unscaled step α·p::

        >>> import torch
        >>> theta = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
        >>> bias = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        >>> opt = FedLAMBClient([theta, bias], lr=0.1)
        >>> theta.grad, bias.grad = torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.ones(1, dtype=torch.float64)
        >>> opt.step()
        >>> theta.detach(), 3 + 0.5 / 2**0.5  # p = m̃/(√ṽ + ε) ≈ g/|g| = [−1, −1]
        (tensor([3.3536, 4.3536], dtype=torch.float64), 3.353553390593274)
        >>> bias.detach()  # trust ratio 1: −α·p ≈ −0.1
        tensor([-0.1000], dtype=torch.float64)
    """

    layerwise = True


class AMSGradClient(LocalAMSGrad):
    """Fed-AMS's client optimizer: the same local AMSGrad without the layerwise normalisation,
    θ ← θ − α·(p + λθ) (Karimi et al., Sec. 4 baseline "Fed-AMS"; Local AMSGrad of Chen, Li, Li 2020).

    With ``initial_second_moment=0``, ``weight_decay=0`` and ``bias_correction="both"`` it equals
    ``torch.optim.Adam(amsgrad=True)``. See :class:`LocalAMSGrad` for the rule and the arguments.

    Example: with v₀ = 0 it follows ``torch.optim.Adam(amsgrad=True)`` (three steps on ‖θ‖²)::

        >>> import torch
        >>> a = torch.nn.Parameter(torch.tensor([1.0, -1.0], dtype=torch.float64))
        >>> b = torch.nn.Parameter(a.detach().clone())
        >>> opt_a = AMSGradClient([a], lr=0.1, initial_second_moment=0.0)
        >>> opt_b = torch.optim.Adam([b], lr=0.1, amsgrad=True)
        >>> for _ in range(3):
        ...     for p, opt in ((a, opt_a), (b, opt_b)):
        ...         opt.zero_grad()
        ...         (p**2).sum().backward()
        ...         opt.step()
        >>> a.detach(), torch.allclose(a, b, rtol=1e-12, atol=0)
        (tensor([ 0.7016, -0.7016], dtype=torch.float64), True)
    """

    layerwise = False

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        bias_correction: str = "both",
        ratio_denominator: str = "amsgrad",
        initial_second_moment: Optional[float] = None,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            ratio_denominator=ratio_denominator,
            initial_second_moment=initial_second_moment,
        )
