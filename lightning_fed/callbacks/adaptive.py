"""Shared machinery of the adaptive server optimizers of Reddi et al. 2021, Alg. 2 (FedAdagrad/FedAdam/FedYogi)."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage
from lightning_fed.server.checks import check_positive, check_weighting
from lightning_fed.server.rules.adaptive import ADAPTIVE_RULES, CONVENTIONS, AdaptiveRule  # noqa: F401  (CONVENTIONS re-exported)


class AdaptiveServerOptimizer(ServerOptimizer):
    """Reddi et al. 2021, Alg. 2, with the second-moment rule left to subclasses (:meth:`update_second_moment`).

    Per round t (Alg. 2, l. 11-15; t counted from 0 in the paper, ``num_steps`` = t + 1 here)::

        m_t = β₁·m_{t−1} + (1 − β₁)·Δ_t                      (l. 11; m_{−1} = 0)
        v_t = <FedAdagrad | FedYogi | FedAdam rule>           (l. 12 / 13 / 14; v_{−1} = initial_accumulator)
        x_{t+1} = x_t + η·m_t / (√v_t + τ)                   (l. 15)

    Defaults are the paper's: β₁ = 0.9, β₂ = 0.99, τ = 1e-3, v_{−1} = τ², no bias correction.

    ``convention`` reproduces another framework's formula exactly (hyper-parameters η, β₁, β₂, τ stay yours; the
    frameworks' own defaults differ, e.g. Flower's τ = 1e-9 for FedAdam). With k = ``num_steps`` (1 in the first
    round) and ε the framework's name for τ:

    * ``"reddi"`` (default): the formula above, Alg. 2 as printed.
    * ``"flower"``: Flower's strategies (``flwr/server/strategy/fedadam.py``, ``fedyogi.py``, ``fedadagrad.py``,
      ``FedX.aggregate_fit``; checked at adap/flower commit aa9582d, ``framework/py/flwr/server/strategy/
      fedadam.py`` l. 157-186): m and v start at 0 (v_{−1} = 0, no option), x ← x + η_k·m/(√v + τ) with τ
      outside the root; FedAdam alone bias-corrects the *step size*, η_k = η·√(1 − β₂^{k+1})/(1 − β₁^{k+1}) — the
      exponent is ``server_round + 1`` and Flower's ``server_round`` starts at 1 (``Server.fit``:
      ``for current_round in range(1, num_rounds + 1)``), so it is k + 1, not k; FedYogi and FedAdagrad use η_k = η.
      Flower's FedAdagrad fixes β₁ = 0 (m = Δ), so :class:`FedAdagrad` requires ``beta1=0`` (its default under
      this convention).
    * ``"tff"``: TensorFlow Federated's ``tff.learning.optimizers`` (``build_adam``, ``build_yogi``,
      ``build_adagrad``; google-parfait/tensorflow-federated, ``tensorflow_federated/python/learning/optimizers/
      adam.py``, ``yogi.py``, ``adagrad.py``, ``_X.initialize`` / ``_X.next``), applied to the gradient −Δ_t:
      Adam and Yogi: m starts at 0, v_{−1} = 0 for Adam (no option) and ``initial_preconditioner_value`` = 1e-6 by
      default for Yogi, x ← x + η_k·m/(√v + τ) with η_k = η·√(1 − β₂^k)/(1 − β₁^k) (``normalized_lr``, step
      counted from 1). Adagrad: no momentum (``beta1=0`` required, the default under this convention),
      v_{−1} = ``initial_preconditioner_value`` = 0.1 by default, x ← x + η·Δ/√(v + τ) — τ *inside* the root —
      and no bias correction. TFF evaluates η_k in float32 (``tf.math.pow`` of Python floats); here it is float64.

    ``bias_correction=True`` (only with ``convention="reddi"``) is a third variant, kept for compatibility: the
    placement of ``torch.optim.Adam`` — step size η/(1 − β₁^k) and denominator √v/√(1 − β₂^k) + τ, i.e. √v is
    corrected *before* τ is added — on top of v_{−1} = ``initial_accumulator`` (τ² by default). It equals
    neither Flower's nor TFF's formula; use ``convention`` for those.

    State: ``exp_avg`` (m) and ``exp_avg_sq`` (v), one tensor per parameter. The composition
    ``ServerOptimizer(rule=Adam(...) | Yogi(...) | Adagrad(...), aggregators=...)``
    (:mod:`lightning_fed.server.rules.adaptive`, which holds the formulas).

    Args:
        lr: Server learning rate η (> 0).
        beta1: β₁ in [0, 1) (default 0.9).
        beta2: β₂ in [0, 1) (default 0.99; unused by FedAdagrad).
        tau: Adaptivity τ (> 0, default 1e-3); smaller is more adaptive. Flower's and TFF's ε.
        initial_accumulator: v_{−1}, ≥ 0 (default: τ² under ``"reddi"``; 0 under ``"flower"`` and for TFF's Adam,
            where it cannot be set otherwise; TFF's defaults 1e-6 for Yogi and 0.1 for Adagrad).
        bias_correction: torch-style bias correction on top of ``"reddi"`` (default ``False``, as the paper).
        weighting: ``"num_samples"`` (default) or ``"uniform"``.
        convention: ``"reddi"`` (default), ``"flower"`` or ``"tff"``, see above.
        aggregators: An aggregator chain in place of the weighted mean (default ``None``).
        client: Client algorithms every client runs (:mod:`lightning_fed.client.algorithm`, e.g.
            ``[FedProxClient(mu=0.01)]``; default ``None``: plain local training).

    Raises:
        ValueError: ``lr``/``tau`` not finite and > 0, ``beta1``/``beta2`` outside [0, 1), a negative or
            non-finite ``initial_accumulator``, an unknown ``weighting`` or ``convention``,
            ``bias_correction=True`` with a convention other than ``"reddi"``, or a nonzero ``initial_accumulator``
            where the chosen framework always starts v at 0.

    Example (through the subclass :class:`~lightning_fed.callbacks.FedAdam`; per-rule numbers are in the
    subclasses' examples)::

        >>> from lightning_fed.callbacks import FedAdam
        >>> FedAdam(lr=0.1)
        FedAdam(lr=0.1, weighting='num_samples', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi')
        >>> FedAdam(convention="flower").initial_accumulator  # Flower starts v at 0
        0.0
        >>> FedAdam(convention="keras")
        Traceback (most recent call last):
        ...
        ValueError: `convention` must be one of ('reddi', 'flower', 'tff'), got 'keras'.
    """

    state_key_fields = ("lr", "beta1", "beta2", "tau", "weighting")
    repr_fields = ("lr", "weighting", "beta1", "beta2", "tau", "initial_accumulator", "bias_correction", "convention")

    #: The second-moment rule of the subclass (``"adam"``, ``"yogi"`` or ``"adagrad"``), which picks the
    #: framework's formula under ``convention="flower"``/``"tff"``.
    rule: str = "adam"

    def __init__(
        self,
        lr: float = 1e-2,
        beta1: float = 0.9,
        beta2: float = 0.99,
        tau: float = 1e-3,
        initial_accumulator: Optional[float] = None,
        bias_correction: bool = False,
        weighting: str = "num_samples",
        convention: str = "reddi",
        aggregators: Optional[list[Stage]] = None,
        client: Optional[list[ClientAlgorithm]] = None,
    ) -> None:
        check_positive("lr", lr)
        check_weighting(weighting)
        if type(self).update_second_moment is not AdaptiveServerOptimizer.update_second_moment:
            raise TypeError(
                f"{type(self).__name__} overrides `update_second_moment`; the formula now lives in a server rule: "
                "subclass lightning_fed.server.rules.AdaptiveRule and pass it as `ServerOptimizer(rule=...)`."
            )
        cls = ADAPTIVE_RULES[self.rule]
        kwargs = dict(lr=lr, tau=tau, initial_accumulator=initial_accumulator, bias_correction=bias_correction,
                      convention=convention)
        rule: AdaptiveRule = cls(beta1=beta1, **kwargs) if self.rule == "adagrad" else cls(beta1=beta1, beta2=beta2, **kwargs)
        super().__init__(weighting=weighting, aggregators=aggregators, rule=rule, client=client)
        self.convention = rule.convention
        self.beta1, self.beta2, self.tau = rule.beta1, rule.beta2, rule.tau
        self.initial_accumulator = rule.initial_accumulator
        self.bias_correction = rule.bias_correction

    def update_second_moment(self, v: list[Tensor], delta_sq: list[Tensor]) -> None:
        """Update v (in place) given Δ_t² (Alg. 2, l. 12-14): the rule's formula."""
        self.server_rule.update_second_moment(v, delta_sq)

    def framework_step_size(self, k: int) -> float:
        """The step size η_k of round k (k = ``num_steps``, 1 in the first round) under ``"flower"``/``"tff"``."""
        return self.server_rule.framework_step_size(k)
