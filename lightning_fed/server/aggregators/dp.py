"""Differential-privacy stages: DP-FedAvg (McMahan et al. 2018) and adaptive clipping (Andrew et al. 2021).

DP-FedAvg, Alg. 1 of McMahan et al. 2018 (*Learning Differentially Private Recurrent Language Models*), as a chain::

    ClipUpdates(S) → DPMean() → GaussianNoise(σ, S)     # Δ_t = (Σ_i clip(Δ_i, S) + N(0, σ²S²·I)) / C

* every client's Δ_i is clipped to global L2 norm S (:class:`ClipUpdates`, or :class:`AdaptiveClip` whose S
  tracks a quantile of the update norms, Andrew et al. 2021, Alg. 1);
* the clipped updates are summed with weight 1 each and divided by the *expected* cohort size C (:class:`DPMean`,
  the paper's fixed-denominator estimator f̃_f with every w_k = 1 — its ŵ cap at or below the smallest client, so
  qW = qN = C; uniform weights are what the paper's privacy analysis and TFF's DP-FedAvg use);
* N(0, (σS/C)²) is added to every coordinate of the mean (:class:`GaussianNoise`), i.e. N(0, σ²S²) to the sum.

The noise is drawn from a ``torch.Generator`` seeded by ``(RoundInfo.seed, RoundInfo.round_idx)``, on the
parameters' device, so a run repeats exactly, and every DDP rank, running the same chain on the same updates,
draws the same noise. ε is accounted by :class:`lightning_fed.server.privacy.PrivacyAccountant` (the ready-made
:class:`lightning_fed.callbacks.DPFedAvg` and friends wire it up and log ``privacy/epsilon``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from lightning_fed.server.aggregators.base import (
    ClientDeltas,
    EmptyState,
    RoundInfo,
    Stage,
    weighted_sum,
)

_NOISE_TAG = 0xD9F0
_COUNT_TAG = 0xC0C7


def round_generator(info: RoundInfo, tag: int, device: Any = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded by ``(info.seed, tag, info.round_idx)`` (through NumPy's
    ``SeedSequence``, so nearby seeds give unrelated streams)."""
    seed = int(np.random.SeedSequence([int(info.seed) & 0xFFFFFFFF, tag, int(info.round_idx)]).generate_state(
        1, np.uint64)[0] & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.Generator(device=device).manual_seed(seed)


def update_norms(deltas: list[list[Tensor]]) -> Tensor:
    """float64 ``[K]`` (on the CPU): the global L2 norm of every client's update over all its parameters (``[0]``
    for no client)."""
    if not deltas:
        return torch.zeros(0, dtype=torch.float64)
    return torch.stack([
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.double()) for t in d])).cpu() for d in deltas
    ])


def _clip(delta: list[Tensor], norm: float, clip_norm: float) -> list[Tensor]:
    """Δ·min(1, S/‖Δ‖); unchanged (the same tensors) when ‖Δ‖ ≤ S. Guarantees ‖result‖ ≤ S after rounding."""
    if norm <= clip_norm:
        return delta
    factor = clip_norm / norm
    for _ in range(8):  # rounding to the parameters' dtype can overshoot S by an ulp: shrink until it does not
        out = [t * factor for t in delta]
        if float(update_norms([out])[0]) <= clip_norm:
            return out
        factor *= 1.0 - 1e-6
    raise RuntimeError(f"could not clip an update of norm {norm} to {clip_norm}")  # pragma: no cover


def _check_clip_norm(value: Any, name: str = "clip_norm") -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value <= 0:
        raise ValueError(f"`{name}` must be a number > 0 (math.inf for no clipping), got {value!r}.")
    return float(value)


