"""FedMGDA+ (Z. Hu, K. Shaloudegi, G. Zhang, Y. Yu, *Federated Learning Meets Multi-objective Optimization*, IEEE
Trans. Network Science and Engineering 2022, arXiv:2006.11489, Algorithm 1 "FedMGDA+"): the server combines the
round's *normalised* client updates with the weights of minimum norm over the ε-constrained simplex, a common descent
direction of every participating client's objective (MGDA, Désidéri 2012; Sener & Koltun 2018). Server half only:
the clients train as in FedAvg (any client half can be added with ``client=[...]``).

With S_t the round's cohort (the clients that reported, K = |S_t|), Δ_i = x_i − x_t client i's update and
g_i = −Δ_i its "gradient" (Alg. 1 writes the server step with g_i = x_t − x_i)::

    d_i  = Δ_i / ‖Δ_i‖                                       (normalisation; ‖·‖ over all parameters together)
    λ*   = argmin_λ ‖Σ_i λ_i d_i‖²   s.t.  λ ≥ 0, Σ_i λ_i = 1, ‖λ − λ₀‖_∞ ≤ ε         (the ε-constrained MGDA step)
    Δ_t  = Σ_i λ*_i d_i                                       (−Δ_t is the common descent direction)
    x_{t+1} = x_t + η·Δ_t                                     (the server rule: SGD with the global lr η)

ε ∈ [0, 1]: ε = 1 is the whole simplex (MGDA's min-norm point; FedAWARE's comparison, Zeng et al. 2024, Fig. 6, and
FedLab run it so), ε = 0 forces λ = λ₀, i.e. FedAvg of the normalised updates (of the raw updates with
``normalize=False``). λ₀ is the prior weighting of the cohort: the counts of the aggregator chain's input
(``ClientDeltas.counts``: 1 under ``weighting="uniform"``, |D_i| under ``"num_samples"``) normalised over the cohort.

The λ-step is solved exactly on the K × K Gram matrix of the d_i (float64):

* box inactive (every λ₀_i − ε ≤ 0 and λ₀_i + ε ≥ 1, e.g. ε = 1): the simplex QP, by FedAWARE's exact active-set
  solver (:func:`~lightning_fed.server.min_norm.min_norm_active_set`, duality gap ≤ ``tol``·max G_ii);
* otherwise: the polytope P = {λ ≥ 0, Σλ = 1, λ₀ − ε ≤ λ ≤ λ₀ + ε} by Wolfe's minimum-norm-point algorithm
  (:func:`min_norm_box`; Wolfe 1976, *Finding the nearest point in a polytope*, Math. Programming 11) over the
  vertices of P, found by an exact greedy linear minimisation; it stops when the Frank–Wolfe duality gap over P
  (:func:`box_duality_gap`) is ≤ ``tol``·max G_ii, and is finite in exact arithmetic.

Choices where the paper's implementations differ (read, not copied; the paper's own text is not among
``shared/seeds``, so where the paper and its code could disagree the authors' code decided):

* **Normalisation.** Authors' code (github.com/watml/Fed-MGDA, ``update.py``, ``--normalize 1``): each client divides
  its update by its L2 norm over every ``state_dict`` entry; FedLab (SMILELab-FL/FedLab,
  ``fedlab/contrib/algorithm/fedmgda+.py``) and FedAWARE's baseline (dunzeng/FedAWARE, ``baselines/fedmgda+.py``):
  the flattened parameter vector; FLGo/easyFL (WwZzz/easyFL, ``fedmgda+.py``): ‖Δ_i‖ + 1e-8, and an older easyFL
  version normalises and solves *per layer* (one λ per parameter tensor). Here: one norm over all parameters (the
  update the server receives), one λ per client. ``normalize=False`` gives the authors' un-normalised FedMGDA.
* **λ₀ and the box.** Authors' code (``utils.py``, ``solve_centered_w``): λ₀ = 1/K uniform over the cohort,
  constraints λ ≥ 0, |λ_i − 1/K| ≤ ε, solved by ``quadprog``; ε = 0 skips the QP (plain mean). FLGo: λ₀ = the cohort's
  sample weights, ε = 0.1 by default, ``cvxopt``. FedLab / FedAWARE: no ε (the whole simplex), Frank–Wolfe with an
  iteration cap (Sener & Koltun's ``MinNormSolver.find_min_norm_element_FW``, approximate). Here: λ₀ from
  ``weighting`` — ``"uniform"`` by default (the authors' code), ``"num_samples"`` for FLGo's — ε = 1 by default, and
  an exact solver for every ε.
* **Server step.** All four: x ← x − η·Σλ_i g_i/‖g_i‖ with a global lr η (FedLab/FedAWARE ``glr``, FLGo ``eta``). The
  authors' code also decays it, η_t = η·decay^⌊t/100⌋ (``--global_lr_decay``, default 1: none); not offered here,
  since the decay could not be checked against the paper's text (any server rule can be composed instead).
* **A zero update** (a client that took no step) has no direction: the authors' code and FedLab divide by zero
  (NaN), FLGo keeps a zero vector, which makes the min-norm point 0 (no step at all). Here such a client — and a
  client whose count is 0 — is left out of the λ-step (λ_i = 0, λ₀ renormalised over the others); a round where
  every update is zero gives Δ_t = 0. FedLab/FedAWARE also stop (``assert``) when ‖Σλd‖² ≤ 1e-5 (near Pareto
  stationarity); here the round goes on with the small step.
* Flower has no FedMGDA+ baseline (none found in its strategies or baselines).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor

from lightning_fed.server.min_norm import (
    MinNormConvergenceWarning, MinNormReport, MinNormResult, _as_gram, _check_solver_args, min_norm_active_set,
)
from lightning_fed.server.aggregators.base import (
    ClientDeltas,
    EmptyState,
    RoundInfo,
    Stage,
    accumulation_dtype,
    weighted_sum,
)
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client import ClientUpdate
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.checks import check_weighting
from lightning_fed.server.rules.sgd import SGD

__all__ = ["FedMGDAMinNorm", "FedMGDAPlus", "box_duality_gap", "check_epsilon", "min_norm_box"]


def check_epsilon(value: Any) -> float:
    """``value`` as a float if it is a finite number in [0, 1] (FedMGDA+'s ε), else ``ValueError`` naming ``epsilon``.

    Example::

        >>> check_epsilon(1), check_epsilon(0.25)
        (1.0, 0.25)
        >>> check_epsilon(1.5)
        Traceback (most recent call last):
        ...
        ValueError: `epsilon` must be a finite number in [0, 1] (0: λ = λ₀, FedAvg of the normalised updates; 1: the whole simplex), got 1.5.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise ValueError(
            "`epsilon` must be a finite number in [0, 1] (0: λ = λ₀, FedAvg of the normalised updates; 1: the whole "
            f"simplex), got {value!r}."
        )
    return float(value)


# ---------------------------------------------------------------------------------------------------- the λ-step
def _box_bounds(lower: Any, upper: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    lo = np.asarray(lower, dtype=np.float64).reshape(-1)
    up = np.asarray(upper, dtype=np.float64).reshape(-1)
    if lo.shape != (n,) or up.shape != (n,):
        raise ValueError(f"`lower` and `upper` must have shape [{n}], got {lo.shape} and {up.shape}.")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(up))):
        raise ValueError("`lower` and `upper` must be finite.")
    if np.any(lo > up):
        raise ValueError(f"`lower` must be <= `upper` elementwise, got lower={lo.tolist()}, upper={up.tolist()}.")
    slack = 1e-12 * n
    if lo.sum() > 1.0 + slack or up.sum() < 1.0 - slack:
        raise ValueError(
            f"The box [lower, upper] does not meet the simplex: sum(lower)={lo.sum():.17g} must be <= 1 <= "
            f"sum(upper)={up.sum():.17g}."
        )
    return lo, up


