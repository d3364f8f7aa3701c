"""FedAWARE: per-client momenta on the server, aggregated with min-norm (gradient-diversity-maximising) weights."""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from lightning_fed.callbacks.min_norm import SOLVERS, MinNormResult, min_norm_active_set, min_norm_frank_wolfe
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client import ClientUpdate
from lightning_fed.server.client_state import ClientStateTable

_CONVENTIONS = ("paper", "code")


class FedAWARE(ServerOptimizer):
    """FedAWARE (Zeng et al., *Tackling Hybrid Heterogeneity on Federated Optimization via Gradient Diversity
    Maximization*, ICML 2024, Algorithm 1).

    The server keeps one momentum vector m_i ∈ R^d for **every** client i ∈ [N] (not only the cohort). In round t,
    with g_i = x_t − x_i = −Δ_i the update of a sampled client (Alg. 1, l. 8)::

        m_i ← α·m_i + (1−α)·g_i   if i ∈ S_t,   m_i unchanged otherwise        (l. 10; m_i = 0 before i is seen)
        λ   = argmin_{λ ∈ simplex} ‖Σ_i λ_i v_i‖²,   v_i = m_i / ‖m_i‖  (or m_i)  (l. 11, Eq. 8)
        d_t = Σ_i λ_i v_i
        x_{t+1} = x_t − η·d_t                                                   (l. 12)

    λ is the minimum-norm point of the convex hull of the v_i (the weights that maximise the surrogate gradient
    diversity, Eq. 6-8). By default it is solved exactly on the Gram matrix
    (``solver="active_set"``: :func:`~lightning_fed.callbacks.min_norm.min_norm_active_set`, duality gap
    ≤ 1e-9·max_i ‖v_i‖², i.e. ≤ 1e-9 on the unit momenta). ``solver="frank_wolfe"`` is the public code's
    Frank–Wolfe with exact line search (:func:`~lightning_fed.callbacks.min_norm.min_norm_frank_wolfe`, started at
    the best pair, stopped when the L1 change of λ is below ``fw_tol`` or after ``fw_max_iter`` iterations), the
    default before; it can stop at its cap well short of the optimum (plain Frank–Wolfe zig-zags when the optimum
    is inside a face: with 6 clients the direction can stay ~4 % off after 1,000 iterations). Either solver emits
    a :class:`~lightning_fed.callbacks.min_norm.MinNormConvergenceWarning` when it stops short.

    Options matching the authors' public code (github.com/dunzeng/FedAWARE), where it departs from the paper:

    * ``normalize`` (default ``True``, as the code): solve for λ on the unit-normalised momenta and step along
      their λ-combination (so ‖d_t‖ ≤ 1 and the step length is set by η). Default because the published results
      were produced this way, and because without it the min-norm weights are driven by the momenta's *lengths*
      rather than their directions: the shortest momentum (typically the client that did the least local work,
      the very imbalance FedAWARE targets) dominates, and ‖d_t‖ collapses towards 0. ``normalize=False`` is
      the paper's Alg. 1 as written.
    * ``alpha_convention="code"``: m_i ← (1−α)·m_i + α·g_i (the code's α weighs the *new* update; the paper's
      α = 0.5 is the same under both; the code's α = 0.3 for (Fashion-)MNIST is the paper's α = 0.7).
    * ``fedavg_warmup`` (default ``False``, the paper: FedAWARE from round 1; ``True`` is the public code):
      until every one of the N clients has been seen once, step with the ``weighting``-weighted FedAvg of the
      round's updates (x_{t+1} = x_t + η·Σ w_i Δ_i); the momenta are updated during warm-up all the same.
      With 10 of 100 clients per round the warm-up lasts about 50 rounds (coupon collector: N·H_N/C).
    * ``projection`` (default ``False``): replace d_t by the projection of the ``weighting``-weighted average of
      the (raw) momenta m̄ = Σ_i w_i m_i onto d_t, i.e. d_t ← (⟨m̄, d_t⟩ / ‖d_t‖²)·d_t: the FedAWARE direction
      with the magnitude of the average update (the code's ``-projection``). A zero d_t gives a zero step.

    Clients never seen yet (m_i = 0) — and any client whose momentum is exactly zero (e.g. it took no local
    step on its first visit) — are left out of the min-norm problem: a zero vector in the hull would make the
    min-norm point 0 and stop training; their λ_i is reported as 0. The public code instead waits, through
    ``fedavg_warmup``, until no momentum is zero.

    Memory: the momentum table (:attr:`client_state`, a dense
    :class:`~lightning_fed.server.client_state.ClientStateTable`) is an ``[N, d]`` tensor on **CPU** in the parameters' (promoted) dtype, plus
    an ``[N, N]`` float64 Gram matrix kept up to date row by row (C·N·d multiply-adds per round for a cohort of
    C). E.g. 100 clients × 582,026 parameters (the Fashion-MNIST CNN) × 4 B = 233 MB; 715 Shakespeare clients
    × 822,570 parameters × 4 B = 2.35 GB. All of it is in :meth:`state_dict`, hence in every checkpoint.

    N is read from ``trainer.datamodule.num_clients`` in :meth:`setup`; pass ``num_clients`` to use
    :meth:`server_update` without a trainer (it must then agree with the data module).

    After each round: :attr:`last_weights` (λ over all N clients, ``None`` during warm-up), :attr:`last_solve`
    (the solver's :class:`~lightning_fed.callbacks.min_norm.MinNormResult`) and, in the logged metrics,
    ``fedaware_support`` (number of clients with λ_i > 0), ``fedaware_fw_iters`` (the solver's iterations, whichever
    solver) and ``fedaware_min_norm_sq`` (‖Σλ_i v_i‖²). :meth:`gradient_diversity` (``round_gradient_diversity``) is
    √(Σλ_i‖v_i‖² / ‖Σλ_i v_i‖²) (the square root, Eq. 3/6) with FedAWARE's λ and the vectors it was solved on (so
    1/‖d_t‖ under ``normalize``); the FedAvg diversity of the
    round's updates during warm-up.

    Args:
        lr: Server learning rate η (> 0; the paper uses 1).
        alpha: Momentum coefficient α (paper convention: [0, 1), the weight of the old momentum; code convention:
            (0, 1], the weight of the new update). Default 0.5 (the paper's value; the same in both conventions).
        normalize: Normalise the momenta to unit L2 norm before solving (default ``True``, see above).
        alpha_convention: ``"paper"`` (default) or ``"code"``.
        fedavg_warmup: FedAvg until every client has been seen once (default ``False``, as the paper).
        projection: Keep the magnitude of the average momentum (default ``False``).
        fw_max_iter: Frank–Wolfe iteration cap (≥ 1; ``None``, the default, means 1000; the public code uses 250
            in one version and 1000 in another). Only with ``solver="frank_wolfe"``.
        fw_tol: Frank–Wolfe stops when the L1 change of λ is below this (≥ 0; ``None``, the default, means 1e-5 as
            the code). Only with ``solver="frank_wolfe"``.
        fw_away_steps: Use away-step Frank–Wolfe (``None``, the default, means ``False``: plain Frank–Wolfe). Only
            with ``solver="frank_wolfe"``.
        num_clients: N, when known up front (default ``None``: read from the data module).
        weighting: Weights of the warm-up FedAvg and of the ``projection`` average: ``"num_samples"`` (default)
            or ``"uniform"``.
        solver: The min-norm solver: ``"active_set"`` (default, exact) or ``"frank_wolfe"`` (the public code's;
            reproduces results of the earlier default with the ``fw_*`` options left at ``None``).

    Raises:
        ValueError: ``lr`` not a finite number > 0, ``alpha`` outside its convention's range, an unknown
            ``alpha_convention``, ``weighting`` or ``solver``, ``fw_max_iter`` < 1, ``fw_tol`` negative or not
            finite, an ``fw_*`` option given with ``solver="active_set"``,
            ``num_clients`` not a positive integer, or a non-boolean flag. At run time: no N known, client ids
            outside [0, N) or repeated within a round, or an N that disagrees with the data module / a checkpoint.

    Example: two clients with orthogonal updates of lengths 1 and 2 (g_0 = [1, 0], g_1 = [0, 2]); after round 1
    m_i = (1 − α)·g_i. Normalised (the default), λ = (½, ½) and d_1 = ½·[1, 0] + ½·[0, 1]; on the raw momenta
    (``normalize=False``, Alg. 1 as written) λ_i ∝ 1/‖m_i‖², so the shorter momentum gets λ_0 = 4/5::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> updates = [ClientUpdate(0, [torch.tensor([-1.0, 0.0], dtype=torch.float64)], 10, 1, 0.0),
        ...            ClientUpdate(1, [torch.tensor([0.0, -2.0], dtype=torch.float64)], 10, 1, 0.0)]
        >>> opt = FedAWARE(lr=1.0, num_clients=2)
        >>> params = [torch.zeros(2, dtype=torch.float64)]
        >>> _ = opt.server_update(params, updates)
        >>> opt.last_weights, params  # x_1 = x_0 − η·d_1
        (array([0.5, 0.5]), [tensor([-0.5000, -0.5000], dtype=torch.float64)])
        >>> raw = FedAWARE(lr=1.0, num_clients=2, normalize=False)
        >>> params = [torch.zeros(2, dtype=torch.float64)]
        >>> _ = raw.server_update(params, updates)
        >>> raw.last_weights.round(6), params  # d_1 = 0.8·[0.5, 0] + 0.2·[0, 1]
        (array([0.8, 0.2]), [tensor([-0.4000, -0.2000], dtype=torch.float64)])
        >>> FedAWARE(alpha=1.0)
        Traceback (most recent call last):
        ...
        ValueError: `alpha` must lie in [0, 1) with alpha_convention='paper' (weight of the old momentum), got 1.0.
    """

    def __init__(
        self,
        lr: float = 1.0,
        alpha: float = 0.5,
        normalize: bool = True,
        alpha_convention: str = "paper",
        fedavg_warmup: bool = False,
        projection: bool = False,
        fw_max_iter: Optional[int] = None,
        fw_tol: Optional[float] = None,
        fw_away_steps: Optional[bool] = None,
        num_clients: Optional[int] = None,
        weighting: str = "num_samples",
        solver: str = "active_set",
    ) -> None:
        super().__init__(lr=lr, weighting=weighting)
        if alpha_convention not in _CONVENTIONS:
            raise ValueError(f"`alpha_convention` must be one of {_CONVENTIONS}, got {alpha_convention!r}.")
        self.alpha_convention = alpha_convention
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ValueError(f"`alpha` must be a finite number, got {alpha!r}.")
        if alpha_convention == "paper" and not 0.0 <= alpha < 1.0:
            raise ValueError(
                f"`alpha` must lie in [0, 1) with alpha_convention='paper' (weight of the old momentum), got {alpha!r}."
            )
        if alpha_convention == "code" and not 0.0 < alpha <= 1.0:
            raise ValueError(
                f"`alpha` must lie in (0, 1] with alpha_convention='code' (weight of the new update), got {alpha!r}."
            )
        self.alpha = float(alpha)
        for name, flag in (
            ("normalize", normalize), ("fedavg_warmup", fedavg_warmup), ("projection", projection),
            ("fw_away_steps", False if fw_away_steps is None else fw_away_steps),
        ):
            if not isinstance(flag, bool):
                raise ValueError(f"`{name}` must be a bool, got {flag!r}.")
        self.normalize = normalize
        self.fedavg_warmup = fedavg_warmup
        self.projection = projection
        if fw_max_iter is not None and (
            isinstance(fw_max_iter, bool) or not isinstance(fw_max_iter, int) or fw_max_iter < 1
        ):
            raise ValueError(f"`fw_max_iter` must be an integer >= 1 or None, got {fw_max_iter!r}.")
        if fw_tol is not None and (
            isinstance(fw_tol, bool) or not isinstance(fw_tol, (int, float)) or not math.isfinite(fw_tol) or fw_tol < 0
        ):
            raise ValueError(f"`fw_tol` must be a finite number >= 0 or None, got {fw_tol!r}.")
        if solver not in SOLVERS:
            raise ValueError(f"`solver` must be one of {SOLVERS}, got {solver!r}.")
        given = [n for n, v in (("fw_max_iter", fw_max_iter), ("fw_tol", fw_tol), ("fw_away_steps", fw_away_steps))
                 if v is not None]
        if solver != "frank_wolfe" and given:
            raise ValueError(
                f"{', '.join(f'`{n}`' for n in given)} only apply to solver='frank_wolfe', got solver={solver!r}: "
                "pass solver='frank_wolfe' or leave them at None."
            )
        #: The min-norm solver, ``"active_set"`` or ``"frank_wolfe"``.
        self.solver = solver
        self.fw_away_steps = False if fw_away_steps is None else fw_away_steps
        self.fw_max_iter = 1000 if fw_max_iter is None else fw_max_iter
        self.fw_tol = 1e-5 if fw_tol is None else float(fw_tol)
        if num_clients is not None and (
            isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1
        ):
            raise ValueError(f"`num_clients` must be a positive integer or None, got {num_clients!r}.")
        #: N, the number of clients (from the constructor or the data module).
        self.num_clients: Optional[int] = num_clients
        #: |D_i| as last reported by client i, int64 ``[N]`` (0 for unseen clients).
        self.client_num_samples: Optional[Tensor] = None
        #: ⟨m_i, m_j⟩, float64 ``[N, N]``.
        self.gram: Optional[Tensor] = None
        #: λ of the last round over all N clients (float64), ``None`` in a warm-up round.
        self.last_weights: Optional[np.ndarray] = None
        #: The last round's solver result (``None`` in a warm-up round or with no usable momentum).
        self.last_solve: Optional[MinNormResult] = None
        self._last_diversity: Optional[float] = None

    # ------------------------------------------------------------------ N from the data module
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Read N from ``trainer.datamodule.num_clients`` (called by Lightning after the data module's setup).

        Raises:
            ValueError: it disagrees with ``num_clients`` or with a momentum table already built.
        """
        datamodule = getattr(trainer, "datamodule", None)
        n = getattr(datamodule, "num_clients", None) if datamodule is not None else None
        if n is None:
            return
        n = int(n)
        if self.num_clients is not None and self.num_clients != n:
            raise ValueError(
                f"FedAWARE was built for num_clients={self.num_clients}, but the data module has {n} clients."
            )
        self.num_clients = n

    @property
    def momenta(self) -> Optional[Tensor]:
        """m_i, ``[N, d]`` on CPU (``None`` until the first round): the dense :attr:`client_state` table's matrix."""
        return None if self.client_state is None else self.client_state.matrix

    @property
    def seen(self) -> Optional[Tensor]:
        """Whether client i has been seen, bool ``[N]`` (``None`` until the first round): the rows written in
        :attr:`client_state`."""
        return None if self.client_state is None else self.client_state.present

    # ------------------------------------------------------------------ the update rule
    def _momentum_coefficients(self) -> tuple[float, float]:
        """(weight of the old momentum, weight of the new update)."""
        if self.alpha_convention == "paper":
            return self.alpha, 1.0 - self.alpha
        return 1.0 - self.alpha, self.alpha

    def _ensure_table(self, params: list[Tensor]) -> None:
        if self.num_clients is None:
            raise ValueError(
                "FedAWARE needs the number of clients N: train through a FederatedTrainer with a "
                "FederatedDataModule (N is read from `datamodule.num_clients`) or pass `num_clients=`."
            )
        d = sum(p.numel() for p in params)
        if self.client_state is not None:
            if tuple(self.momenta.shape) != (self.num_clients, d):
                raise ValueError(
                    f"FedAWARE's momentum table has shape {tuple(self.momenta.shape)}, but the run has "
                    f"{self.num_clients} clients and {d} parameters."
                )
            return
        dtype = functools.reduce(torch.promote_types, [p.dtype for p in params])
        n = self.num_clients
        self.client_state = ClientStateTable(n, d, dtype=dtype, dense=True)
        self.client_num_samples = torch.zeros(n, dtype=torch.int64)
        self.gram = torch.zeros(n, n, dtype=torch.float64)

    def _check_ids(self, updates: list[ClientUpdate]) -> list[int]:
        ids = [int(u.client_id) for u in updates]
        bad = [i for i in ids if not 0 <= i < self.num_clients]
        if bad:
            raise ValueError(f"Client ids {bad} are outside [0, {self.num_clients}) (num_clients={self.num_clients}).")
        if len(set(ids)) != len(ids):
            raise ValueError(f"A client appears more than once in the round: ids {ids}.")
        return ids

    def _update_momenta(self, ids: list[int], updates: list[ClientUpdate]) -> None:
        table = self.client_state
        m = table.matrix
        rows = torch.tensor(ids, dtype=torch.long)
        # Δ_i flattened in module.parameters() order, straight into one CPU buffer [C, d].
        deltas = torch.empty(len(updates), m.shape[1], dtype=m.dtype)
        for i, update in enumerate(updates):
            offset = 0
            for t in update.delta:
                deltas[i, offset:offset + t.numel()].copy_(t.detach().reshape(-1))
                offset += t.numel()
        old_w, new_w = self._momentum_coefficients()
        # m_i ← old_w·m_i + new_w·g_i with g_i = x_t − x_i = −Δ_i.
        cohort = table.gather(ids).mul_(old_w).sub_(deltas, alpha=new_w)
        table.scatter(ids, cohort)  # marks the cohort seen
        self.client_num_samples[rows] = torch.tensor([int(u.num_samples) for u in updates], dtype=torch.int64)
        # Gram rows/columns of the changed momenta only: C·N·d work.
        new_rows = (cohort @ m.T).to(torch.float64)
        self.gram[rows, :] = new_rows
        self.gram[:, rows] = new_rows.T

    def _weighting_vector(self, idx: np.ndarray) -> np.ndarray:
        if self.weighting == "uniform":
            w = np.ones(len(idx))
        else:
            w = self.client_num_samples.numpy()[idx].astype(np.float64)
            if w.sum() <= 0:
                w = np.ones(len(idx))
        return w / w.sum()

    def _direction(self) -> Tensor:
        """d_t (flat, CPU, table dtype); sets :attr:`last_weights`, :attr:`last_solve` and the diversity."""
        n = self.num_clients
        gram = self.gram.numpy()
        diag = np.diag(gram)
        idx = np.flatnonzero(self.seen.numpy() & (diag > 0))
        lam_full = np.zeros(n)
        coef_full = np.zeros(n)  # d_t = Σ_i coef_i·m_i
        self.last_solve = None
        self._last_diversity = float("nan")
        if len(idx) > 0:
            g_raw = gram[np.ix_(idx, idx)]
            if self.normalize:
                norms = np.sqrt(diag[idx])
                g_solve = g_raw / np.outer(norms, norms)
            else:
                norms = np.ones(len(idx))
                g_solve = g_raw
            if self.solver == "frank_wolfe":
                result = min_norm_frank_wolfe(
                    g_solve, max_iter=self.fw_max_iter, tol=self.fw_tol, away_steps=self.fw_away_steps
                )
            else:
                result = min_norm_active_set(g_solve)
            lam = result.weights
            coef = lam / norms
            denom = float(lam @ g_solve @ lam)
            numer = float(lam @ np.diag(g_solve))
            self._last_diversity = math.sqrt(numer / denom) if denom > 0 else float("nan")  # Eq. 3/6: √ratio
            if self.projection:
                # d ← (⟨m̄, d⟩ / ‖d‖²)·d with m̄ = Σ w_i m_i (raw momenta), all from the Gram matrix.
                w = self._weighting_vector(idx)
                dd = float(coef @ g_raw @ coef)
                coef = coef * (float(w @ g_raw @ coef) / dd) if dd > 0 else np.zeros_like(coef)
            lam_full[idx] = lam
            coef_full[idx] = coef
            self.last_solve = result
        self.last_weights = lam_full
        return torch.from_numpy(coef_full).to(self.momenta.dtype) @ self.momenta

    def server_update(self, params: list[Tensor], updates: list[ClientUpdate]) -> list[Tensor]:
        """Alg. 1, l. 10-12: update the cohort's momenta, solve for λ, step ``params`` (x_t, in place) to x_{t+1}.

        Returns the applied update as a pseudo-gradient Δ_t = −d_t (x_{t+1} = x_t + η·Δ_t), one tensor per
        parameter; during warm-up the FedAvg pseudo-gradient.

        Raises:
            ValueError: ``updates`` empty, N unknown, bad or repeated client ids, or a table of the wrong shape.
        """
        if not updates:
            raise ValueError("Cannot aggregate an empty round: no client updates.")
        with torch.no_grad():
            self._ensure_table(params)
            ids = self._check_ids(updates)
            self._update_momenta(ids, updates)
            self.num_steps += 1
            if self.fedavg_warmup and not bool(self.seen.all()):
                self.last_weights, self.last_solve, self._last_diversity = None, None, None
                pseudo_gradient = self.aggregate(updates)
            else:
                flat = -self._direction()
                pseudo_gradient, offset = [], 0
                for p in params:
                    chunk = flat[offset:offset + p.numel()].view(p.shape)
                    pseudo_gradient.append(chunk.to(device=p.device, dtype=p.dtype))
                    offset += p.numel()
            torch._foreach_add_(params, pseudo_gradient, alpha=self.lr)
        return pseudo_gradient

    def step(self, params: list[Tensor], pseudo_gradient: list[Tensor]) -> None:  # pragma: no cover - unused
        raise RuntimeError("FedAWARE overrides server_update; step() is not used.")

    def gradient_diversity(self, updates: list[ClientUpdate], pseudo_gradient: list[Tensor]) -> float:
        """√(Σλ_i‖v_i‖² / ‖Σλ_i v_i‖²) (Eq. 3/6: the square root) with FedAWARE's λ and the vectors v_i it was solved on (unit momenta under
        ``normalize``, else the momenta); ``nan`` when the combination is zero. In warm-up rounds, the base
        class's diversity of the round's updates."""
        if self._last_diversity is None:
            return super().gradient_diversity(updates, pseudo_gradient)
        return self._last_diversity

    @property
    def warming_up(self) -> bool:
        """Whether the next round would still be a FedAvg warm-up round."""
        return self.fedavg_warmup and (self.seen is None or not bool(self.seen.all()))

    # ------------------------------------------------------------------ logging
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.last_solve is None or self.last_weights is None:
            return
        metrics = {
            "fedaware_support": float((self.last_weights > 0).sum()),
            "fedaware_fw_iters": float(self.last_solve.num_iters),
            "fedaware_min_norm_sq": float(self.last_solve.value),
        }
        for name, value in metrics.items():
            pl_module.log(name, value, on_step=False, on_epoch=True, batch_size=1)

    # ------------------------------------------------------------------ checkpointing
    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            lr=self.lr, alpha=self.alpha, alpha_convention=self.alpha_convention, normalize=self.normalize,
            projection=self.projection, weighting=self.weighting,
        )

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["fedaware"] = {  # m_i and the seen mask are in state["client_state"] (the base class)
            "num_clients": self.num_clients,
            "client_num_samples": None if self.client_num_samples is None else self.client_num_samples.clone(),
            "gram": None if self.gram is None else self.gram.clone(),
        }
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the momentum table and seen mask (``"client_state"``; from ``"fedaware"``'s ``momenta``/``seen``
        in checkpoints written before the client-state table), sample counts and Gram matrix.

        Raises:
            ValueError: the checkpoint's N differs from the one already known.
        """
        super().load_state_dict(state_dict)
        saved = state_dict.get("fedaware", {})
        if "client_state" not in state_dict:  # the format before ClientStateTable
            momenta = saved.get("momenta")
            self.client_state = None
            if momenta is not None:
                n, d = momenta.shape
                self.client_state = ClientStateTable.from_state_dict(
                    {"num_clients": n, "dim": d, "dense": True, "rows": momenta, "present": saved.get("seen")}
                )
        n = saved.get("num_clients")
        if n is not None:
            if self.num_clients is not None and int(n) != self.num_clients:
                raise ValueError(
                    f"The checkpoint's FedAWARE state is for {n} clients, but this run has {self.num_clients}."
                )
            self.num_clients = int(n)
        for name in ("client_num_samples", "gram"):
            value = saved.get(name)
            setattr(self, name, None if value is None else value.detach().cpu().clone())
        self.last_weights, self.last_solve, self._last_diversity = None, None, None

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, alpha={self.alpha}, alpha_convention={self.alpha_convention!r}, "
            f"normalize={self.normalize}, fedavg_warmup={self.fedavg_warmup}, projection={self.projection}, "
            f"solver={self.solver!r}"
        )
