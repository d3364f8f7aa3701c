"""FedAWARE's server half: per-client server momenta aggregated with min-norm (gradient-diversity-maximising)
weights (Zeng et al., *Tackling Hybrid Heterogeneity on Federated Optimization via Gradient Diversity Maximization*,
ICML 2024, Algorithm 1, l. 10-11), with the checks of its options. FedAWARE has no client half: composed with the
SGD rule the stage is :class:`~lightning_fed.callbacks.FedAWARE`, which only fixes that composition and its defaults.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_fed.checks import check_int
from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, WeightedMean
from lightning_fed.server.checks import WEIGHTINGS
from lightning_fed.server.client_state import ClientStateTable
from lightning_fed.server.min_norm import SOLVERS, MinNormReport, min_norm_active_set, min_norm_frank_wolfe

__all__ = ["FedAWAREMinNorm", "check_options", "fedaware_state_bytes", "physical_memory_bytes", "public_code_pairing"]

#: Allowed values of ``alpha_convention``.
CONVENTIONS = ("paper", "code")
#: Allowed values of ``pairing``: ``"client_id"`` (Alg. 1) or ``"public_code"`` (its bug, see
#: :func:`public_code_pairing`).
PAIRINGS = ("client_id", "public_code")


def physical_memory_bytes() -> Optional[int]:
    """This machine's physical memory in bytes (``os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")``),
    ``None`` where the platform does not report it (then ``max_state_bytes="auto"`` sets no limit)."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return int(pages) * int(page_size) if pages > 0 and page_size > 0 else None


def fedaware_state_bytes(num_clients: int, dim: int, dtype: torch.dtype = torch.float32) -> dict[str, int]:
    """The bytes of each per-client table FedAWARE holds for N = ``num_clients`` clients and d = ``dim``
    parameters of ``dtype`` (the deltas' promoted dtype): the momenta ``[N, d]``, the Gram matrix ``[N, N]``
    float64, |D_i| ``[N]`` int64 and the seen mask ``[N]`` bool, keyed by a label naming each.

    Example: 100,000 clients of a 582,026-parameter float32 CNN (FedAWARE's Fashion-MNIST model)::

        >>> sizes = fedaware_state_bytes(100_000, 582_026)
        >>> [f"{name}: {size / 2**30:.1f} GiB" for name, size in sizes.items()]  # doctest: +NORMALIZE_WHITESPACE
        ['momenta [N, d] float32: 216.8 GiB', 'Gram matrix [N, N] float64: 74.5 GiB',
         '|D_i| [N] int64: 0.0 GiB', 'seen mask [N] bool: 0.0 GiB']
    """
    n, d = int(num_clients), int(dim)
    item = torch.empty((), dtype=dtype).element_size()
    return {
        f"momenta [N, d] {str(dtype).removeprefix('torch.')}": n * d * item,
        "Gram matrix [N, N] float64": n * n * 8,
        "|D_i| [N] int64": n * 8,
        "seen mask [N] bool": n,
    }


def _format_bytes(num: int) -> str:
    """``num`` bytes in GiB (two decimals) from 1 GiB, else in MiB from 0.01 MiB, else in bytes."""
    for unit, scale, least in (("GiB", 2**30, 2**30), ("MiB", 2**20, 2**20 / 100)):
        if num >= least:
            return f"{num / scale:,.2f} {unit}"
    return f"{num:,} B"


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


def check_options(
    *,
    alpha: Any,
    normalize: Any,
    alpha_convention: Any,
    fedavg_warmup: Any,
    projection: Any,
    solver: Any,
    fw_max_iter: Any,
    fw_tol: Any,
    fw_away_steps: Any,
    weighting: Any,
    num_clients: Any,
    warmup_rounds: Any,
    pairing: Any,
    max_state_bytes: Any,
) -> None:
    """Refuse FedAWARE options outside their allowed values (:class:`FedAWAREMinNorm`'s arguments; ``fw_*`` as
    given, ``None`` for not given).

    Raises:
        ValueError: ``alpha`` outside its convention's range, an unknown ``alpha_convention``, ``weighting``,
            ``solver`` or ``pairing``, ``fw_max_iter`` < 1, ``fw_tol`` negative or not finite, an ``fw_*`` option
            given with a solver other than ``"frank_wolfe"``, ``num_clients`` not a positive integer, a non-boolean
            flag, ``warmup_rounds`` not an integer ≥ 0 or given with ``fedavg_warmup=True``, or ``max_state_bytes``
            not ``"auto"``, an integer ≥ 1 or ``None``; each naming the argument and what is allowed.

    Example:
        >>> FedAWAREMinNorm(pairing="sorted")
        Traceback (most recent call last):
        ...
        ValueError: `pairing` must be one of ('client_id', 'public_code'), got 'sorted'.
    """
    if max_state_bytes is not None and max_state_bytes != "auto" and (
        isinstance(max_state_bytes, bool) or not isinstance(max_state_bytes, int) or max_state_bytes < 1
    ):
        raise ValueError(
            "`max_state_bytes` must be 'auto', an integer >= 1 (bytes) or None (no limit), "
            f"got {max_state_bytes!r}."
        )
    check_int("warmup_rounds", warmup_rounds, 0, optional=True)
    if warmup_rounds is not None and fedavg_warmup is True:
        raise ValueError(
            "`warmup_rounds` and `fedavg_warmup=True` are two ways to set the FedAvg warm-up: give one "
            f"(got warmup_rounds={warmup_rounds!r}, fedavg_warmup=True)."
        )
    if pairing not in PAIRINGS:
        raise ValueError(f"`pairing` must be one of {PAIRINGS}, got {pairing!r}.")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"`weighting` must be one of {WEIGHTINGS}, got {weighting!r}.")
    if alpha_convention not in CONVENTIONS:
        raise ValueError(f"`alpha_convention` must be one of {CONVENTIONS}, got {alpha_convention!r}.")
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
    for name, flag in (
        ("normalize", normalize), ("fedavg_warmup", fedavg_warmup), ("projection", projection),
        ("fw_away_steps", False if fw_away_steps is None else fw_away_steps),
    ):
        if not isinstance(flag, bool):
            raise ValueError(f"`{name}` must be a bool, got {flag!r}.")
    check_int("fw_max_iter", fw_max_iter, 1, optional=True)
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
    check_int("num_clients", num_clients, 1, optional=True)


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
    the same. The options are those of :class:`~lightning_fed.callbacks.FedAWARE`, checked here
    (:func:`check_options`).

    Diagnostics of the round are :meth:`apply`'s third result, a :class:`~lightning_fed.server.min_norm.MinNormReport`
    (collected into the server optimizer's ``round_report``): λ over all N clients (float64, ``None`` in a warm-up
    round), the solver's :class:`~lightning_fed.server.min_norm.MinNormResult` (``None`` when no momentum is usable)
    and √(Σλ_i‖v_i‖² / ‖Σλ_i v_i‖²) (Eq. 3/6; ``None`` in a warm-up round, ``nan`` for a zero combination).

    Args:
        alpha, alpha_convention, normalize, fedavg_warmup, projection, solver, fw_max_iter, fw_tol, fw_away_steps,
            warmup_rounds, pairing: as :class:`~lightning_fed.callbacks.FedAWARE`; ``fw_*`` left at ``None`` mean
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