def _box_vertex(c: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """argmin_{s ∈ P} ⟨c, s⟩ over P = {Σs = 1, lower ≤ s ≤ upper}, exactly: start at ``lower`` and spend the remaining
    mass 1 − Σ lower on the coordinates in increasing order of c (ties by index), each up to its upper bound. The
    result is a vertex of P (at most one coordinate strictly inside its bounds)."""
    s = lower.copy()
    budget = 1.0 - float(s.sum())
    for i in np.argsort(c, kind="stable"):
        if budget <= 0.0:
            break
        add = min(float(upper[i] - lower[i]), budget)
        s[i] += add
        budget -= add
    return s


def box_duality_gap(gram: Any, weights: Any, lower: Any, upper: Any) -> float:
    """The Frank–Wolfe duality gap λᵀGλ − min_{s ∈ P} sᵀGλ of λ over P = {Σs = 1, lower ≤ s ≤ upper}.

    ≥ 0 for λ ∈ P, 0 exactly at a minimiser of f(λ) = λᵀGλ over P, and f(λ) − min_P f ≤ 2·gap (convexity). With
    lower = 0 and upper = 1 it is :func:`~lightning_fed.server.min_norm.duality_gap`. Units of G.

    Example: on the segment between v_0 = [1, 0] and v_1 = [0, 2] with λ₁ ≤ 0.1 the optimum is the bound
    λ = (0.9, 0.1), where Gλ = (0.9, 0.4): gap = 0.85 − (0.9·0.9 + 0.1·0.4) = 0::

        >>> import numpy as np
        >>> g = np.array([[1.0, 0.0], [0.0, 4.0]])
        >>> box_duality_gap(g, [0.9, 0.1], [0.0, 0.0], [1.0, 0.1])
        0.0
    """
    g = _as_gram(gram)
    lam = np.asarray(weights, dtype=np.float64).reshape(-1)
    lo, up = _box_bounds(lower, upper, g.shape[0])
    g_lam = g @ lam
    s = _box_vertex(g_lam, lo, up)
    return float(lam @ g_lam - s @ g_lam)


def _affine_minimiser(points: np.ndarray, g: np.ndarray) -> np.ndarray:
    """α minimising ‖Σ_j α_j x_j‖² subject to Σα = 1 (signs free) for the corral's points x_j = V·points[j]:
    the KKT system [[M, 1], [1ᵀ, 0]]·[α; ν] = [0; 1] with M = points·G·pointsᵀ (nonsingular while the points
    are affinely independent; least squares otherwise)."""
    m = points.shape[0]
    kkt = np.zeros((m + 1, m + 1))
    kkt[:m, :m] = points @ g @ points.T
    kkt[:m, m] = kkt[m, :m] = 1.0
    rhs = np.zeros(m + 1)
    rhs[m] = 1.0
    try:
        sol = np.linalg.solve(kkt, rhs)
    except np.linalg.LinAlgError:
        sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
    alpha = sol[:m]
    return alpha / alpha.sum()


def min_norm_box(
    gram: Any, lower: Any, upper: Any, tol: float = 1e-9, max_iter: Optional[int] = None
) -> MinNormResult:
    """Exact λ* = argmin λᵀGλ over P = {λ : Σλ = 1, lower ≤ λ ≤ upper} (FedMGDA+'s ε-constrained λ-step with
    lower = max(0, λ₀ − ε), upper = min(1, λ₀ + ε)), by Wolfe's minimum-norm-point algorithm.

    Wolfe (1976): keep a *corral* of affinely independent vertices of P and the convex weights of the current point
    on them; each major cycle adds the vertex s = argmin_{s ∈ P} ⟨Gλ, s⟩ (:func:`_box_vertex`, exact), each minor
    cycle moves to the corral's affine minimiser, or — when that leaves the corral's convex hull — to the last point
    of the segment inside it, dropping the vertices whose weight reaches 0. Finite in exact arithmetic; here it stops
    when the duality gap (:func:`box_duality_gap`) is ≤ ``tol``·max_i G_ii, so λᵀGλ − f* ≤ 2·``tol``·max_i G_ii.

    Args:
        gram: G, ``[n, n]`` symmetric positive semi-definite (Tensor or array; symmetrised, used in float64).
        lower: The lower bounds, ``[n]`` (≥ 0 for FedMGDA+; any finite values are accepted).
        upper: The upper bounds, ``[n]``, ≥ ``lower``; P must be non-empty: Σ lower ≤ 1 ≤ Σ upper.
        tol: Optimality tolerance (finite, ≥ 0; default 1e-9, as the simplex solver's).
        max_iter: Cap on the affine minimisations (int ≥ 1; default ``None``: 50·n + 50).

    Returns:
        :class:`~lightning_fed.server.min_norm.MinNormResult` (``gap``: the duality gap over P; ``num_iters``:
        affine minimisations; ``converged``: the gap test held).

    Warns:
        MinNormConvergenceWarning: stopped at the cap, or (rounding on a near-degenerate G) without meeting ``tol``.

    Raises:
        ValueError: ``gram`` not a non-empty finite square matrix; bounds of the wrong shape, not finite, crossed
            or not meeting the simplex; ``tol`` negative or not finite; ``max_iter`` < 1.

    Example: v_0 = [1, 0], v_1 = [0, 2]: on the simplex λ* = (0.8, 0.2); with λ₀ = (½, ½) and ε = 0.25 the box
    [0.25, 0.75]² cuts it to λ = (0.75, 0.25), ‖0.75·v_0 + 0.25·v_1‖² = 0.5625 + 0.25::

        >>> import numpy as np
        >>> g = np.array([[1.0, 0.0], [0.0, 4.0]])
        >>> result = min_norm_box(g, [0.25, 0.25], [0.75, 0.75])
        >>> result.weights, result.value, result.converged
        (array([0.75, 0.25]), 0.8125, True)
    """
    _check_solver_args(tol, max_iter)
    g = _as_gram(gram)
    n = g.shape[0]
    lo, up = _box_bounds(lower, upper, n)
    cap = 50 * n + 50 if max_iter is None else int(max_iter)
    scale = float(np.max(np.diag(g)))
    corral = _box_vertex(np.diag(g), lo, up)[None, :]  # start at the vertex favouring the shortest vectors
    w = np.ones(1)
    iters, capped, gap = 0, False, math.inf
    while True:
        lam = w @ corral
        g_lam = g @ lam
        s = _box_vertex(g_lam, lo, up)
        gap = float(lam @ g_lam - s @ g_lam)
        if scale <= 0.0 or gap <= tol * scale:
            break
        if iters >= cap:
            capped = True
            break
        if any(np.array_equal(s, row) for row in corral):  # rounding: the best vertex is already in the corral
            break
        corral = np.vstack([corral, s])
        w = np.append(w, 0.0)
        while True:  # minor cycles
            iters += 1
            alpha = _affine_minimiser(corral, g)
            if np.all(alpha > 0.0):
                w = alpha
                break
            out = np.flatnonzero(alpha <= 0.0)
            ratios = w[out] / (w[out] - alpha[out])
            k = int(np.argmin(ratios))
            theta = float(ratios[k])
            w = w + theta * (alpha - w)
            w[out[k]] = 0.0  # the blocking vertex leaves the corral exactly
            keep = w > 0.0
            corral, w = corral[keep], w[keep] / w[keep].sum()
            if iters >= cap:
                capped = True
                break
        if capped:
            lam = w @ corral
            gap = box_duality_gap(g, lam, lo, up)
            break
    lam = w @ corral
    converged = scale <= 0.0 or gap <= tol * scale
    if not converged:
        reason = f"stopped at `max_iter`={cap} affine minimisations" if capped else "ended"
        warnings.warn(
            f"Box-constrained min-norm solve {reason} with duality gap {gap:.3g} > `tol`·max G_ii = {tol * scale:.3g}: "
            "λ is not optimal to the requested tolerance.",
            MinNormConvergenceWarning,
            stacklevel=2,
        )
    return MinNormResult(lam, float(lam @ g @ lam), iters, converged, gap)


# ---------------------------------------------------------------------------------------------------- the stage
class FedMGDAMinNorm(Stage):
    """FedMGDA+'s reducer (Hu et al. 2022, Alg. 1): Δ_t = Σ_i λ*_i·Δ_i/‖Δ_i‖ with λ* the min-norm weights over the
    ε-constrained simplex around λ₀ (the module doc). No state. Composed with the SGD rule it is
    :class:`~lightning_fed.algorithms.fedmgda.FedMGDAPlus`; under another rule, ``ServerOptimizer(rule=...,
    aggregators=[FedMGDAMinNorm(...)])``.

    λ₀ is ``ClientDeltas.counts`` normalised over the clients in the λ-step (those with a nonzero update and a
    positive count; the others get λ_i = 0). Norms, the K × K Gram matrix and Δ_t are accumulated in float64 (the
    parameters' dtype on Apple MPS) and Δ_t is rounded once to the parameters' dtype.

    Diagnostics of the round are :meth:`apply`'s third result, a :class:`~lightning_fed.server.min_norm.MinNormReport`
    (collected into the server optimizer's ``round_report``): λ* over the round's clients in ``ClientDeltas`` order
    (float64 ``[K]``), the solver's :class:`~lightning_fed.server.min_norm.MinNormResult` (``None`` when fewer than
    two clients were in the λ-step) and √(Σλ_i‖d_i‖² / ‖Σλ_i d_i‖²) (FedAWARE's Eq. 3 with these λ and vectors;
    ``nan`` for a zero combination).

    Args:
        epsilon: ε ∈ [0, 1] (default 1: the whole simplex).
        normalize: Solve on, and combine, d_i = Δ_i/‖Δ_i‖ (default ``True``, FedMGDA+); ``False``: on Δ_i (the
            authors' un-normalised FedMGDA).
        tol: The solvers' duality-gap tolerance, relative to max_i G_ii (default 1e-9).

    Raises:
        ValueError: bad arguments (naming them); in :meth:`apply`: an empty round, or a client whose update is not
            finite (named by id).

    Example: Δ_0 = [2, 0], Δ_1 = [0, 1] (orthogonal after normalisation): on the simplex λ = (½, ½), Δ_t = [½, ½];
    with ε = 0.1 around λ₀ = (0.9, 0.1) (counts 9 and 1) the box keeps λ = (0.8, 0.2)::

        >>> import torch
        >>> x = ClientDeltas([0, 1], [[torch.tensor([2.0, 0.0], dtype=torch.float64)],
        ...                          [torch.tensor([0.0, 1.0], dtype=torch.float64)]],
        ...                  torch.tensor([9.0, 1.0], dtype=torch.float64))
        >>> FedMGDAMinNorm().apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))[0]
        [tensor([0.5000, 0.5000], dtype=torch.float64)]
        >>> stage = FedMGDAMinNorm(epsilon=0.1)
        >>> delta, _, report = stage.apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))
        >>> delta, report.weights.round(12)
        ([tensor([0.8000, 0.2000], dtype=torch.float64)], array([0.8, 0.2]))
    """

    kind = "reduce"
    #: Δ_t is not the clients' weighted mean: ``round_gradient_diversity`` uses the raw updates' mean instead.
    shifts_mean = True

    def __init__(self, epsilon: float = 1.0, normalize: bool = True, tol: float = 1e-9) -> None:
        self.epsilon = check_epsilon(epsilon)
        if not isinstance(normalize, bool):
            raise ValueError(f"`normalize` must be a bool, got {normalize!r}.")
        self.normalize = normalize
        if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not math.isfinite(tol) or tol < 0:
            raise ValueError(f"`tol` must be a finite number >= 0, got {tol!r}.")
        self.tol = float(tol)

    def solve(self, gram: np.ndarray, prior: np.ndarray) -> tuple[np.ndarray, Optional[MinNormResult]]:
        """λ* for the Gram matrix ``gram`` ``[k, k]`` of the vectors solved on and the prior λ₀ = ``prior`` ``[k]``
        (on the simplex): λ₀ itself when ε = 0 (or k = 1), the simplex solver when the box is inactive, else
        :func:`min_norm_box`. Returns λ* and the solver's result (``None`` when no solve ran)."""
        k = len(prior)
        if k == 1 or self.epsilon == 0.0:
            return prior.copy(), None
        lower = np.maximum(prior - self.epsilon, 0.0)
        upper = np.minimum(prior + self.epsilon, 1.0)
        if np.all(lower <= 0.0) and np.all(upper >= 1.0):
            result = min_norm_active_set(gram, tol=self.tol)
        else:
            result = min_norm_box(gram, lower, upper, tol=self.tol)
        return result.weights, result

    @staticmethod
    def round_metrics(report: Optional[MinNormReport]) -> dict[str, float]:
        """The round's logged metrics from its ``report`` (none in a round without a server step):
        ``fedmgda_support`` (clients with λ*_i > 0), ``fedmgda_weighted_diversity`` (√(Σλ*‖d_i‖²/‖Σλ*d_i‖²) of the
        vectors it solved on) and ``fedmgda_min_norm_sq`` (‖Σλ*_i d_i‖², when the solver ran: two or more clients).

        Example::

            >>> report = MinNormReport(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64), None, 1.25)
            >>> FedMGDAMinNorm.round_metrics(report)
            {'fedmgda_support': 2.0, 'fedmgda_weighted_diversity': 1.25}
        """
        if report is None or report.weights is None:
            return {}
        metrics = {"fedmgda_support": float((report.weights > 0).sum())}
        if report.diversity is not None:
            metrics["fedmgda_weighted_diversity"] = float(report.diversity)
        if report.solve is not None:
            metrics["fedmgda_min_norm_sq"] = float(report.solve.value)
        return metrics

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple, MinNormReport]:
        """Δ_t = Σ_i λ*_i d_i, one tensor per parameter (the shapes, dtypes and devices of ``x.deltas[0]``), the
        (unchanged) state and the round's :class:`~lightning_fed.server.min_norm.MinNormReport`."""
        if not x.deltas:
            raise ValueError("Cannot aggregate an empty round: no client updates.")
        first = x.deltas[0]
        k = len(x.deltas)
        with torch.no_grad():
            acc = [accumulation_dtype(t) for t in first]
            gram_t = torch.zeros(k, k, dtype=torch.float64)
            for j, (t, dtype) in enumerate(zip(first, acc)):  # Gram matrix parameter by parameter: [K, n_j] at a time
                block = torch.stack([delta[j].detach().reshape(-1).to(device=t.device, dtype=dtype)
                                     for delta in x.deltas])
                gram_t += (block @ block.T).to(device="cpu", dtype=torch.float64)
            gram = gram_t.numpy()
            diag = np.diag(gram).copy()
            bad = [x.client_ids[i] for i in range(k) if not np.isfinite(diag[i])]
            if bad:
                raise ValueError(f"FedMGDA+ cannot normalise the non-finite updates of clients {bad}.")
            counts = x.counts.detach().cpu().double().numpy()
            idx = np.flatnonzero((diag > 0.0) & (counts > 0.0))
            lam_full = np.zeros(k)
            coef_full = np.zeros(k)  # Δ_t = Σ_i coef_i·Δ_i
            solve, diversity = None, float("nan")
            if len(idx) > 0:
                norms = np.sqrt(diag[idx]) if self.normalize else np.ones(len(idx))
                g_solve = gram[np.ix_(idx, idx)] / np.outer(norms, norms)
                prior = counts[idx] / counts[idx].sum()
                lam, solve = self.solve(g_solve, prior)
                lam_full[idx] = lam
                coef_full[idx] = lam / norms
                denom = float(lam @ g_solve @ lam)
                diversity = math.sqrt(float(lam @ np.diag(g_solve)) / denom) if denom > 0 else float("nan")
            coefs = coef_full.tolist()
            kept = [i for i, c in enumerate(coefs) if c != 0.0]  # Δ_t = Σ_i coef_i·Δ_i over the clients with coef_i ≠ 0
            totals = weighted_sum([[d.detach() for d in x.deltas[i]] for i in kept], [coefs[i] for i in kept]) if kept \
                else [torch.zeros(t.shape, dtype=dtype, device=t.device) for t, dtype in zip(first, acc)]
            delta = [total.to(t.dtype) for total, t in zip(totals, first)]
        return delta, state, MinNormReport(lam_full, solve, diversity)