class ClipUpdates(Stage):
    """Clip every client's update to global L2 norm S: Δ_i ← Δ_i·min(1, S/‖Δ_i‖) (McMahan et al. 2018, Alg. 1,
    ``ClipFn`` with flat clipping), the norm over all parameters together, computed in float64.

    Args:
        clip_norm: S > 0 (``math.inf``: no clipping; the updates pass through unchanged).

    Raises:
        ValueError: ``clip_norm`` not a number > 0.

    Example: a client of norm 5 clipped to S = 1, one of norm 0.5 untouched::

        >>> import torch
        >>> x = ClientDeltas([0, 1], [[torch.tensor([3.0, 4.0])], [torch.tensor([0.3, 0.4])]], torch.ones(2, dtype=torch.float64))
        >>> ClipUpdates(1.0).apply(x, EmptyState(), RoundInfo(0, 0, 2, 2))[0].deltas
        [[tensor([0.6000, 0.8000])], [tensor([0.3000, 0.4000])]]
    """

    kind = "transform"

    def __init__(self, clip_norm: float) -> None:
        self.clip_norm = _check_clip_norm(clip_norm)

    def round_clip_norm(self) -> float:
        """S used in the current round."""
        return self.clip_norm

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[ClientDeltas, NamedTuple]:
        if math.isinf(self.clip_norm):
            return x, state
        norms = update_norms(x.deltas).tolist()
        return x._replace(deltas=[_clip(d, n, self.clip_norm) for d, n in zip(x.deltas, norms)]), state


class AdaptiveClipState(NamedTuple):
    """:class:`AdaptiveClip`'s state: ``clip_norm`` (float64 scalar), S for the next round.
    Example::

        >>> import torch
        >>> AdaptiveClipState(torch.tensor(0.5, dtype=torch.float64)).clip_norm.item()
        0.5
    """

    clip_norm: Tensor


