"""FedAWARE's server half: per-client server momenta aggregated with min-norm (gradient-diversity-maximising)
weights (Zeng et al., *Tackling Hybrid Heterogeneity on Federated Optimization via Gradient Diversity Maximization*,
ICML 2024, Algorithm 1, l. 10-11), with the checks of its options. FedAWARE has no client half: composed with the
SGD rule the stage is :class:`~lightning_fed.algorithms.fedaware.FedAWARE`, which only fixes that composition and its defaults.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, WeightedMean
from lightning_fed.server.client_state import ClientStateTable
from lightning_fed.server.min_norm import MinNormReport, min_norm_active_set, min_norm_frank_wolfe
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.server.checks import check_positive
from lightning_fed.server.fields import stage_mirror
from lightning_fed.server.rules.sgd import SGD
from lightning_fed.algorithms.fedaware_options import (  # noqa: F401  (re-exported: this module's API)
    CONVENTIONS,
    PAIRINGS,
    _format_bytes,
    check_options,
    fedaware_state_bytes,
    physical_memory_bytes,
)

__all__ = ["FedAWARE", "FedAWAREMinNorm", "check_options", "fedaware_state_bytes", "physical_memory_bytes", "public_code_pairing"]


def public_code_pairing(x: ClientDeltas) -> ClientDeltas:
    """The round as FedAWARE's public code pairs it (github.com/dunzeng/FedAWARE at eb60efc, read, not copied):
    ``x.deltas`` re-ordered so that the k-th update, in increasing client id, is paired with the k-th client of
    ``x.client_ids`` as listed (the cohort's selection order), while ``x.client_ids``, ``x.counts`` and
    ``x.updates`` stay as they are.

    The public code trains the cohort in increasing id order (its samplers return ``np.sort(sampled)``) but zips
    the resulting updates with the indices in the order ``np.random.choice`` drew them (``sampler.last_sampled``):
    each update goes into the momentum slot of another client, and the warm-up FedAvg's sample weights are
    permuted the same way. It is a bug, reproduced here only to regenerate the published curves; the paper's Alg. 1
    (and :class:`FedAWAREMinNorm`'s default ``pairing="client_id"``) pairs each update with its own client.

    Example: cohort drawn as [7, 2, 5] (updates a, b, c of clients 7, 2, 5): in id order the updates are b (2),
    c (5), a (7), and they land in the slots 7, 2, 5::

        >>> import torch
        >>> a, b, c = ([torch.tensor([float(v)])] for v in (7, 2, 5))
        >>> x = public_code_pairing(ClientDeltas([7, 2, 5], [a, b, c], torch.tensor([70.0, 20.0, 50.0])))
        >>> x.client_ids, [float(d[0]) for d in x.deltas], x.counts.tolist()
        ([7, 2, 5], [2.0, 5.0, 7.0], [70.0, 20.0, 50.0])
    """
    order = sorted(range(len(x.client_ids)), key=lambda i: int(x.client_ids[i]))
    return x._replace(deltas=[x.deltas[i] for i in order])


class FedAWAREMinNorm(Stage):
    """Reducer Δ_t = −d_t of FedAWARE (Zeng et al. 2024, Alg. 1, l. 10-11), with g_i = −Δ_i::

        m_i ← old_w·m_i + new_w·g_i   for the cohort i ∈ S_t (other clients' m_i unchanged; m_i = 0 unseen)
        λ   = argmin_{λ ∈ simplex} ‖Σ_i λ_i v_i‖²,   v_i = m_i/‖m_i‖ (``normalize``) or m_i
        d_t = Σ_i λ_i v_i   (or its ``projection``),   Δ_t = −d_t

    (old_w, new_w) = (α, 1−α) under ``alpha_convention="paper"``, (1−α, α) under ``"code"``. The momenta live in a
    dense :class:`~lightning_fed.server.client_state.ClientStateTable` ``[N, d]`` (CPU, the deltas' promoted
    dtype) held in the stage's :class:`State`, with each client's last |D_i| and the ``[N, N]`` float64 Gram
    matrix ⟨m_i, m_j⟩ kept up to date row by row (C·N·d multiply-adds per round); their size
    (:func:`fedaware_state_bytes`) is checked against ``max_state_bytes`` at fit start (:meth:`check_fit`) and
    before they are built. Clients with a zero momentum are
    left out of the min-norm problem (λ_i = 0). With ``fedavg_warmup`` the stage returns the weighted mean of the
    round's deltas (by ``ClientDeltas.counts``) until all N clients have been seen; the momenta are updated all
    the same. The options are those of :class:`~lightning_fed.algorithms.fedaware.FedAWARE`, checked here
    (:func:`check_options`).

    Diagnostics of the round are :meth:`apply`'s third result, a :class:`~lightning_fed.server.min_norm.MinNormReport`
    (collected into the server optimizer's ``round_report``): λ over all N clients (float64, ``None`` in a warm-up
    round), the solver's :class:`~lightning_fed.server.min_norm.MinNormResult` (``None`` when no momentum is usable)
    and √(Σλ_i‖v_i‖² / ‖Σλ_i v_i‖²) (Eq. 3/6; ``None`` in a warm-up round, ``nan`` for a zero combination).

    Args:
        alpha, alpha_convention, normalize, fedavg_warmup, projection, solver, fw_max_iter, fw_tol, fw_away_steps,
            warmup_rounds, pairing: as :class:`~lightning_fed.algorithms.fedaware.FedAWARE`; ``fw_*`` left at ``None`` mean
            1000, 1e-5 and ``False`` (:attr:`fw_max_iter`, :attr:`fw_tol`, :attr:`fw_away_steps` hold the values).
        weighting: ``"num_samples"`` or ``"uniform"``: the weights of the ``projection`` average.
        num_clients: N (``None``: must be set before the first round; FedAWARE reads it from the data module).
        max_state_bytes: the most bytes the per-client tables (:func:`fedaware_state_bytes`) may take:
            ``"auto"`` (default: half of :func:`physical_memory_bytes`), an int ≥ 1, or ``None`` (no limit).

    Raises:
        ValueError: at construction (:func:`check_options`): an option outside its allowed values, naming it. At
            fit start (:meth:`check_fit`) and before the tables are built (:meth:`apply`): the tables
            would exceed ``max_state_bytes`` (:meth:`check_state_size`); in :meth:`apply`: N unknown, client ids
            outside [0, N) or repeated, a momentum table of another shape, or (warm-up) all counts zero.

    Example: clients 0 and 1 of N = 2 with g_0 = [1, 0], g_1 = [0, 2], α = ½: m_i = ½·g_i, λ = (½, ½) on the unit
    momenta, Δ_1 = −½·([1, 0] + [0, 1])::

        >>> import torch
        >>> stage = FedAWAREMinNorm(num_clients=2)
        >>> x = ClientDeltas([0, 1], [[torch.tensor([-1.0, 0.0], dtype=torch.float64)],
        ...                          [torch.tensor([0.0, -2.0], dtype=torch.float64)]],
        ...                  torch.tensor([10.0, 10.0], dtype=torch.float64))
        >>> delta, state, report = stage.apply(x, stage.init_state(x.deltas[0], 2), RoundInfo(0, 0, 2, 2))
        >>> delta, report.weights, state.table.matrix
        ([tensor([-0.5000, -0.5000], dtype=torch.float64)], array([0.5, 0.5]), tensor([[0.5000, 0.0000],
                [0.0000, 1.0000]], dtype=torch.float64))
    """

    kind = "reduce"
    #: After a server step a checkpoint must hold the momentum table, |D_i| and the Gram matrix.
    required_fields = ("table", "client_num_samples", "gram")
    #: The momentum table is dense ([N, d], all rows at once for the Gram matrix): held in memory only; a server
    #: optimizer with ``client_state_store="disk"`` refuses it at fit start.
    dense_client_state = True
    #: The weighting counts matter only in a warm-up round's FedAvg, where :meth:`apply` refuses all-zero counts
    #: itself; the server optimizer does not refuse a zero-sample round before the chain.
    checks_zero_counts = True
    #: Δ_t is not the clients' weighted mean: ``round_gradient_diversity`` uses the raw updates' mean instead.
    shifts_mean = True

    class State(NamedTuple):
        """The momentum table m (``None`` until the first round), |D_i| int64 ``[N]`` and the Gram matrix
        float64 ``[N, N]``."""

        table: Optional[ClientStateTable] = None
        client_num_samples: Optional[Tensor] = None
        gram: Optional[Tensor] = None

        def replace(self, **fields: Any) -> "FedAWAREMinNorm.State":
            """A copy with ``fields`` changed (``NamedTuple._replace``)."""
            return self._replace(**fields)

    def __init__(
        self,
        alpha: float = 0.5,
        normalize: bool = True,
        alpha_convention: str = "paper",
        fedavg_warmup: bool = False,
        projection: bool = False,
        solver: str = "active_set",
        fw_max_iter: Optional[int] = None,
        fw_tol: Optional[float] = None,
        fw_away_steps: Optional[bool] = None,
        weighting: str = "num_samples",
        num_clients: Optional[int] = None,
        warmup_rounds: Optional[int] = None,
        pairing: str = "client_id",
        max_state_bytes: Union[int, str, None] = "auto",
    ) -> None:
        check_options(
            alpha=alpha, normalize=normalize, alpha_convention=alpha_convention, fedavg_warmup=fedavg_warmup,
            projection=projection, solver=solver, fw_max_iter=fw_max_iter, fw_tol=fw_tol, fw_away_steps=fw_away_steps,
            weighting=weighting, num_clients=num_clients, warmup_rounds=warmup_rounds, pairing=pairing,
            max_state_bytes=max_state_bytes,
        )
        fw_max_iter = 1000 if fw_max_iter is None else fw_max_iter
        fw_tol = 1e-5 if fw_tol is None else float(fw_tol)
        fw_away_steps = False if fw_away_steps is None else fw_away_steps
        self.max_state_bytes = max_state_bytes
        self.warmup_rounds = warmup_rounds
        self.pairing = pairing
        self.alpha = float(alpha)
        self.normalize = normalize
        self.alpha_convention = alpha_convention
        self.fedavg_warmup = fedavg_warmup
        self.projection = projection
        self.solver = solver
        self.fw_max_iter = fw_max_iter
        self.fw_tol = fw_tol
        self.fw_away_steps = fw_away_steps
        self.weighting = weighting
        self.num_clients = num_clients

    def init_state(self, params: list[Tensor], num_clients: int) -> "FedAWAREMinNorm.State":
        """An empty state; the table is built on the first :meth:`apply` (N = :attr:`num_clients`)."""
        return self.State()

    # ------------------------------------------------------------------ glue with the server optimizer
    def read_num_clients(self, datamodule: Any) -> None:
        """Take N from ``datamodule.num_clients`` (nothing when there is none).

        Raises:
            ValueError: it disagrees with the N already known (:attr:`num_clients`).
        """
        n = getattr(datamodule, "num_clients", None) if datamodule is not None else None
        if n is None:
            return
        n = int(n)
        if self.num_clients is not None and self.num_clients != n:
            raise ValueError(
                f"FedAWARE was built for num_clients={self.num_clients}, but the data module has {n} clients."
            )
        self.num_clients = n

    def check_setup(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """Read N from ``trainer.datamodule.num_clients`` (:meth:`read_num_clients`; called by the server
        optimizer's ``setup``, after the data module's, before a checkpoint is restored and compared with the run).

        Raises:
            ValueError: it disagrees with ``num_clients``.
        """
        self.read_num_clients(getattr(trainer, "datamodule", None))

    def warming_up(self, state: Optional["FedAWAREMinNorm.State"], num_steps: int) -> bool:
        """Whether the round after ``num_steps`` server steps is a FedAvg warm-up round, given the stage's
        ``state`` (``None`` before it exists): under ``warmup_rounds``, fewer steps than it; under
        ``fedavg_warmup``, not every client seen yet."""
        if self.warmup_rounds is not None:
            return num_steps < self.warmup_rounds
        table = None if state is None else state.table
        return self.fedavg_warmup and (table is None or not bool(table.present.all()))

    @staticmethod
    def round_metrics(report: Optional[MinNormReport]) -> dict[str, float]:
        """The round's logged metrics from its ``report`` (none in a warm-up round): ``fedaware_support``
        (clients with λ_i > 0), ``fedaware_fw_iters`` (the solver's iterations), ``fedaware_min_norm_sq``
        (‖Σλ_i v_i‖²) and ``fedaware_weighted_diversity``."""
        if report is None or report.solve is None or report.weights is None:
            return {}
        return {
            "fedaware_support": float((report.weights > 0).sum()),
            "fedaware_fw_iters": float(report.solve.num_iters),
            "fedaware_min_norm_sq": float(report.solve.value),
            "fedaware_weighted_diversity": float(report.diversity),
        }

    # ------------------------------------------------------------------ checks
    def check_num_clients(self) -> int:
        """N, or a ValueError saying how to give it."""
        if self.num_clients is None:
            raise ValueError(
                "FedAWARE needs the number of clients N: train through a FederatedTrainer with a "
                "FederatedDataModule (N is read from `datamodule.num_clients`) or pass `num_clients=`."
            )
        return self.num_clients

    def state_limit(self) -> Optional[int]:
        """``max_state_bytes`` in bytes: half of :func:`physical_memory_bytes` under ``"auto"`` (``None`` where the
        platform does not report it), the int as given, ``None`` for no limit."""
        if self.max_state_bytes == "auto":
            total = physical_memory_bytes()
            return None if total is None else total // 2
        return None if self.max_state_bytes is None else int(self.max_state_bytes)

    def check_state_size(self, num_clients: int, dim: int, dtype: torch.dtype, warn: bool = True) -> dict[str, int]:
        """The per-client tables' sizes (:func:`fedaware_state_bytes`) for N = ``num_clients``, d = ``dim`` and
        ``dtype``; refused above :meth:`state_limit`, warned about (``warn``) above half of it.

        Raises:
            ValueError: their sum exceeds the limit, naming FedAWARE, N, d, each table's size and the limit.
        """
        sizes = fedaware_state_bytes(num_clients, dim, dtype)
        total, limit = sum(sizes.values()), self.state_limit()
        if limit is None or 2 * total <= limit:
            return sizes
        tables = ", ".join(f"{name} {_format_bytes(size)}" for name, size in sizes.items())
        source = (" (`max_state_bytes='auto'`: half this machine's physical memory)" if self.max_state_bytes == "auto"
                  else "")
        what = (f"FedAWARE's per-client state for N={num_clients:,} clients and d={dim:,} parameters is "
                f"{_format_bytes(total)} ({tables}); `max_state_bytes` is {_format_bytes(limit)}{source}")
        if total > limit:
            raise ValueError(
                f"{what}. It is held in memory for the whole fit and saved in every checkpoint (a save copies it "
                "once more): use fewer clients or a smaller model, or raise `max_state_bytes` (None: no limit)."
            )
        if warn:
            rank_zero_warn(f"{what}: above half the limit; the whole of it is held in memory for the fit and saved "
                           "in every checkpoint (a save copies it once more).")
        return sizes

    def check_fit(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """At fit start, before any client trains: a momentum table loaded from a checkpoint must be for N
        (:attr:`num_clients`, else the data module's ``num_clients``); then :meth:`check_state_size` for N and the
        module's parameters (d and their promoted dtype); nothing when N is unknown (:meth:`apply` refuses that).

        Raises:
            ValueError: the loaded table is for another N; as :meth:`check_state_size`.
        """
        n = self.num_clients
        if n is None:
            n = getattr(getattr(trainer, "datamodule", None), "num_clients", None)
        fields = server.stage_state_fields(self) if server is not None else None
        table = None if fields is None else fields.get("table")
        if table is not None and n is not None and table.num_clients != int(n):
            raise ValueError(
                f"The checkpoint's FedAWARE state is for {table.num_clients} clients, but this run has {int(n)}."
            )
        runner = getattr(getattr(trainer, "fit_loop", None), "client_runner", None)  # d = |F|: federated only
        params = list(runner.params) if runner is not None and runner.params else list(pl_module.parameters())
        if n is None or not params:
            return
        dtype = functools.reduce(torch.promote_types, [p.dtype for p in params])
        self.check_state_size(int(n), sum(p.numel() for p in params), dtype)

    def prepare_round(self, server: Any, params: list[Tensor], updates: Any) -> None:
        """Before any state changes (the server optimizer's ``validate_round``): a non-empty round, N known and a
        momentum table (live, or loaded from a checkpoint) matching ``params``.

        Raises:
            ValueError: ``updates`` empty, N unknown, or a table of the wrong shape.
        """
        if not updates:
            raise ValueError("Cannot aggregate an empty round: no client updates.")
        self.check_num_clients()
        fields = server.stage_state_fields(self) or {}
        self.check_table(fields.get("table"), sum(p.numel() for p in params))

    def check_table(self, table: Optional[ClientStateTable], dim: int) -> None:
        """Raise ValueError if ``table`` (when built) is not ``[N, dim]``."""
        if table is not None and tuple(table.matrix.shape) != (self.num_clients, dim):
            raise ValueError(
                f"FedAWARE's momentum table has shape {tuple(table.matrix.shape)}, but the run has "
                f"{self.num_clients} clients and {dim} parameters."
            )

    def _check_ids(self, ids: list[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.num_clients]
        if bad:
            raise ValueError(f"Client ids {bad} are outside [0, {self.num_clients}) (num_clients={self.num_clients}).")
        if len(set(ids)) != len(ids):
            raise ValueError(f"A client appears more than once in the round: ids {ids}.")
        return ids

    # ------------------------------------------------------------------ Alg. 1, l. 10-11
    def _coefficients(self) -> tuple[float, float]:
        """(weight of the old momentum, weight of the new update)."""
        if self.alpha_convention == "paper":
            return self.alpha, 1.0 - self.alpha
        return 1.0 - self.alpha, self.alpha

    def _ensure_state(self, state: "FedAWAREMinNorm.State", deltas: list[Tensor]) -> "FedAWAREMinNorm.State":
        n = self.check_num_clients()
        d = sum(t.numel() for t in deltas)
        if state.table is not None:
            self.check_table(state.table, d)
            return state
        dtype = functools.reduce(torch.promote_types, [t.dtype for t in deltas])
        self.check_state_size(n, d, dtype, warn=False)  # refused by name, never a raw allocator error
        return self.State(ClientStateTable(n, d, dtype=dtype, dense=True), torch.zeros(n, dtype=torch.int64),
                          torch.zeros(n, n, dtype=torch.float64))

    def _update_momenta(self, state: "FedAWAREMinNorm.State", ids: list[int], x: ClientDeltas) -> None:
        table = state.table
        m = table.matrix
        rows = torch.tensor(ids, dtype=torch.long)
        # Δ_i flattened in module.parameters() order, straight into one CPU buffer [C, d].
        deltas = torch.empty(len(ids), m.shape[1], dtype=m.dtype)
        for i, delta in enumerate(x.deltas):
            offset = 0
            for t in delta:
                deltas[i, offset:offset + t.numel()].copy_(t.detach().reshape(-1))
                offset += t.numel()
        old_w, new_w = self._coefficients()
        # m_i ← old_w·m_i + new_w·g_i with g_i = x_t − x_i = −Δ_i.
        cohort = table.gather(ids).mul_(old_w).sub_(deltas, alpha=new_w)
        table.scatter(ids, cohort)  # marks the cohort seen
        sizes = ([int(u.num_samples) for u in x.updates] if x.updates is not None
                 else [int(c) for c in x.counts.tolist()])
        state.client_num_samples[rows] = torch.tensor(sizes, dtype=torch.int64)
        # Gram rows/columns of the changed momenta only: C·N·d work.
        new_rows = (cohort @ m.T).to(torch.float64)
        state.gram[rows, :] = new_rows
        state.gram[:, rows] = new_rows.T

    def _weighting_vector(self, state: "FedAWAREMinNorm.State", idx: np.ndarray) -> np.ndarray:
        if self.weighting == "uniform":
            w = np.ones(len(idx))
        else:
            w = state.client_num_samples.numpy()[idx].astype(np.float64)
            if w.sum() <= 0:
                w = np.ones(len(idx))
        return w / w.sum()

    def _direction(self, state: "FedAWAREMinNorm.State") -> tuple[Tensor, MinNormReport]:
        """d_t (flat, CPU, table dtype) and the round's :class:`~lightning_fed.server.min_norm.MinNormReport`."""
        n = self.num_clients
        gram = state.gram.numpy()
        diag = np.diag(gram)
        idx = np.flatnonzero(state.table.present.numpy() & (diag > 0))
        lam_full = np.zeros(n)
        coef_full = np.zeros(n)  # d_t = Σ_i coef_i·m_i
        solve, diversity = None, float("nan")
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
            diversity = math.sqrt(numer / denom) if denom > 0 else float("nan")  # Eq. 3/6: √ratio
            if self.projection:
                # d ← (⟨m̄, d⟩ / ‖d‖²)·d with m̄ = Σ w_i m_i (raw momenta), all from the Gram matrix.
                w = self._weighting_vector(state, idx)
                dd = float(coef @ g_raw @ coef)
                coef = coef * (float(w @ g_raw @ coef) / dd) if dd > 0 else np.zeros_like(coef)
            lam_full[idx] = lam
            coef_full[idx] = coef
            solve = result
        m = state.table.matrix
        return torch.from_numpy(coef_full).to(m.dtype) @ m, MinNormReport(lam_full, solve, diversity)

    def apply(
        self, x: ClientDeltas, state: "FedAWAREMinNorm.State", info: RoundInfo
    ) -> tuple[list[Tensor], "FedAWAREMinNorm.State", MinNormReport]:
        """Update the cohort's momenta and return Δ_t = −d_t, one tensor per parameter (the shapes, dtypes and
        devices of ``x.deltas[0]``; in a warm-up round the weighted mean of ``x.deltas`` by ``x.counts``), the new
        state and the round's :class:`~lightning_fed.server.min_norm.MinNormReport` (all ``None`` in warm-up)."""
        if not x.deltas:
            raise ValueError("Cannot aggregate an empty round: no client updates.")
        with torch.no_grad():
            state = self._ensure_state(state, x.deltas[0])
            ids = self._check_ids(x.client_ids)
            if self.pairing == "public_code":
                x = public_code_pairing(x)
            self._update_momenta(state, ids, x)
            warm = self.warmup_rounds is not None and info.round_idx < self.warmup_rounds
            if warm or (self.fedavg_warmup and not bool(state.table.present.all())):
                if float(x.counts.sum()) <= 0:
                    raise ValueError("All clients in the round have zero samples; cannot weight by `num_samples`.")
                return (*WeightedMean().apply(x, state, info), MinNormReport(None, None, None))
            direction, report = self._direction(state)
            flat = -direction
            delta, offset = [], 0
            for t in x.deltas[0]:
                chunk = flat[offset:offset + t.numel()].view(t.shape)
                delta.append(chunk.to(device=t.device, dtype=t.dtype))
                offset += t.numel()
        return delta, state, report


#: FedAWARE's settings that are its min-norm stage's (``FedAWARE.min_norm.<name>``), with their mirrors' docs.
_STAGE_SETTINGS = {
    "alpha": "Momentum coefficient α (float).",
    "normalize": "Solve on the unit-normalised momenta.",
    "alpha_convention": "``\"paper\"`` or ``\"code\"``.",
    "fedavg_warmup": "FedAvg until every client has been seen once.",
    "projection": "Keep the magnitude of the average momentum.",
    "solver": "The min-norm solver, ``\"active_set\"`` or ``\"frank_wolfe\"``.",
    "warmup_rounds": "FedAvg in rounds 0..warmup_rounds−1 (``None``: off).",
    "pairing": "``\"client_id\"`` (Alg. 1) or ``\"public_code\"`` (the public code's bug).",
    "fw_max_iter": "Frank–Wolfe iteration cap.",
    "fw_tol": "Frank–Wolfe L1 tolerance on λ.",
    "fw_away_steps": "Away-step Frank–Wolfe.",
    "num_clients": "N, the number of clients (from the constructor or the data module).",
    "max_state_bytes": "The limit on the per-client tables: ``\"auto\"``, bytes, or ``None`` (no limit).",
}
_STATE = "FedAWARE.stage_state_fields(FedAWARE.min_norm)"  # the live stage state, or the one loaded before it
_REPORT = "FedAWARE.stage_report(FedAWARE.min_norm)"  # the round report's MinNormReport


def _stage_attribute(name: str, doc: str) -> property:
    """A deprecated mirror of the min-norm stage's setting ``name`` (one source of truth: the stage)."""
    return stage_mirror(name, f"FedAWARE.min_norm.{name}", doc, lambda self: getattr(self.min_norm, name),
                        lambda self, v: setattr(self.min_norm, name, v))


def _state_fields(server: "FedAWARE") -> Optional[dict[str, Any]]:
    return server.stage_state_fields(server.min_norm)  # the live state, or the one loaded before it is re-made


def _set_state_field(server: "FedAWARE", name: str, value: Any) -> None:
    states = server.aggregator_state
    if states is None and value is None:
        return  # nothing to set (and a loaded state waits in the chain)
    state = FedAWAREMinNorm.State() if states is None else states[0]
    server.aggregator_state = (state.replace(**{name: value}),)


def _state_field(accessor: str, name: str, doc: str) -> property:
    """A deprecated mirror ``accessor`` of the field ``name`` of the min-norm stage's state (``None`` before it
    exists)."""
    return stage_mirror(accessor, f"{_STATE}[{name!r}]", doc,
                        lambda self: None if _state_fields(self) is None else _state_fields(self)[name],
                        lambda self, value: _set_state_field(self, name, value))


def _table_attribute(name: str, attribute: str, doc: str) -> property:
    """A deprecated mirror of the momentum table's ``attribute`` (``None`` until the first round)."""
    def get(self: "FedAWARE") -> Any:
        fields = _state_fields(self)
        table = None if fields is None else fields["table"]
        return None if table is None else getattr(table, attribute)

    return stage_mirror(name, f"{_STATE}['table'].{attribute}", doc, get)


def _report_field(name: str, field: str, doc: str) -> property:
    """A deprecated mirror of the field ``field`` of the min-norm stage's round report (all ``None`` without one)."""
    return stage_mirror(name, f"{_REPORT}.{field}", doc,
                        lambda self: getattr(self.stage_report(self.min_norm) or MinNormReport(None, None, None), field))


class FedAWARE(ServerOptimizer):
    """FedAWARE (Zeng et al., *Tackling Hybrid Heterogeneity on Federated Optimization via Gradient Diversity
    Maximization*, ICML 2024, Algorithm 1).

    A composition: ``ServerOptimizer(aggregators=[FedAWAREMinNorm(...)], rule=SGD(lr))`` — the reducer
    :class:`~lightning_fed.algorithms.fedaware.FedAWAREMinNorm` (momenta, min-norm weights, Δ_t = −d_t) followed by
    the server SGD rule x_{t+1} = x_t + η·Δ_t (:attr:`min_norm` is the stage; its state, in
    :attr:`aggregator_state`, holds the momentum table).

    The server keeps one momentum vector m_i ∈ R^d for **every** client i ∈ [N] (not only the cohort). In round t,
    with g_i = x_t − x_i = −Δ_i the update of a sampled client (Alg. 1, l. 8)::

        m_i ← α·m_i + (1−α)·g_i   if i ∈ S_t,   m_i unchanged otherwise        (l. 10; m_i = 0 before i is seen)
        λ   = argmin_{λ ∈ simplex} ‖Σ_i λ_i v_i‖²,   v_i = m_i / ‖m_i‖  (or m_i)  (l. 11, Eq. 8)
        d_t = Σ_i λ_i v_i
        x_{t+1} = x_t − η·d_t                                                   (l. 12)

    λ is the minimum-norm point of the convex hull of the v_i (the weights that maximise the surrogate gradient
    diversity, Eq. 6-8). By default it is solved exactly on the Gram matrix
    (``solver="active_set"``: :func:`~lightning_fed.server.min_norm.min_norm_active_set`, duality gap
    ≤ 1e-9·max_i ‖v_i‖², i.e. ≤ 1e-9 on the unit momenta). ``solver="frank_wolfe"`` is the public code's
    Frank–Wolfe with exact line search (:func:`~lightning_fed.server.min_norm.min_norm_frank_wolfe`, started at
    the best pair, stopped when the L1 change of λ is below ``fw_tol`` or after ``fw_max_iter`` iterations), the
    default before; it can stop at its cap well short of the optimum (plain Frank–Wolfe zig-zags when the optimum
    is inside a face: with 6 clients the direction can stay ~4 % off after 1,000 iterations). Either solver emits
    a :class:`~lightning_fed.server.min_norm.MinNormConvergenceWarning` when it stops short.

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
      The public code's cohorts first sweep every client once (``cohort_sampling="sweep_then_uniform"``), so
      there the warm-up is the first ⌈N/C⌉−1 rounds (rounds 1–9 with 10 of 100 clients per round). Under uniform
      cohorts (``"fixed_size"``) it lasts until the last client is first drawn, about 50 rounds for 10 of 100
      (coupon collector: N·H_N/C).
    * ``warmup_rounds`` (default ``None``: off): FedAvg, as under ``fedavg_warmup``, in the first
      ``warmup_rounds`` rounds (round indices 0..warmup_rounds−1), whatever has been seen; the momenta are updated
      all the same. Not with ``fedavg_warmup=True``. With ``cohort_sampling="sweep_then_uniform"`` (the public
      code's start-up: ⌈N/C⌉ rounds that visit every client once) ``fedavg_warmup=True`` already ends exactly where
      the public code's warm-up ends: FedAvg in the first ⌈N/C⌉−1 rounds (rounds 1–9 of 100 clients, 10 per
      round), FedAWARE from the round that completes the sweep.
    * ``pairing`` (default ``"client_id"``: each update goes into its own client's momentum slot, Alg. 1).
      ``"public_code"`` reproduces a bug of the public code (github.com/dunzeng/FedAWARE at eb60efc, read, not
      copied): it trains the cohort in increasing client id (``utils.py``, the samplers return
      ``np.sort(sampled)``) but zips the updates with the client indices in the order ``np.random.choice`` drew
      them (``sampler.last_sampled``; ``fedaware.py``, ``global_update``), so the k-th update in id order lands in
      the slot of the k-th client *as drawn* — another client's slot, whenever the draw was not already sorted —
      and the warm-up FedAvg's sample weights are permuted the same way
      (:func:`~lightning_fed.algorithms.fedaware.public_code_pairing`). Under the federated loop the
      round's updates arrive in the cohort's selection order, which plays the part of the draw order. Only to
      regenerate the published curves and measure the difference: it is never the default and not the method.
      Mixing several clients' updates in each slot lengthens the min-norm direction (about 3× in ‖d_t‖² on
      Fashion-MNIST), hence the steps.
    * ``projection`` (default ``False``): replace d_t by the projection of the ``weighting``-weighted average of
      the (raw) momenta m̄ = Σ_i w_i m_i onto d_t, i.e. d_t ← (⟨m̄, d_t⟩ / ‖d_t‖²)·d_t: the FedAWARE direction
      with the magnitude of the average update (the code's ``-projection``). A zero d_t gives a zero step.

    Clients never seen yet (m_i = 0) — and any client whose momentum is exactly zero (e.g. it took no local
    step on its first visit) — are left out of the min-norm problem: a zero vector in the hull would make the
    min-norm point 0 and stop training; their λ_i is reported as 0. The public code instead waits, through
    ``fedavg_warmup``, until no momentum is zero.

    Memory: the momentum table (the stage state's ``table``, a dense
    :class:`~lightning_fed.server.client_state.ClientStateTable`) is an ``[N, d]`` tensor on **CPU** in the parameters' (promoted) dtype, plus
    an ``[N, N]`` float64 Gram matrix kept up to date row by row (C·N·d multiply-adds per round for a cohort of
    C), |D_i| (int64 ``[N]``) and the seen mask (bool ``[N]``)
    (:func:`~lightning_fed.algorithms.fedaware.fedaware_state_bytes`). E.g. 100 clients × 582,026
    parameters (the Fashion-MNIST CNN) × 4 B = 233 MB; 715 Shakespeare clients × 822,570 parameters × 4 B =
    2.35 GB; 100,000 clients: a 74.5 GiB Gram matrix whatever the model. All of it is in :meth:`state_dict`, hence
    in every checkpoint (a save copies the tables once more). Their sum is computed at fit start (in the stage's
    :meth:`~lightning_fed.algorithms.FedAWAREMinNorm.check_fit`, before any client trains, from N and the module's parameters) and **refused** with a
    ``ValueError`` naming N, d, each table's size and the limit when it exceeds ``max_state_bytes``, warned about
    above half of it. The default ``"auto"`` is half the machine's physical memory (``os.sysconf``), so that the
    tables and the copy a checkpoint save makes of them fit in RAM; a fixed default would refuse runs a large
    server holds easily or let a small one fail at its first round. The min-norm solve also makes up to three
    temporary float64 copies of the seen clients' Gram block a round, which the warning leaves room for.

    N is read from ``trainer.datamodule.num_clients`` at set-up (the stage's ``check_setup``; the round's checks are
    its ``prepare_round``, its metrics its ``round_metrics``: this class only fixes the parts); pass ``num_clients`` to use
    :meth:`server_update` without a trainer (it must then agree with the data module).

    After each round, the min-norm stage's report (``stage_report(min_norm)``, a
    :class:`~lightning_fed.server.min_norm.MinNormReport`): ``weights`` (λ over all N clients, ``None`` during
    warm-up), ``solve`` (the solver's :class:`~lightning_fed.server.min_norm.MinNormResult`) and ``diversity``; in
    the logged metrics,
    ``fedaware_support`` (number of clients with λ_i > 0), ``fedaware_fw_iters`` (the solver's iterations, whichever
    solver), ``fedaware_min_norm_sq`` (‖Σλ_i v_i‖²) and ``fedaware_weighted_diversity``
    (the report's ``diversity``: √(Σλ_i‖v_i‖² / ‖Σλ_i v_i‖²), Eq. 6, with FedAWARE's λ and the vectors it was
    solved on, so 1/‖d_t‖ under ``normalize``). ``round_gradient_diversity`` (:meth:`gradient_diversity`) is, as
    for every server optimizer, the diversity of the round's raw client updates (Def. 3.1), warm-up or not.

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
        warmup_rounds: FedAvg in the first this many rounds (int ≥ 0, default ``None``: off; see above).
        pairing: ``"client_id"`` (default, Alg. 1) or ``"public_code"`` (the public code's update-to-slot pairing,
            a bug; see above).
        max_state_bytes: The most bytes the per-client tables (momenta, Gram matrix, |D_i|, seen mask) may take:
            ``"auto"`` (default: half the machine's physical memory; no limit where the platform does not report
            it), an integer ≥ 1, or ``None`` (no limit). Checked at fit start (see Memory above); a warning above
            half of it.

    Raises:
        ValueError: ``lr`` not a finite number > 0, ``alpha`` outside its convention's range, an unknown
            ``alpha_convention``, ``weighting`` or ``solver``, ``fw_max_iter`` < 1, ``fw_tol`` negative or not
            finite, an ``fw_*`` option given with ``solver="active_set"``,
            ``num_clients`` not a positive integer, a non-boolean flag, ``warmup_rounds`` not an integer ≥ 0 or
            given with ``fedavg_warmup=True``, an unknown ``pairing``, or ``max_state_bytes`` not ``"auto"``, an
            integer ≥ 1 or ``None``. At fit start: the per-client tables would exceed ``max_state_bytes``. At run
            time: no N known, client ids outside [0, N) or repeated within a round, or an N that disagrees with the
            data module / a checkpoint.

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
        >>> opt.stage_report(opt.min_norm).weights, params  # x_1 = x_0 − η·d_1 (λ: the min-norm stage's report)
        (array([0.5, 0.5]), [tensor([-0.5000, -0.5000], dtype=torch.float64)])
        >>> raw = FedAWARE(lr=1.0, num_clients=2, normalize=False)
        >>> params = [torch.zeros(2, dtype=torch.float64)]
        >>> _ = raw.server_update(params, updates)
        >>> raw.stage_report(raw.min_norm).weights.round(6), params  # d_1 = 0.8·[0.5, 0] + 0.2·[0, 1]
        (array([0.8, 0.2]), [tensor([-0.4000, -0.2000], dtype=torch.float64)])
        >>> FedAWARE(alpha=1.0)
        Traceback (most recent call last):
        ...
        ValueError: `alpha` must lie in [0, 1) with alpha_convention='paper' (weight of the old momentum), got 1.0.
    """

    state_key_fields = ("lr", "alpha", "alpha_convention", "normalize", "projection", "weighting")
    repr_fields = ("lr", "weighting", "alpha", "alpha_convention", "normalize", "fedavg_warmup", "projection", "solver",
                   "warmup_rounds", "pairing")
    repr_hidden = {"warmup_rounds": None, "pairing": "client_id"}
    #: Settings read on the min-norm stage (state_key, repr, the run record, HParams): ``server/fields.py``.
    setting_paths = {name: f"min_norm.{name}" for name in _STAGE_SETTINGS}

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
        warmup_rounds: Optional[int] = None,
        pairing: str = "client_id",
        max_state_bytes: Union[int, str, None] = "auto",
    ) -> None:
        lr = check_positive("lr", lr)
        #: The reducer stage (:class:`~lightning_fed.algorithms.fedaware.FedAWAREMinNorm`): momenta and min-norm λ.
        self.min_norm = FedAWAREMinNorm(
            alpha=alpha, normalize=normalize, alpha_convention=alpha_convention, fedavg_warmup=fedavg_warmup,
            projection=projection, solver=solver, fw_max_iter=fw_max_iter, fw_tol=fw_tol, fw_away_steps=fw_away_steps,
            weighting=weighting, num_clients=num_clients, warmup_rounds=warmup_rounds, pairing=pairing,
            max_state_bytes=max_state_bytes,
        )
        super().__init__(weighting=weighting, aggregators=[self.min_norm], rule=SGD(lr))
        self._own_aggregators = [self.min_norm]  # its own chain: another one is refused at fit start

    client_state = _state_field(
        "client_state", "table", "m_i: the dense :class:`~lightning_fed.server.client_state.ClientStateTable` ``[N, d]`` (``None`` "
        "until the first round), held in the min-norm stage's state.")
    client_num_samples = _state_field("client_num_samples", "client_num_samples",
                                      "|D_i| as last reported by client i, int64 ``[N]``.")
    gram = _state_field("gram", "gram", "⟨m_i, m_j⟩, float64 ``[N, N]``.")
    momenta = _table_attribute("momenta", "matrix", "m_i, ``[N, d]`` on CPU (``None`` until the first round).")
    seen = _table_attribute("seen", "present", "Whether client i has been seen, bool ``[N]`` (the rows written).")
    last_weights = _report_field(
        "last_weights", "weights", "λ of the last round over all N clients (float64), ``None`` in a warm-up round.")
    last_solve = _report_field(
        "last_solve", "solve", "The last round's solver result (``None`` in a warm-up round or with no usable momentum).")
    last_weighted_diversity = _report_field(
        "last_weighted_diversity", "diversity",
        "FedAWARE's surrogate diversity of the last round, √(Σλ_i‖v_i‖² / ‖Σλ_i v_i‖²) (Eq. 6, the square root) with "
        "its min-norm λ and the vectors v_i it was solved on; logged as ``fedaware_weighted_diversity``.")
    warming_up = stage_mirror(
        "warming_up", "FedAWARE.min_norm.warming_up(state, FedAWARE.num_steps)",
        "Whether the next round would still be a FedAvg warm-up round.",
        lambda self: self.min_norm.warming_up(None if self.aggregator_state is None else self.aggregator_state[0],
                                              self.num_steps))


for _name, _doc in _STAGE_SETTINGS.items():  # FedAWARE.alpha, ...: deprecated mirrors of FedAWARE.min_norm.<name>
    setattr(FedAWARE, _name, _stage_attribute(_name, _doc))
del _name, _doc
