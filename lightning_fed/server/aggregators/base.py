"""The aggregator interface: stages over typed states, and the chain that runs them.

Three kinds of stage, in this order in a chain (:func:`check_chain`):

* ``"transform"`` — per-client updates → per-client updates (clip each Δ_i, simulate attackers, …);
* ``"reduce"`` — exactly one: per-client updates → the pseudo-gradient Δ_t (weighted mean, median, Krum, …);
* ``"delta"`` — Δ_t → Δ_t (add DP noise, …).

Each stage is a pure update ``apply(x, state, info) -> (x', state')`` over one ``NamedTuple`` state of tensors
(the optax model: ``optax/_src/transform.py``), so the chain's state is a tuple of the stages' states and is
checkpointed by the server optimizer that owns the chain. A stage with diagnostics of the round (FedAWARE's and
FedMGDA+'s weights λ, the solver's result) returns them as a third element, ``(x', state', report)``: the chain
collects them into the round's :class:`RoundReport`, so no stage keeps per-round values in attributes.
"""

from __future__ import annotations

import abc
from typing import Any, NamedTuple, Optional, Sequence

import torch
from torch import Tensor

from lightning_fed.tensor_reuse import Workspace

#: The stage kinds, in the order a chain runs them.
KINDS = ("transform", "reduce", "delta")


class RoundInfo(NamedTuple):
    """What a stage may know about the round.

    Attributes:
        round_idx: The round t (0-based).
        seed: The data module's seed (stages that draw randomness seed it from ``(seed, round_idx, …)``).
        num_clients: N, the population size.
        clients_per_round: C, the expected cohort size (e.g. DP-FedAvg divides the noised sum by it).

    Example::

        >>> RoundInfo(round_idx=3, seed=0, num_clients=100, clients_per_round=10).clients_per_round
        10
    """

    round_idx: int
    seed: int
    num_clients: int
    clients_per_round: int


class ClientDeltas(NamedTuple):
    """The round's client updates as a stage sees them.

    Attributes:
        client_ids: The clients' ids, ``[K]``.
        deltas: ``deltas[i]`` is client i's contribution (one tensor per parameter, the module's shapes).
        counts: float64 ``[K]``, the unnormalised aggregation weights (sample counts, or 1 under uniform weighting).
        updates: The round's :class:`~lightning_fed.ClientUpdate` objects in the same order (``None`` when built by
            hand), for stages that need a client's local steps or learning rates (e.g. Nastya's normalisation).
        template: Tensors shaped like the parameters aggregated (x_t; ``None`` when built by hand), so that a
            reducer can return Δ_t of a round without any client (DP-FedAvg with Poisson cohorts: the noise alone).

    Example (two clients of one parameter each, holding 1 and 2 samples)::

        >>> import torch
        >>> x = ClientDeltas([4, 7], [[torch.tensor([1.0])], [torch.tensor([4.0])]], torch.tensor([1.0, 2.0], dtype=torch.float64))
        >>> x.client_ids, float(x.counts.sum())
        ([4, 7], 3.0)
    """

    client_ids: list[int]
    deltas: list[list[Tensor]]
    counts: Tensor
    updates: Optional[list[Any]] = None
    template: Optional[list[Tensor]] = None


class RoundReport(NamedTuple):
    """What one round's aggregation produced besides Δ_t (``ServerOptimizer.round_report``, replaced every round).

    Attributes:
        client_ids: The reporting clients' ids, ``[K]``, in the order of the round's updates.
        weights: float64 ``[K]``, the normalised aggregation weights w_i of the weighted mean (``client_weights``),
            computed once per round; FedAWARE's and FedMGDA+'s own λ are in their stage's report.
        stages: One report per stage of the aggregator chain (``None`` for a stage that reports nothing; empty
            without a chain).

    Example::

        >>> import torch
        >>> report = RoundReport([3, 5], torch.tensor([0.25, 0.75], dtype=torch.float64), ())
        >>> dict(zip(report.client_ids, report.weights.tolist()))
        {3: 0.25, 5: 0.75}
    """

    client_ids: list[int]
    weights: Tensor
    stages: tuple = ()


class EmptyState(NamedTuple):
    """The state of a stage that keeps none.
    Example::

        >>> EmptyState() == ()
        True
    """


