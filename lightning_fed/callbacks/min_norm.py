"""The minimum-norm point of a convex hull, by Frank–Wolfe on the Gram matrix (the λ-step of FedAWARE).

Given vectors v_1..v_n (never materialised here: only their Gram matrix G_ij = ⟨v_i, v_j⟩ is needed), find
weights λ on the probability simplex Δ_n = {λ ≥ 0, Σλ_i = 1} minimising

    ‖Σ_i λ_i v_i‖² = λᵀ G λ,

i.e. the point of conv{v_1..v_n} closest to the origin (Zeng et al. 2024, *Tackling Hybrid Heterogeneity on
Federated Optimization via Gradient Diversity Maximization*, Eq. (8) and Alg. 1, l. 11; the same sub-problem as
MGDA in Sener & Koltun 2018). The solver is Frank–Wolfe (Jaggi 2013) with exact line search:

1. start at the best pair: over all i < j, the closed-form minimiser of ‖γ v_i + (1−γ) v_j‖² (:func:`min_norm_pair`),
   keeping the pair with the smallest value (the initialisation of the FedAWARE / MGDA public code);
2. repeat: the Frank–Wolfe vertex t = argmin_i (Gλ)_i (the linear minimiser of the gradient 2Gλ over the
   simplex), then the exact line search λ ← γ·λ + (1−γ)·e_t with γ = :func:`min_norm_pair` of the current point u
   and v_t (⟨u,u⟩ = λᵀGλ, ⟨u,v_t⟩ = (Gλ)_t, ⟨v_t,v_t⟩ = G_tt);
3. stop when the L1 change of λ falls below ``tol`` (1e-5 in the public code), when the Frank–Wolfe duality gap
   λᵀGλ − (Gλ)_t is ≤ 0 (λ is optimal), or after ``max_iter`` iterations.

With ``away_steps=True`` the away-step variant (Lacoste-Julien & Jaggi 2015, Alg. 1) is used: it may also move
weight *away* from the worst vertex of the current support (and drop it exactly), which converges linearly on
this problem, where plain Frank–Wolfe can zig-zag when the optimum lies inside a face. Plain Frank–Wolfe is the
default (paper and public code).

Everything runs in float64 NumPy on CPU: the Gram matrix is n × n with n the number of clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np
import torch
from torch import Tensor

ArrayLike = Union[np.ndarray, Tensor]


@dataclass
class MinNormResult:
    """The solver's answer.

    Attributes:
        weights: λ, float64 ``[n]``, on the simplex.
        value: λᵀGλ = ‖Σλ_i v_i‖² at ``weights``.
        num_iters: Frank–Wolfe iterations run (0 when the initial pair or a single vector is the answer).
        converged: Whether a stopping test (change < ``tol`` or zero duality gap) fired before ``max_iter``.
    """

    weights: np.ndarray
    value: float
    num_iters: int
    converged: bool


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

    Raises:
        ValueError: ``gram`` not a non-empty finite square matrix, ``max_iter`` < 1 or ``tol`` < 0.
    """
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"`max_iter` must be an integer >= 1, got {max_iter!r}.")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not np.isfinite(tol) or tol < 0:
        raise ValueError(f"`tol` must be a finite number >= 0, got {tol!r}.")
    g = _as_gram(gram)
    lam = _best_pair(g)
    if g.shape[0] <= 2:  # the pair's closed form is exact
        return MinNormResult(lam, float(lam @ g @ lam), 0, True)
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
    return MinNormResult(lam, float(lam @ g @ lam), iters, converged)


def min_norm_weights(
    vectors: ArrayLike, max_iter: int = 1000, tol: float = 1e-5, away_steps: bool = False
) -> MinNormResult:
    """:func:`min_norm_frank_wolfe` for explicit vectors ``[n, d]`` (rows are the v_i; Gram computed in float64)."""
    v = vectors.detach().cpu().double() if isinstance(vectors, Tensor) else torch.as_tensor(np.asarray(vectors, dtype=np.float64))
    if v.ndim != 2:
        raise ValueError(f"`vectors` must have shape [n, d], got {tuple(v.shape)}.")
    return min_norm_frank_wolfe(v @ v.T, max_iter=max_iter, tol=tol, away_steps=away_steps)