class AdaptiveClip(Stage):
    """Clip every update to an S that tracks the γ-quantile of the update norms: Andrew et al. 2021
    (*Differentially Private Learning with Adaptive Clipping*), Alg. 1.

    In round t, with S = S_t (the state): each client's b_i = 1[‖Δ_i‖ ≤ S] and Δ_i is clipped to S as in
    :class:`ClipUpdates`; the server privatises the fraction unclipped,
    b̄ = (Σ_i (b_i − ½) + N(0, σ_b²)) / C + ½ (the centred sum of Sec. 3.1, sensitivity ½; with all C clients
    reporting it equals (Σ_i b_i + N(0, σ_b²)) / C of Alg. 1), and sets S_{t+1} = S_t·exp(−η_C(b̄ − γ)) (the
    geometric update, Alg. 1). C is the expected cohort size (``RoundInfo.clients_per_round``). The count noise is
    drawn from a CPU generator seeded by ``(seed, round_idx)``, independent of the update noise.

    Privacy: the count is a second Gaussian query. With update noise multiplier σ_Δ (the :class:`GaussianNoise`
    stage after the reducer), the pair is as private as one Gaussian of multiplier
    z = (σ_Δ⁻² + (2σ_b)⁻²)^(−½) (Thm. 1), so for a target z take σ_Δ = (z⁻² − (2σ_b)⁻²)^(−½)
    (:func:`update_noise_multiplier`; needs 2σ_b > z).

    Args:
        target_quantile: γ in [0, 1] (paper default 0.5, the median).
        learning_rate: η_C > 0 (paper default 0.2).
        initial_clip: S_0 > 0 (paper default 0.1).
        count_stddev: σ_b ≥ 0, the standard deviation of the noise on the clipped count (the paper suggests
            σ_b = C/20). ``None``: C/20, resolved every round from ``RoundInfo.clients_per_round``.

    Raises:
        ValueError: naming the argument out of range.

    Example: two clients of norm 5 and 0.5 with S_0 = 1, γ = 0.5, η_C = 0.2, no count noise: half are
    unclipped, so b̄ − γ = 0 and S stays 1::

        >>> import torch
        >>> x = ClientDeltas([0, 1], [[torch.tensor([3.0, 4.0])], [torch.tensor([0.3, 0.4])]], torch.ones(2, dtype=torch.float64))
        >>> stage = AdaptiveClip(0.5, 0.2, initial_clip=1.0, count_stddev=0.0)
        >>> out, state = stage.apply(x, stage.init_state([], 2), RoundInfo(0, 0, 2, 2))
        >>> out.deltas[0], float(state.clip_norm)
        ([tensor([0.6000, 0.8000])], 1.0)
    """

    kind = "transform"

    def __init__(self, target_quantile: float = 0.5, learning_rate: float = 0.2, initial_clip: float = 0.1,
                 count_stddev: Optional[float] = None) -> None:
        if isinstance(target_quantile, bool) or not isinstance(target_quantile, numbers.Real) \
                or not 0.0 <= target_quantile <= 1.0:
            raise ValueError(f"`target_quantile` must be a number in [0, 1], got {target_quantile!r}.")
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, numbers.Real) \
                or not math.isfinite(learning_rate) or learning_rate <= 0:
            raise ValueError(f"`learning_rate` (η_C) must be a finite number > 0, got {learning_rate!r}.")
        initial_clip = _check_clip_norm(initial_clip, "initial_clip")
        if math.isinf(initial_clip):
            raise ValueError("`initial_clip` must be finite.")
        if count_stddev is not None and (isinstance(count_stddev, bool) or not isinstance(count_stddev, numbers.Real)
                                         or not math.isfinite(count_stddev) or count_stddev < 0):
            raise ValueError(f"`count_stddev` (σ_b) must be a finite number >= 0 or None (C/20), got {count_stddev!r}.")
        self.target_quantile = float(target_quantile)
        self.learning_rate = float(learning_rate)
        self.initial_clip = initial_clip
        self.count_stddev = None if count_stddev is None else float(count_stddev)
        self._round_clip: float = initial_clip

    def resolved_count_stddev(self, clients_per_round: int) -> float:
        """σ_b: ``count_stddev``, or C/20 when it is ``None``."""
        return clients_per_round / 20.0 if self.count_stddev is None else self.count_stddev

    def init_state(self, params: list[Tensor], num_clients: int) -> AdaptiveClipState:
        return AdaptiveClipState(torch.tensor(self.initial_clip, dtype=torch.float64))

    def round_clip_norm(self) -> float:
        """S used in the current round (after :meth:`apply`), for the noise stage."""
        return self._round_clip

    def apply(self, x: ClientDeltas, state: AdaptiveClipState, info: RoundInfo) -> tuple[ClientDeltas, AdaptiveClipState]:
        clip = float(state.clip_norm)
        self._round_clip = clip
        norms = update_norms(x.deltas)
        unclipped = float((norms <= clip).double().sum())
        sigma_b = self.resolved_count_stddev(info.clients_per_round)
        noise = 0.0
        if sigma_b > 0:
            noise = sigma_b * float(torch.randn((), generator=round_generator(info, _COUNT_TAG), dtype=torch.float64))
        frac = (unclipped - 0.5 * len(x.deltas) + noise) / info.clients_per_round + 0.5
        new_clip = clip * math.exp(-self.learning_rate * (frac - self.target_quantile))
        deltas = [_clip(d, n, clip) for d, n in zip(x.deltas, norms.tolist())]
        return x._replace(deltas=deltas), AdaptiveClipState(torch.tensor(new_clip, dtype=torch.float64))


def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """σ_Δ = (z⁻² − (2σ_b)⁻²)^(−½): the update noise multiplier that, with count noise σ_b, makes adaptive clipping
    as private as one Gaussian of multiplier z (Andrew et al. 2021, Thm. 1). z = 0 gives 0.

    Raises:
        ValueError: 2σ_b ≤ z (the count alone would spend the whole budget).
    """
    if noise_multiplier == 0:
        return 0.0
    if 2.0 * count_stddev <= noise_multiplier:
        raise ValueError(
            f"Adaptive clipping needs 2·count_stddev > noise_multiplier (Andrew et al. 2021, Thm. 1); got "
            f"count_stddev={count_stddev}, noise_multiplier={noise_multiplier}. Raise count_stddev (σ_b) or lower σ."
        )
    return (noise_multiplier ** -2 - (2.0 * count_stddev) ** -2) ** -0.5


