"""The minimum-norm point of a convex hull from the Gram matrix (the λ-step of FedAWARE).

Given vectors v_1..v_n (never materialised here: only their Gram matrix G_ij = ⟨v_i, v_j⟩ is needed), find
weights λ on the probability simplex Δ_n = {λ ≥ 0, Σλ_i = 1} minimising

    f(λ) = ‖Σ_i λ_i v_i‖² = λᵀ G λ,

i.e. the point of conv{v_1..v_n} closest to the origin (Zeng et al. 2024, *Tackling Hybrid Heterogeneity on
Federated Optimization via Gradient Diversity Maximization*, Eq. (8) and Alg. 1, l. 11; the same sub-problem as
MGDA in Sener & Koltun 2018). λ is optimal iff (Gλ)_i ≥ λᵀGλ for every i (with equality on the support), and
the Frank–Wolfe duality gap λᵀGλ − min_i (Gλ)_i (:func:`duality_gap`) bounds f(λ) − f* from above.

Two solvers (:func:`min_norm_point` picks one; ``SOLVERS`` lists them):

* ``"active_set"`` (default, :func:`min_norm_active_set`): exact. The problem is rewritten as non-negative least
  squares, min_{μ ≥ 0} ‖Σμ_i v_i‖² + (1 − Σμ_i)², whose solution is μ* = λ*/(1 + f*) (for μ = tλ the inner
  minimum over t is f(λ)/(1 + f(λ)), increasing in f), and solved by the Lawson–Hanson active-set method
  (Lawson & Hanson 1974, *Solving Least Squares Problems*, Ch. 23, Alg. NNLS), which terminates after finitely
  many steps; λ = μ/Σμ. It stops when the duality gap is ≤ ``tol``·max_i G_ii (default 1e-9).
* ``"frank_wolfe"`` (:func:`min_norm_frank_wolfe`): the solver of the paper's public code. Frank–Wolfe
  (Jaggi 2013) with exact line search started at the best pair, stopped when the L1 change of λ is below
  ``tol`` (1e-5 in the public code) or after ``max_iter`` iterations; ``away_steps=True`` gives the away-step
  variant (Lacoste-Julien & Jaggi 2015, Alg. 1). Plain Frank–Wolfe converges sublinearly and zig-zags when the
  optimum lies inside a face: on 6 unit vectors it can stop at its 1,000-iteration cap with λ still visibly
  off (see ``tests/callbacks/test_min_norm.py``). Kept so that results of the earlier default are reproducible.
  One difference from the public code's ``MinNormSolver.find_min_norm_element_FW`` (github.com/dunzeng/FedAWARE,
  ``min_norm_solvers.py``, read, not copied): its two-point line search returns γ = 0.999 when ⟨a, b⟩ ≥ ⟨a, a⟩
  and γ = 0.001 when ⟨a, b⟩ ≥ ⟨b, b⟩ (a clamp, so it keeps moving 0.1 % towards a vertex that does not improve),
  where :func:`min_norm_pair` clips exactly to 1 and 0. With the clamp it stops at 1.04–1.99× the exact minimum
  ‖d‖² on Fashion-MNIST (issue #34); this solver has no clamp, so where it stops differs.

Every solver emits a :class:`MinNormConvergenceWarning` when it stops at its iteration cap without meeting its
stopping test (``converged=False`` in the result).

Everything runs in float64 NumPy on CPU: the Gram matrix is n × n with n the number of clients.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import torch
from torch import Tensor

from lightning_fed.checks import check_int, check_non_negative, check_positive_int

ArrayLike = Union[np.ndarray, Tensor]

#: The solvers :func:`min_norm_point` accepts.
SOLVERS: tuple[str, ...] = ("active_set", "frank_wolfe")


class MinNormConvergenceWarning(RuntimeWarning):
    """A min-norm solve stopped at its iteration cap before its stopping test held: λ is not (yet) optimal.

    Example: one Frank–Wolfe iteration is not enough for three unit vectors (the optimum is λ = (⅓, ⅓, ⅓))::

        >>> import warnings
        >>> import numpy as np
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     result = min_norm_frank_wolfe(np.eye(3), max_iter=1)
        >>> result.converged, [w.category.__name__ for w in caught]
        (False, ['MinNormConvergenceWarning'])
    """


@dataclass
class MinNormResult:
    """The solver's answer.

    Attributes:
        weights: λ, float64 ``[n]``, on the simplex.
        value: λᵀGλ = ‖Σλ_i v_i‖² at ``weights``.
        num_iters: Solver iterations run (0 when the initial pair or a single vector is the answer); Frank–Wolfe
            steps, or least-squares solves of the active-set method.
        converged: Whether the solver's stopping test held before its iteration cap (Frank–Wolfe: change <
            ``tol`` or zero duality gap; active set: duality gap ≤ ``tol``·max_i G_ii).
        gap: The Frank–Wolfe duality gap λᵀGλ − min_i (Gλ)_i at ``weights`` (≥ 0 up to rounding; an upper bound
            on ``value`` − the optimal value), in the units of G; ``nan`` when not computed.

    Example: the min-norm point of the segment between v_0 = [1, 0] and v_1 = [0, 2] (Gram matrix
    G = [[1, 0], [0, 4]]): λ = (4/5, 1/5), ‖0.8·v_0 + 0.2·v_1‖² = 0.64 + 0.16 = 0.8::

        >>> import numpy as np
        >>> result = min_norm_point(np.array([[1.0, 0.0], [0.0, 4.0]]))
        >>> result.weights, round(result.value, 12), result.converged
        (array([0.8, 0.2]), 0.8, True)
    """

    weights: np.ndarray
    value: float
    num_iters: int
    converged: bool
    gap: float = float("nan")


class MinNormReport(NamedTuple):
    """A min-norm aggregation stage's report of one round (FedAWARE's, FedMGDA+'s; in ``RoundReport.stages``).

    Attributes:
        weights: λ, float64 (FedAWARE: ``[N]`` over all clients; FedMGDA+: ``[K]`` in the round's order); ``None``
            in a round without a solve (FedAWARE's warm-up).
        solve: The solver's :class:`MinNormResult` (``None`` when no solve ran).
        diversity: √(Σλ_i‖v_i‖² / ‖Σλ_i v_i‖²) over the vectors the solve saw (FedAWARE's Eq. 3/6 with these λ);
            ``nan`` for a zero combination, ``None`` without a solve.

    Example::

        >>> MinNormReport(None, None, None).weights is None
        True
    """

    weights: Optional[np.ndarray]
    solve: Optional[MinNormResult]
    diversity: Optional[float]


def min_norm_pair(aa: float, ab: float, bb: float) -> tuple[float, float]:
    """Closed-form minimiser of ‖γa + (1−γ)b‖² over γ ∈ [0, 1] from the inner products.

    γ* = clip(⟨b − a, b⟩ / ‖a − b‖², 0, 1) = clip((bb − ab) / (aa + bb − 2ab), 0, 1); when a = b (zero
    denominator) γ* = 1.

    Args:
        aa: ⟨a, a⟩.
        ab: ⟨a, b⟩.
        bb: ⟨b, b⟩.

    Returns:
        ``(γ*, value)`` with value = ‖γ*a + (1−γ*)b‖².
    """
    denom = aa + bb - 2.0 * ab
    if denom <= 0.0:
        gamma = 1.0
    else:
        gamma = min(max((bb - ab) / denom, 0.0), 1.0)
    value = gamma * gamma * aa + 2.0 * gamma * (1.0 - gamma) * ab + (1.0 - gamma) ** 2 * bb
    return gamma, value


def _check_solver_args(tol: Any, max_iter: Any) -> None:
    """Raise ``ValueError`` naming ``tol`` (a finite number >= 0) or ``max_iter`` (an integer >= 1 or ``None``)."""
    check_non_negative("tol", tol)
    check_int("max_iter", max_iter, 1, optional=True)


def _as_gram(gram: ArrayLike) -> np.ndarray:
    if isinstance(gram, Tensor):
        gram = gram.detach().cpu().double().numpy()
    g = np.array(gram, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] != g.shape[1] or g.shape[0] == 0:
        raise ValueError(f"`gram` must be a non-empty square matrix, got shape {tuple(g.shape)}.")
    if not np.all(np.isfinite(g)):
        raise ValueError("`gram` has non-finite entries.")
    return 0.5 * (g + g.T)


def _best_pair(g: np.ndarray) -> np.ndarray:
    """λ supported on the pair (or single vertex) with the smallest min-norm value."""
    n = g.shape[0]
    diag = np.diag(g)
    lam = np.zeros(n)
    if n == 1:
        lam[0] = 1.0
        return lam
    i, j = np.triu_indices(n, k=1)
    aa, bb, ab = diag[i], diag[j], g[i, j]
    denom = aa + bb - 2.0 * ab
    safe = np.where(denom > 0, denom, 1.0)
    gamma = np.where(denom > 0, np.clip((bb - ab) / safe, 0.0, 1.0), 1.0)
    values = gamma**2 * aa + 2.0 * gamma * (1.0 - gamma) * ab + (1.0 - gamma) ** 2 * bb
    k = int(np.argmin(values))
    lam[i[k]] += gamma[k]
    lam[j[k]] += 1.0 - gamma[k]
    return lam


def min_norm_frank_wolfe(
    gram: ArrayLike, max_iter: int = 1000, tol: float = 1e-5, away_steps: bool = False
) -> MinNormResult:
    """Minimum-norm point of conv{v_i}: λ* = argmin_{λ ∈ simplex} λᵀGλ by Frank–Wolfe (see the module docstring).

    Args:
        gram: G, ``[n, n]`` symmetric positive semi-definite (Tensor or array; symmetrised, used in float64).
        max_iter: Iteration cap (≥ 1; the public code uses 250, some versions 1000).
        tol: Stop when ‖λ_{k+1} − λ_k‖₁ < ``tol`` (≥ 0; 1e-5 in the public code).
        away_steps: Use away-step Frank–Wolfe (linear convergence) instead of plain Frank–Wolfe.

    Returns:
        :class:`MinNormResult`.

    Warns:
        MinNormConvergenceWarning: ``max_iter`` iterations ran without the change falling below ``tol``.

    Raises:
        ValueError: ``gram`` not a non-empty finite square matrix, ``max_iter`` < 1 or ``tol`` < 0.
    """
    check_positive_int("max_iter", max_iter)
    check_non_negative("tol", tol)
    g = _as_gram(gram)
    lam = _best_pair(g)
    if g.shape[0] <= 2:  # the pair's closed form is exact
        return MinNormResult(lam, float(lam @ g @ lam), 0, True, duality_gap(g, lam))
    converged = False
    iters = 0
    for iters in range(1, int(max_iter) + 1):
        g_lam = g @ lam
        uu = float(lam @ g_lam)
        t = int(np.argmin(g_lam))
        fw_gap = uu - float(g_lam[t])  # = ⟨∇/2, λ − e_t⟩ ≥ 0; zero at the optimum
        if away_steps:
            support = np.flatnonzero(lam > 0)
            s = int(support[np.argmax(g_lam[support])])
            away_gap = float(g_lam[s]) - uu
            if fw_gap <= 0.0 and away_gap <= 0.0:
                converged = True
                break
            if fw_gap >= away_gap:
                direction = -lam.copy()
                direction[t] += 1.0  # e_t − λ
                step_max = 1.0
            else:
                direction = lam.copy()
                direction[s] -= 1.0  # λ − e_s
                step_max = lam[s] / (1.0 - lam[s]) if lam[s] < 1.0 else np.inf
            # exact line search of (λ + s·d)ᵀG(λ + s·d): minimiser −dᵀGλ / dᵀGd, clipped to [0, step_max]
            g_dir = g @ direction
            curv = float(direction @ g_dir)
            slope = float(direction @ g_lam)
            step = step_max if curv <= 0.0 else min(max(-slope / curv, 0.0), step_max)
            new = lam + step * direction
            if fw_gap < away_gap and step == step_max:
                new[s] = 0.0  # drop step: remove the vertex exactly
            new = np.maximum(new, 0.0)
            new /= new.sum()
        else:
            if fw_gap <= 0.0:
                converged = True
                break
            gamma, _ = min_norm_pair(uu, float(g_lam[t]), float(g[t, t]))
            new = gamma * lam
            new[t] += 1.0 - gamma
        change = float(np.abs(new - lam).sum())
        lam = new
        if change < tol:
            converged = True
            break
    gap = duality_gap(g, lam)
    if not converged:
        warnings.warn(
            f"Frank–Wolfe min-norm solve stopped at `max_iter`={max_iter} iterations before the L1 change of λ fell "
            f"below `tol`={tol:g} (duality gap {gap:.3g}): λ may not be optimal. The exact solver "
            "(solver='active_set') has no such cap.",
            MinNormConvergenceWarning,
            stacklevel=2,
        )
    return MinNormResult(lam, float(lam @ g @ lam), iters, converged, gap)


def duality_gap(gram: ArrayLike, weights: ArrayLike) -> float:
    """The Frank–Wolfe duality gap λᵀGλ − min_i (Gλ)_i of weights λ on the simplex.

    ≥ 0 for every λ on the simplex, 0 exactly at the optimum (KKT: (Gλ)_i ≥ λᵀGλ for all i), and
    f(λ) − min f ≤ 2·gap for f(λ) = λᵀGλ (convexity: f(λ*) ≥ f(λ) + ⟨2Gλ, λ* − λ⟩ ≥ f(λ) − 2·gap). Units of G.

    Args:
        gram: G, ``[n, n]``.
        weights: λ, ``[n]``.
    """
    g = np.asarray(gram.detach().cpu().double() if isinstance(gram, Tensor) else gram, dtype=np.float64)
    lam = np.asarray(weights.detach().cpu().double() if isinstance(weights, Tensor) else weights, dtype=np.float64)
    g_lam = g @ lam
    return float(lam @ g_lam - g_lam.min())


def min_norm_active_set(gram: ArrayLike, tol: float = 1e-9, max_iter: Optional[int] = None) -> MinNormResult:
    """Exact minimum-norm point of conv{v_i}: λ* = argmin_{λ ∈ simplex} λᵀGλ by an active-set method.

    The simplex QP is solved as the non-negative least-squares problem
    min_{μ ≥ 0} ‖Aμ − b‖² with A = [R; 1ᵀ] (RᵀR = G/s, s = max_i G_ii, R from the eigendecomposition of G/s
    with negative rounding-level eigenvalues set to 0) and b = (0, …, 0, 1), i.e. ‖Σμ_i v_i‖²/s + (1 − Σμ_i)²;
    its solution is μ* = λ*/(1 + f*/s), so λ* = μ*/Σμ* (module docstring). NNLS is solved by Lawson & Hanson's
    active-set algorithm (*Solving Least Squares Problems*, 1974, Ch. 23, Alg. NNLS), which terminates in
    finitely many steps; each step is a least-squares solve (``numpy.linalg.lstsq``) on the current support.
    Two vectors use the closed form of :func:`min_norm_pair` (0 iterations).

    Args:
        gram: G, ``[n, n]`` symmetric positive semi-definite (Tensor or array; symmetrised, used in float64).
        tol: Optimality tolerance (finite, ≥ 0; default 1e-9): the answer is accepted when its duality gap
            λᵀGλ − min_i (Gλ)_i (:func:`duality_gap`) is ≤ ``tol``·max_i G_ii, so λᵀGλ − f* ≤ 2·``tol``·max_i G_ii.
        max_iter: Cap on the least-squares solves (int ≥ 1; default ``None``: 10·n + 10).

    Returns:
        :class:`MinNormResult` (``converged``: the gap test held).

    Warns:
        MinNormConvergenceWarning: the cap was reached, or the final duality gap exceeds ``tol``·max_i G_ii
            (rounding trouble on a near-degenerate G).

    Raises:
        ValueError: ``gram`` not a non-empty finite square matrix, ``tol`` negative or not finite, ``max_iter`` < 1.
    """
    _check_solver_args(tol, max_iter)
    g = _as_gram(gram)
    n = g.shape[0]
    cap = 10 * n + 10 if max_iter is None else int(max_iter)
    scale = float(np.max(np.diag(g)))
    if n <= 2 or scale <= 0.0:  # closed form (or all vectors zero: every λ is optimal)
        lam = _best_pair(g)
        return MinNormResult(lam, float(lam @ g @ lam), 0, True, duality_gap(g, lam))
    gs = g / scale
    evals, evecs = np.linalg.eigh(gs)
    a = np.vstack([np.sqrt(np.clip(evals, 0.0, None))[:, None] * evecs.T, np.ones((1, n))])
    b = np.zeros(n + 1)
    b[-1] = 1.0
    mu = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ mu)
    w_tol = 10.0 * np.finfo(np.float64).eps * n * max(1.0, float(np.abs(a).sum(axis=0).max()))
    iters, capped = 0, False
    while (~passive).any() and float(np.max(np.where(passive, -np.inf, w))) > w_tol:
        if iters >= cap:
            capped = True
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            iters += 1
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if np.all(z[passive] > 0.0):
                mu = z
                break
            if iters >= cap:
                capped = True
                break
            blocking = np.flatnonzero(passive & (z <= 0.0))
            ratios = mu[blocking] / (mu[blocking] - z[blocking])
            step = float(np.min(ratios))
            mu = mu + step * (z - mu)
            mu[blocking[ratios <= step]] = 0.0  # the blocking coordinate(s) leave the support exactly
            passive &= mu > 0.0
            mu[~passive] = 0.0
            if not passive.any():  # numerical breakdown: nothing left to solve on
                break
        if capped:
            break
        w = a.T @ (b - a @ mu)
    total = float(mu.sum())
    lam = mu / total if total > 0 else _best_pair(g)
    gap = duality_gap(g, lam)
    converged = gap <= tol * scale
    if not converged:
        reason = f"stopped at `max_iter`={cap} least-squares solves" if capped else "ended"
        warnings.warn(
            f"Active-set min-norm solve {reason} with duality gap {gap:.3g} > `tol`·max G_ii = {tol * scale:.3g}: "
            "λ is not optimal to the requested tolerance.",
            MinNormConvergenceWarning,
            stacklevel=2,
        )
    return MinNormResult(lam, float(lam @ g @ lam), iters, converged, gap)


def min_norm_point(gram: ArrayLike, solver: str = "active_set", **options: Any) -> MinNormResult:
    """λ* = argmin_{λ ∈ simplex} λᵀGλ with the named solver.

    Args:
        gram: G, ``[n, n]`` symmetric positive semi-definite.
        solver: ``"active_set"`` (default; exact, :func:`min_norm_active_set`) or ``"frank_wolfe"`` (the public
            code's solver, :func:`min_norm_frank_wolfe`).
        **options: Passed to the solver (``tol``, ``max_iter``; ``away_steps`` for Frank–Wolfe only).

    Raises:
        ValueError: an unknown ``solver``, or the solver's own errors. TypeError: an option the solver lacks.
    """
    if solver == "active_set":
        return min_norm_active_set(gram, **options)
    if solver == "frank_wolfe":
        return min_norm_frank_wolfe(gram, **options)
    raise ValueError(f"`solver` must be one of {SOLVERS}, got {solver!r}.")


def min_norm_weights(vectors: ArrayLike, solver: str = "active_set", **options: Any) -> MinNormResult:
    """:func:`min_norm_point` for explicit vectors ``[n, d]`` (rows are the v_i; Gram computed in float64)."""
    v = vectors.detach().cpu().double() if isinstance(vectors, Tensor) else torch.as_tensor(np.asarray(vectors, dtype=np.float64))
    if v.ndim != 2:
        raise ValueError(f"`vectors` must have shape [n, d], got {tuple(v.shape)}.")
    return min_norm_point((v @ v.T).numpy(), solver=solver, **options)