class FedMGDAPlus(ServerOptimizer):
    """FedMGDA+ (Hu et al., *Federated Learning Meets Multi-objective Optimization*, IEEE TNSE 2022, Algorithm 1):
    ``ServerOptimizer(aggregators=[FedMGDAMinNorm(epsilon, normalize)], rule=SGD(lr))``.

    In round t, with Δ_i the update of client i of the cohort S_t (K = |S_t| clients that reported) and
    d_i = Δ_i/‖Δ_i‖ (one L2 norm over all parameters)::

        λ*      = argmin_λ ‖Σ_i λ_i d_i‖²  s.t.  λ ≥ 0, Σλ_i = 1, ‖λ − λ₀‖_∞ ≤ ε      (MGDA's min-norm step)
        x_{t+1} = x_t + η·Σ_i λ*_i d_i                                             (server SGD, global lr η)

    λ₀ is the prior weighting of the cohort (``weighting``: uniform 1/K by default, as the authors' code; or
    |D_i|/Σ_j|D_j|); ε = 1 (the default) is the whole simplex, as in FedAWARE's comparison (Zeng et al. 2024,
    Fig. 6), and ε = 0 is FedAvg of the normalised updates. λ* is solved exactly (duality gap ≤ 1e-9·max_i G_ii on
    the K × K Gram matrix; :mod:`lightning_fed.algorithms.fedmgda`, which also lists where the authors', FedLab's and
    FLGo's implementations differ). A client whose update is zero (no local step) is left out of the λ-step. Shapes:
    Δ_t has the parameters' shapes and dtypes; λ* (:attr:`last_weights`) is float64 ``[K]`` in the round's order.
    No server state. Logged per round: ``fedmgda_min_norm_sq`` (‖Σλ*_i d_i‖²: 0 at a Pareto-stationary point of the
    cohort's objectives), ``fedmgda_support`` (clients with λ*_i > 0) and ``fedmgda_weighted_diversity``
    (√(Σλ*_i‖d_i‖²/‖Σλ*_i d_i‖²) with these λ* and d_i); ``round_gradient_diversity`` is the raw updates' diversity,
    the same metric as every other method logs.

    Args:
        lr: Server (global) learning rate η (> 0, default 1.0; FedAWARE's baseline and the authors' default).
        epsilon: ε ∈ [0, 1] (default 1.0).
        normalize: Combine the normalised updates d_i (default ``True``, FedMGDA+); ``False``: the raw Δ_i (FedMGDA).
        weighting: λ₀ and the weights of the round's train loss and buffer averaging: ``"uniform"`` (default) or
            ``"num_samples"``.
        client: Client algorithms every client runs (e.g. ``[FedProxClient(mu=0.1)]``, the authors' FedMGDA+prox).

    Raises:
        ValueError: ``lr`` not a finite number > 0, ``epsilon`` outside [0, 1], ``normalize`` not a bool, or an
            unknown ``weighting``.

    Example: updates [2, 0] and [0, 1]: normalised, their min-norm combination is λ = (½, ½), so x_1 = x_0 + η·[½, ½];
    with ε = 0.1 around the sample weights λ₀ = (0.75, 0.25) the box keeps λ = (0.65, 0.35)::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> updates = [ClientUpdate(0, [torch.tensor([2.0, 0.0], dtype=torch.float64)], 30, 3, 0.0),
        ...            ClientUpdate(1, [torch.tensor([0.0, 1.0], dtype=torch.float64)], 10, 1, 0.0)]
        >>> params = [torch.zeros(2, dtype=torch.float64)]
        >>> opt = FedMGDAPlus(lr=0.5)
        >>> opt.server_update(params, updates), params, opt.last_weights
        ([tensor([0.5000, 0.5000], dtype=torch.float64)], [tensor([0.2500, 0.2500], dtype=torch.float64)], array([0.5, 0.5]))
        >>> boxed = FedMGDAPlus(epsilon=0.1, weighting="num_samples")
        >>> _ = boxed.server_update([torch.zeros(2, dtype=torch.float64)], updates)
        >>> boxed.last_weights.round(12)
        array([0.65, 0.35])
        >>> FedMGDAPlus(epsilon=2.0)
        Traceback (most recent call last):
        ...
        ValueError: `epsilon` must be a finite number in [0, 1] (0: λ = λ₀, FedAvg of the normalised updates; 1: the whole simplex), got 2.0.

    Its reducer under another server rule (here FedAvgM's heavy ball)::

        >>> from lightning_fed.algorithms import FedMGDAMinNorm
        >>> from lightning_fed.server.rules import Momentum
        >>> ServerOptimizer(rule=Momentum(lr=1.0, momentum=0.9), aggregators=[FedMGDAMinNorm(epsilon=0.5)])
        ServerOptimizer(lr=1.0, weighting='num_samples')
    """

    state_key_fields = ("lr", "epsilon", "normalize", "weighting")
    repr_fields = ("lr", "weighting", "epsilon", "normalize")

    def __init__(
        self,
        lr: float = 1.0,
        epsilon: float = 1.0,
        normalize: bool = True,
        weighting: str = "uniform",
        client: Optional[list[ClientAlgorithm]] = None,
    ) -> None:
        check_weighting(weighting)
        #: The reducer stage (:class:`~lightning_fed.algorithms.fedmgda.FedMGDAMinNorm`).
        self.min_norm = FedMGDAMinNorm(epsilon=epsilon, normalize=normalize)
        super().__init__(weighting=weighting, aggregators=[self.min_norm], rule=SGD(lr), client=client)

    @property
    def epsilon(self) -> float:
        """ε, the half-width of the box around λ₀ (the stage's)."""
        return self.min_norm.epsilon

    @property
    def normalize(self) -> bool:
        """Whether the updates are normalised (the stage's)."""
        return self.min_norm.normalize

    @property
    def last_weights(self) -> Any:
        """λ* of the last round, float64 ``[K]`` in the round's order (``None`` before the first round; the
        :attr:`round_report`'s)."""
        report = self.stage_report(self.min_norm)
        return None if report is None else report.weights