class DPMean(Stage):
    """The DP-FedAvg reducer: Δ_t = Σ_i Δ_i / C, every client weighted 1, divided by the *expected* cohort size
    C = ``RoundInfo.clients_per_round`` (McMahan et al. 2018, Alg. 1, the fixed-denominator estimator f̃_f with all
    w_k = 1, so qW = C); a round without any client (Poisson cohorts) gives Δ_t = 0, shaped by
    ``ClientDeltas.template``, to which the noise stage adds its noise. The denominator does not depend on who reported, so one client's update moves Δ_t by at
    most S/C. Summed in float64, divided once, rounded once to the parameters' dtype (as
    :class:`~lightning_fed.server.aggregators.WeightedMean`: with all C clients reporting it equals
    ``WeightedMean`` under ``weighting="uniform"`` bit for bit).

    Raises (from :meth:`apply`):
        ValueError: the clients' weights (``ClientDeltas.counts``) differ — the server optimizer must use
        ``weighting="uniform"``; sample-count weights would break the S/C sensitivity.

    Example::

        >>> import torch
        >>> x = ClientDeltas([0, 1], [[torch.tensor([1.0])], [torch.tensor([4.0])]], torch.ones(2, dtype=torch.float64))
        >>> DPMean().apply(x, EmptyState(), RoundInfo(0, 0, 10, 4))[0]  # (1 + 4) / C with C = 4
        [tensor([1.2500])]
    """

    kind = "reduce"

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[list[Tensor], NamedTuple]:
        if not x.deltas:  # a round without any client (Poisson cohorts): the sum of no update is 0
            if x.template is None:
                raise ValueError("DPMean got a round without clients and no `template` to shape Δ_t = 0 by.")
            return [torch.zeros_like(t) for t in x.template], state
        if not bool((x.counts == x.counts[0]).all()):
            raise ValueError(
                "DPMean weights every client 1 (DP-FedAvg, McMahan et al. 2018), but the clients' weights differ: "
                "use the server optimizer with weighting='uniform'."
            )
        first = x.deltas[0]
        result = weighted_sum(x.deltas, [1.0] * len(x.deltas))
        torch._foreach_div_(result, float(info.clients_per_round))
        return [acc.to(d.dtype) for acc, d in zip(result, first)], state




class GaussianNoiseState(NamedTuple):
    """:class:`GaussianNoise`'s state: ``rounds`` (int64 scalar), how many noised releases so far (what the
    privacy accountant composes).
    Example::

        >>> import torch
        >>> int(GaussianNoiseState(torch.tensor(3)).rounds)
        3
    """

    rounds: Tensor