class Stage(abc.ABC):
    """One aggregation stage: ``kind`` is ``"transform"``, ``"reduce"`` or ``"delta"`` (see the module doc).

    Subclasses implement :meth:`apply` and, if they keep state, :meth:`init_state` returning a ``NamedTuple`` of
    tensors (or Python numbers).

    Example (a delta stage that scales Δ_t and counts its calls in its typed state)::

        >>> from typing import NamedTuple
        >>> import torch
        >>> class Scale(Stage):
        ...     kind = "delta"
        ...     class State(NamedTuple):
        ...         calls: int
        ...     def __init__(self, factor):
        ...         self.factor = factor
        ...     def init_state(self, params, num_clients):
        ...         return self.State(0)
        ...     def apply(self, delta, state, info):
        ...         return [d * self.factor for d in delta], self.State(state.calls + 1)
        >>> chain = check_chain([WeightedMean(), Scale(0.5)])
        >>> x = ClientDeltas([0, 1], [[torch.tensor([1.0])], [torch.tensor([4.0])]], torch.tensor([1.0, 2.0], dtype=torch.float64))
        >>> states = chain_states(chain, [torch.zeros(1)], num_clients=2)
        >>> run_chain(chain, x, states, RoundInfo(0, 0, 2, 2))  # 0.5 · (1·1 + 2·4) / 3
        ([tensor([1.5000])], (EmptyState(), State(calls=1)))
    """

    kind: str = "reduce"
    #: Fields of the state a saved checkpoint must hold (not ``None``) after a server step, for a resume
    #: (``lightning_fed.migrations.required_state`` names them ``"aggregators.<i>.<field>"``); default none.
    required_fields: tuple = ()

    def init_state(self, params: list[Tensor], num_clients: int) -> NamedTuple:
        """The initial state for a model with parameters ``params`` and ``num_clients`` clients (default: none)."""
        return EmptyState()

    @abc.abstractmethod
    def apply(self, x: Any, state: NamedTuple, info: RoundInfo) -> tuple[Any, NamedTuple]:
        """``transform``: ClientDeltas → ClientDeltas; ``reduce``: ClientDeltas → list[Tensor] (Δ_t);
        ``delta``: list[Tensor] → list[Tensor]. Returns the result and the new state, and optionally a third item:
        the stage's report of the round (its diagnostics, collected into ``ServerOptimizer.round_report``)."""

    def client_counts(self, counts: Tensor, updates: Sequence[Any]) -> Tensor:
        """A ``"transform"`` stage whose change of the clients' weights depends only on the round's
        :class:`~lightning_fed.ClientUpdate` list (stateless, deterministic) returns the counts it leaves for the
        reducer, so that ``ServerOptimizer.client_weights`` reports the weights actually used (default: ``counts``
        unchanged)."""
        return counts

    def client_delta(self, delta: list[Tensor], update: Any) -> list[Tensor]:
        """Likewise for one client's contribution: what this stage makes of ``delta`` given only ``update``, used
        by ``ServerOptimizer.client_delta`` (hence ``round_gradient_diversity``); default ``delta`` unchanged.
        Stages with state or randomness (clipping, attacks) keep the default."""
        return delta

    def client_requirement(self, num_clients: int) -> Optional[str]:
        """``None`` when a round with ``num_clients`` = K reporting clients can go through this stage, else why not
        (one sentence naming the stage's argument, e.g. Krum's K > 2f + 2). The federated loop skips such a round
        like a round where no client reported (model and server state unchanged, the K reports counted in
        ``round_clients_dropped``, a warning); :meth:`check_cohort` refuses a cohort size for which every round
        would be skipped. Default: any K ≥ 1."""
        return None

    def check_setup(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """Called by the server optimizer's ``setup`` (Lightning's, after the data module's setup and before a
        checkpoint is restored): read what the stage takes from the run (e.g. FedAWARE's N from
        ``trainer.datamodule.num_clients``), raising ``ValueError`` when it disagrees with the stage's arguments.
        Default: nothing."""

    def check_fit(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """Called once at fit start (by the server optimizer's ``on_train_start``, before any round trains), after
        the client algorithms' checks: raise ``ValueError`` naming both parts when this stage cannot work with the
        run — e.g. FedDyn's server half without its client half, FedNova's reducer with clients that do not run its
        declared local solver. Default: nothing."""

    def check_round_start(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """Called at the start of every round (by the server optimizer's ``on_train_epoch_start``), before its clients
        train, with the round's client optimizers (learning rates as an LR scheduler set them for the round): raise
        ``ValueError`` naming the round when this stage cannot aggregate what the round's clients would send, e.g.
        FedNova's proximal α = γ·μ ≥ 1 once a scheduler raised γ. Default: nothing."""

    def prepare_round(self, server: Any, params: list[Tensor], updates: Sequence[Any]) -> None:
        """Called first when a round is aggregated (by the server optimizer's ``validate_round``), before any state
        changes, with x_t (``params``) and the round's updates: raise when the round cannot go through this stage
        (e.g. SCAFFOLD: N unknown, a client id outside [0, N), an update without Δc_i), and make or move the stage's
        state in ``server``'s chain state (SCAFFOLD's c, on the parameters' device). Default: nothing."""

    def round_metrics(self, report: Any) -> dict[str, float]:
        """The metrics the server optimizer logs at the end of a round from this stage's ``report`` of it (``None``
        in a round without a server step), name -> number (e.g. FedAWARE's ``fedaware_support``). Default: none."""
        return {}

    def check_cohort(self, clients_per_round: int) -> None:
        """Called once at fit start (by the server optimizer's ``on_train_start``, before any round trains) with C =
        ``clients_per_round``, the most clients a round can have.

        Raises:
            ValueError: no round of at most C reporting clients could go through the stage
                (:meth:`client_requirement` of C), naming the argument and ``clients_per_round``.
        Subclasses also warn here (once per fit) when a setting would do nothing in every round.
        """
        why = self.client_requirement(clients_per_round)
        if why is not None:
            raise ValueError(
                f"`clients_per_round`={clients_per_round} is too small for {type(self).__name__}: every round would "
                f"be skipped. {why}"
            )

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


def accumulation_dtype(t: Tensor) -> torch.dtype:
    """The dtype client updates are summed in: float64 for floating-point tensors (their own dtype on Apple MPS,
    which has no float64); a non-floating tensor keeps its dtype. The one rule for every weighted sum of updates
    (the weighted mean, DP's mean, the robust reducers, FedNova's and FedMGDA+'s sums).

    Example::

        >>> accumulation_dtype(torch.zeros(1)), accumulation_dtype(torch.zeros(1, dtype=torch.int64))
        (torch.float64, torch.int64)
    """
    if not t.is_floating_point() or t.dtype == torch.float64 or t.device.type == "mps":
        return t.dtype
    return torch.float64


def weighted_sum(deltas: Sequence[Sequence[Tensor]], coefficients: Sequence[float], accumulate: bool = True,
                 skip_zero: bool = False, out: Optional[list[Tensor]] = None,
                 scratch: Optional[list[Tensor]] = None) -> list[Tensor]:
    """Σ_i a_i·Δ_i, one tensor per parameter: the one weighted sum of client updates (the weighted mean, DP's
    mean, the robust reducers' means, FedNova's normalised sum, FedMGDA+'s min-norm combination, FedDyn's Σ_k Δ_k,
    Fed-LAMB's moment averages; SCAFFOLD's c ← c + Δc_i/N stays a running in-place update of its state, Alg. 1 l. 17).

    The first client's tensors times a_0, in :func:`accumulation_dtype` (``accumulate=True``, the default) or in
    their own dtype, then each other client's added with ``alpha=a_i`` (moved to the result's device if need be; a
    client with a_i = 0 skipped under ``skip_zero``), in client order — one rounding per addition, so a caller's
    numbers stay those of its own loop. Not rounded back: the caller divides and rounds.

    Args:
        deltas: One list of tensors per client (the same shapes), at least one client.
        coefficients: a_i, one float per client.
        accumulate: Sum in the accumulation dtype (default ``True``); ``False``: in the first client's dtypes.
        skip_zero: Leave out clients with a_i = 0 after the first (default ``False``; adding 0·Δ_i can turn a −0.0
            into 0.0, so a caller that skipped them keeps its bits).
        out: Tensors to hold the sum (the result's dtypes, shapes, strides; e.g. a
            :class:`~lightning_fed.tensor_reuse.Workspace`'s), returned; default new ones. The same numbers.
        scratch: Tensors of ``out``'s dtypes each client's Δ_i is copied into before it is added (the conversion
            ``add_`` would make in a new tensor for every client); default none. The same numbers.

    Example::

        >>> weighted_sum([[torch.tensor([1.0])], [torch.tensor([4.0])]], [1.0, 2.0])  # 1·1 + 2·4, in float64
        [tensor([9.], dtype=torch.float64)]
    """
    if out is None:
        result = [_times(d.to(accumulation_dtype(d)) if accumulate else d, d, coefficients[0]) for d in deltas[0]]
    else:  # (a copy then the product in place: d.to(dtype) · a_0 exactly)
        result = out
        torch._foreach_copy_(result, list(deltas[0]))
        torch._foreach_mul_(result, coefficients[0])
    for a, delta in zip(coefficients[1:], deltas[1:]):
        if skip_zero and a == 0.0:
            continue
        if scratch is not None:  # Δ_i in the sum's dtype (exact), then the same addition on equal operands
            torch._foreach_copy_(scratch, list(delta))
            torch._foreach_add_(result, scratch, alpha=a)
            continue
        torch._foreach_add_(result, [d if d.device == r.device else d.to(r.device) for d, r in zip(delta, result)],
                            alpha=a)
    return result


def _times(t: Tensor, d: Tensor, a: float) -> Tensor:
    """``t · a`` as a new tensor: in place when ``t`` is already a new tensor (``d.to(dtype)``'s copy; the same
    product, one model-sized block fewer), else ``torch.mul`` (``t`` is the client's own ``d``)."""
    return t.mul_(a) if t is not d else torch.mul(t, a)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a server state kept beside parameters of ``dtype`` and summed into over rounds (SCAFFOLD's c,
    FedDyn's h): float64 stays float64; every other floating dtype (float32, bf16, fp16) gets float32. The one rule
    for such states.

    Example::

        >>> state_dtype(torch.bfloat16), state_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


class WeightedMean(Stage):
    """Δ_t = Σ_i c_i Δ_i / Σ_j c_j, the sample-weighted mean of Reddi et al. 2021 (Alg. 1, l. 10; Sec. 4), summed
    in float64 and rounded once to the parameters' dtype — exactly what ``ServerOptimizer.aggregate`` computes.

    Example::

        >>> import torch
        >>> x = ClientDeltas([0, 1], [[torch.tensor([1.0])], [torch.tensor([4.0])]], torch.tensor([1.0, 2.0], dtype=torch.float64))
        >>> WeightedMean().apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))[0]  # (1·1 + 2·4) / 3
        [tensor([3.])]
    """

    kind = "reduce"

    def __init__(self) -> None:
        # the sums, the float64 copy of a client's Δ_i and the mean, reused from round to round on the CPU
        # (lightning_fed.tensor_reuse: freed each round, glibc's heap would hand them back and fault them in again)
        self._workspace = Workspace()

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple]:
        total = float(x.counts.sum())
        first = list(x.deltas[0])
        work = self.__dict__.get("_workspace") or Workspace()
        dtypes = [accumulation_dtype(d) for d in first]
        sums = work.take("sums", first, dtypes)
        converted = any(d.dtype != dtype for d, dtype in zip(first, dtypes))
        scratch = work.take("scratch", first, dtypes) if sums is not None and converted and len(x.deltas) > 1 \
            else None
        result = weighted_sum(x.deltas, x.counts.tolist(), out=sums, scratch=scratch)
        torch._foreach_div_(result, total)
        if not converted:  # (acc.to(d.dtype) would be acc itself: the sums are the mean)
            return result, state
        mean = work.take("mean", first) if sums is not None else None
        if mean is None:
            return [acc.to(d.dtype) for acc, d in zip(result, first)], state
        torch._foreach_copy_(mean, result)  # (rounded once to the parameters' dtype, as acc.to(d.dtype))
        return mean, state


def check_chain(stages: Sequence[Stage]) -> list[Stage]:
    """Validate a chain: stages of known kinds, in the order transform* → one reduce → delta*.

    Raises:
        TypeError: an entry is not a :class:`Stage`.
        ValueError: no reducer, several, or a stage out of order (the message names it).
    """
    stages = list(stages)
    for s in stages:
        if not isinstance(s, Stage):
            raise TypeError(f"`aggregators` must hold Stage objects (aggregators), got {type(s).__name__}.")
        if s.kind not in KINDS:
            raise ValueError(f"{type(s).__name__}.kind must be one of {KINDS}, got {s.kind!r}.")
    ranks = [KINDS.index(s.kind) for s in stages]
    if ranks.count(1) != 1:
        raise ValueError(
            f"`aggregators` needs exactly one reducer (kind 'reduce', e.g. WeightedMean, median); got "
            f"{ranks.count(1)} in {stages}."
        )
    for a, b, s in zip(ranks, ranks[1:], stages[1:]):
        if b < a:
            raise ValueError(
                f"`aggregators` must run client transforms, then one reducer, then delta transforms; {s!r} "
                f"(kind {s.kind!r}) comes too late."
            )
    return stages


def chain_states(stages: Sequence[Stage], params: list[Tensor], num_clients: int) -> tuple:
    """The chain's initial state: one state per stage."""
    return tuple(s.init_state(params, num_clients) for s in stages)


def run_chain(
    stages: Sequence[Stage], x: ClientDeltas, states: tuple, info: RoundInfo, reports: Optional[list] = None
) -> tuple[list[Tensor], tuple]:
    """Run the chain on the round's client deltas; returns Δ_t and the new states. With a ``reports`` list, each
    stage's report (the third element its ``apply`` returned, else ``None``) is appended to it, in chain order."""
    new_states = []
    value: Any = x
    for stage, state in zip(stages, states):
        value, state, *report = stage.apply(value, state, info)
        new_states.append(state)
        if reports is not None:
            reports.append(report[0] if report else None)
    return value, tuple(new_states)