class GaussianNoise(Stage):
    """Add N(0, (σS/C)²) to every coordinate of Δ_t, i.e. N(0, σ²S²·I) to the clipped sum before the division by
    C (McMahan et al. 2018, Alg. 1, ``σ = zS/(qW)``, with qW = C).

    Args:
        noise_multiplier: σ ≥ 0 (z in the paper); 0 adds nothing (Δ_t unchanged).
        clip_norm: S — a number > 0, or the chain's clipping stage (:class:`ClipUpdates`, :class:`AdaptiveClip`),
            whose S of the current round is read.

    The noise comes from a ``torch.Generator`` on Δ_t's device seeded by ``(info.seed, info.round_idx)``, in
    Δ_t's dtype: the same seed and round give the same noise.

    Raises:
        ValueError: σ not a finite number ≥ 0, or ``clip_norm`` neither a number > 0 nor a clipping stage.

    Example: the noise repeats for the same round and seed::

        >>> import torch
        >>> stage = GaussianNoise(1.0, clip_norm=1.0)
        >>> info = RoundInfo(round_idx=3, seed=0, num_clients=100, clients_per_round=10)
        >>> a = stage.apply([torch.zeros(4)], stage.init_state([], 100), info)[0]
        >>> b = stage.apply([torch.zeros(4)], stage.init_state([], 100), info)[0]
        >>> torch.equal(a[0], b[0])
        True
    """

    kind = "delta"

    def __init__(self, noise_multiplier: float, clip_norm: Union[float, ClipUpdates, AdaptiveClip]) -> None:
        if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, numbers.Real) \
                or not math.isfinite(noise_multiplier) or noise_multiplier < 0:
            raise ValueError(f"`noise_multiplier` must be a finite number >= 0, got {noise_multiplier!r}.")
        if not isinstance(clip_norm, (ClipUpdates, AdaptiveClip)):
            clip_norm = _check_clip_norm(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.clip_norm = clip_norm

    def init_state(self, params: list[Tensor], num_clients: int) -> GaussianNoiseState:
        return GaussianNoiseState(torch.zeros((), dtype=torch.long))

    def round_clip_norm(self) -> float:
        """S of the current round."""
        c = self.clip_norm
        return c.round_clip_norm() if isinstance(c, (ClipUpdates, AdaptiveClip)) else c

    def apply(self, delta: list[Tensor], state: GaussianNoiseState, info: RoundInfo) -> tuple[list[Tensor], GaussianNoiseState]:
        new_state = GaussianNoiseState(state.rounds + 1)
        if self.noise_multiplier == 0.0:
            return delta, new_state
        clip = self.round_clip_norm()
        if math.isinf(clip):
            raise ValueError("GaussianNoise with noise_multiplier > 0 needs a finite clip norm S (the noise is σS/C).")
        std = self.noise_multiplier * clip / info.clients_per_round
        gen = round_generator(info, _NOISE_TAG, delta[0].device)
        out = []
        for d in delta:
            noise = torch.randn(d.shape, generator=gen, device=d.device, dtype=d.dtype)
            out.append(d + noise * std)
        return out, new_state


def check_dp_chain(server: Any) -> None:
    """Fit-start check of a server optimizer's aggregator chain holding DP stages (called from
    :meth:`~lightning_fed.callbacks.ServerOptimizer.setup`, before round 0 trains).

    * :class:`DPMean` weights every client 1: ``weighting="num_samples"`` is refused (it would otherwise fail at the
      first aggregation, after round 0 trained).
    * A hand-composed chain (:class:`DPMean` or :class:`GaussianNoise` in the ``aggregators`` of a server optimizer
      that does not account privacy — any but :class:`~lightning_fed.callbacks.DPFedAvg` and the other
      :class:`~lightning_fed.callbacks.dp.DifferentialPrivacy` classes) has no δ at which to report ε: one warning
      that ε is not accounted (and no ``privacy/epsilon`` is logged).

    Raises:
        ValueError: naming ``weighting`` and the allowed value.

    Example::

        >>> from lightning_fed.callbacks import FedAvg
        >>> check_dp_chain(FedAvg(aggregators=[ClipUpdates(1.0), DPMean(), GaussianNoise(1.0, 1.0)]))
        Traceback (most recent call last):
        ...
        ValueError: FedAvg(weighting='num_samples') aggregates with DPMean, which weights every client 1 (DP-FedAvg, McMahan et al. 2018): use weighting='uniform'.
    """
    from lightning.pytorch.utilities import rank_zero_warn

    stages = list(getattr(server, "aggregators", None) or [])
    dp_stages = [s for s in stages if isinstance(s, (DPMean, GaussianNoise))]
    if not dp_stages:
        return
    weighting = getattr(server, "weighting", "uniform")
    if any(isinstance(s, DPMean) for s in stages) and weighting != "uniform":
        raise ValueError(
            f"{type(server).__name__}(weighting={weighting!r}) aggregates with DPMean, which weights every client 1 "
            "(DP-FedAvg, McMahan et al. 2018): use weighting='uniform'."
        )
    if not getattr(server, "accounts_privacy", False):
        names = ", ".join(type(s).__name__ for s in stages)
        rank_zero_warn(
            f"{type(server).__name__} aggregates with the DP stages [{names}] but does not account privacy: ε is not "
            "accounted and privacy/epsilon is not logged (there is no target_delta). Use DPFedAvg, DPFedAdam, "
            "DPFedYogi, DPFedAdagrad or the DifferentialPrivacy mixin (setup_privacy) for an accounted ε."
        )


# ----------------------------------------------------------------------------- what a noised chain may release
def adds_noise(stages: Optional[Any]) -> bool:
    """Whether an aggregator chain privatises its release: it has a :class:`GaussianNoise` stage with σ ≠ 0 (a σ not
    yet resolved, NaN, counts). Under such a chain the server optimizer releases only what ε covers: buffers stay at
    their global value, parameters that are not trained are neither clipped nor noised, and the fit-start checks of
    :func:`check_private_fit` apply. σ = 0 (ε = ∞) changes nothing.

    Example::

        >>> clip = ClipUpdates(1.0)
        >>> noised, noise_free = GaussianNoise(1.0, clip), GaussianNoise(0.0, clip)
        >>> adds_noise([clip, DPMean(), noised]), adds_noise([clip, DPMean(), noise_free])
        (True, False)
        >>> adds_noise(None)
        False
    """
    return any(isinstance(s, GaussianNoise) and s.noise_multiplier != 0 for s in stages or ())


def running_stat_modules(module: torch.nn.Module) -> list[str]:
    """``"name (Type)"`` of every sub-module of ``module`` that updates running statistics in training: BatchNorm
    (any dimension, SyncBatchNorm and lazy ones included) and InstanceNorm built with ``track_running_stats=True``
    (the modules Opacus's ``ModuleValidator`` refuses for the same reason).

    Example::

        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2),
        ...                           torch.nn.BatchNorm1d(2, track_running_stats=False), torch.nn.GroupNorm(1, 2))
        >>> running_stat_modules(net)
        ['1 (BatchNorm1d)']
    """
    return [f"{name} ({type(m).__name__})" for name, m in module.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._NormBase) and m.track_running_stats]


def check_private_fit(server: Any, trainer: Any, pl_module: torch.nn.Module, trained: Sequence[bool]) -> None:
    """The fit-start refusals of a server optimizer whose chain :func:`adds_noise` (user-level DP): what the run
    would release or decide from client data outside the DP analysis.

    Args:
        server: The server optimizer (for its name in the messages).
        trainer: The federated trainer (its ``fit_loop.max_update_norm_ratio`` is read).
        pl_module: The module trained.
        trained: One bool per ``pl_module.parameters()``: trained by the clients (see
            :func:`trained_parameters`).

    Raises:
        ValueError: a module with running statistics (:func:`running_stat_modules`; their buffers would be the
            clients' unclipped, unnoised mean), naming the modules and the fix; ``max_update_norm_ratio`` set (its
            drop rule depends on the clients' data and is outside the DP analysis); no parameter trained.
    """
    name = type(server).__name__
    modules = running_stat_modules(pl_module)
    if modules:
        raise ValueError(
            f"{name} adds DP noise (noise_multiplier > 0), and ε covers the model's trained parameters only, but "
            f"these modules update running statistics (buffers) from the clients' data during training, which "
            f"differential privacy does not cover: {', '.join(modules)}. Use GroupNorm or LayerNorm instead (e.g. "
            "lightning_fed.models' ResNet with norm='group'), or build them with track_running_stats=False."
        )
    ratio = getattr(getattr(trainer, "fit_loop", None), "max_update_norm_ratio", None)
    if ratio is not None:
        raise ValueError(
            f"`max_update_norm_ratio`={ratio:g} drops clients by a rule that depends on their data (the round's "
            f"median update norm), outside the DP analysis of {name} (noise_multiplier > 0), which already bounds "
            "every client's influence by clipping: leave `max_update_norm_ratio=None` with a DP server optimizer, "
            "or set noise_multiplier=0."
        )
    if not any(trained):
        raise ValueError(
            f"{name} adds DP noise to the trained parameters, but the module has none (every parameter has "
            "requires_grad=False or is in no optimizer of configure_optimizers)."
        )


def trained_parameters(params: Sequence[Tensor], optimizers: Sequence[Any] = ()) -> list[bool]:
    """One bool per entry of ``params``: ``requires_grad`` (a plain tensor, not an ``nn.Parameter``, counts as
    trained) and, when there are client optimizers, held by one of their parameter groups. Under a chain that
    :func:`adds_noise`, the others are kept at their global value (not clipped, not noised, not stepped).

    Example::

        >>> a, b, c = (torch.nn.Parameter(torch.zeros(1)) for _ in range(3))
        >>> b.requires_grad_(False)
        Parameter containing:
        tensor([0.])
        >>> trained_parameters([a, b, c], [torch.optim.SGD([a, b], lr=0.1)])
        [True, False, False]
    """
    held = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    return [(bool(p.requires_grad) or not isinstance(p, torch.nn.Parameter)) and (not held or id(p) in held)
            for p in params]
