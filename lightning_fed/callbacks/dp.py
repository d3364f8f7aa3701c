"""User-level differentially private server optimizers: DP-FedAvg (McMahan et al. 2018) with any server rule.

``DPFedAvg``, ``DPFedAdam``, ``DPFedYogi`` and ``DPFedAdagrad`` are the server optimizers of the same name without
the prefix, aggregating through the DP-FedAvg chain of :mod:`lightning_fed.server.aggregators.dp`
(clip → unweighted sum / C → Gaussian noise; optionally adaptive clipping, Andrew et al. 2021), accounting ε with
Google's ``dp-accounting`` (:class:`~lightning_fed.server.privacy.PrivacyAccountant`), logging ``privacy/epsilon``
(ε at ``target_delta`` after the round) and ``privacy/clip_norm`` (S of the round) every round, and optionally
stopping before ε would exceed ``target_epsilon``. Any other server rule gets the same by
``class DPFedX(DifferentialPrivacy, FedX)`` calling :meth:`DifferentialPrivacy.setup_privacy` in its ``__init__``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.callbacks.fedadagrad import FedAdagrad
from lightning_fed.callbacks.fedadam import FedAdam
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.callbacks.fedyogi import FedYogi
from lightning_fed.server.aggregators.base import check_chain
from lightning_fed.server.aggregators.dp import (
    AdaptiveClip,
    ClipUpdates,
    DPMean,
    GaussianNoise,
    update_noise_multiplier,
)
from lightning_fed.checkpoint import privacy_history
from lightning_fed.server.privacy import ACCOUNTINGS, SAMPLINGS, PrivacyAccountant


class DifferentialPrivacy:
    """Mixin turning a :class:`~lightning_fed.callbacks.ServerOptimizer` into its DP-FedAvg version (put it first
    in the bases and call :meth:`setup_privacy` after the server optimizer's ``__init__``).

    Per round (McMahan et al. 2018, Alg. 1): every client's update Δ_i is clipped to L2 norm S, the clipped updates
    are summed with weight 1 each, N(0, σ²S²·I) is added and the sum divided by the expected cohort size C; the
    server rule then steps with this Δ_t. With ``adaptive_clipping`` S follows the ``target_quantile`` of the update
    norms (Andrew et al. 2021, Alg. 1) and σ is the noise multiplier of the *pair* of queries (updates and clipped
    count, Thm. 1): the updates get σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−½).

    Accounting (:class:`~lightning_fed.server.privacy.PrivacyAccountant`, RDP or PLD from ``dp-accounting``):
    ``sampling`` must be the data module's ``cohort_sampling`` (checked at fit start; ``cohort_sampling=
    "sweep_then_uniform"`` has no analysis and is refused).
    ``sampling="fixed_size"`` (default, ``FederatedDataModule``'s default: C distinct clients of N) composes
    sampling-without-replacement Gaussian events under replace-one adjacency; ``sampling="poisson"`` (a data
    module with ``cohort_sampling="poisson"``: every client joins with probability q = C/N) composes Poisson-sampled
    Gaussian events under add-or-remove-one. Under Poisson sampling the mean still divides by C = qN, the expected
    cohort size (McMahan et al. 2018, Alg. 1), and every round releases a noised Δ_t — one where no client reports
    (nobody sampled, or every sampled client failed) releases the noise alone, N(0, σ²S²·I)/C, the server steps with
    it and the round is composed (the Poisson analysis covers the empty sample; skipping the release would tell who
    was not sampled). ``accounting="rdp"`` (default) or ``"pld"`` picks the library's accountant. Only rounds in
    which the server stepped are composed (with fixed-size cohorts a round where every client failed releases
    nothing and is not composed). The rounds of the same run under earlier server optimizers (an allowed change of
    class on resume, e.g. DPFedAdam → DPFedYogi) are composed too, each with its own σ, N, C and sampling (the
    checkpoint's run record keeps them, :func:`lightning_fed.checkpoint.privacy_history`); if any of them was
    aggregated without DP (e.g. FedAdam → DPFedAdam), ε = ∞ for the whole run, with a warning at fit start.

    Args (of :meth:`setup_privacy`, and of every ready-made class):
        clip_norm: S > 0 (``math.inf``: no clipping, only with σ = 0); with ``adaptive_clipping``, S_0.
        noise_multiplier: σ ≥ 0 (z in the papers).
        target_delta: δ in (0, 1) at which ε is reported (McMahan et al. 2018 use δ = 1/N^1.1).
        adaptive_clipping: Track a quantile of the update norms (default ``False``).
        target_quantile: γ in [0, 1] (default 0.5).
        clip_learning_rate: η_C > 0 (default 0.2).
        count_stddev: σ_b ≥ 0 of the clipped-count noise; ``None`` (default): C/20 (Andrew et al. 2021, Sec. 3.1).
        target_epsilon: Stop the run (``trainer.should_stop``) at the end of the last round after which one more round
            would take ε above this; ``None`` (default): never. Fit refuses to start when not even one round fits,
            or when the trainer's ``min_epochs`` (before which Lightning ignores ``should_stop``) is more rounds
            than it allows; a round that would take ε above it never trains (``RuntimeError`` at its start if the
            stop was overridden), so the logged ε never exceeds it.
        sampling: ``"fixed_size"`` (default) or ``"poisson"``: the data module's ``cohort_sampling`` (see above).
        accounting: ``"rdp"`` (default) or ``"pld"`` (see above; ε from PLD is tighter, and each evaluation costs
            about a second of CPU time where RDP's costs milliseconds).

    Raises:
        ValueError: naming the argument out of range; ``target_epsilon`` with σ = 0; σ > 0 with S = ∞;
            adaptive clipping with 2σ_b ≤ σ, an unknown ``accounting``; a server optimizer with ``weighting`` other
            than ``"uniform"``; at fit start, a ``sampling`` other than the data module's ``cohort_sampling``, a
            ``cohort_sampling`` other than ``"fixed_size"`` or ``"poisson"``, a
            ``target_epsilon`` already spent by one round, or ``min_epochs`` beyond ``target_epsilon`` (the message
            gives the largest ``min_epochs`` allowed); with σ > 0, at fit start, modules with running statistics
            (BatchNorm) or ``max_update_norm_ratio`` (see :attr:`ServerOptimizer.privatises
            <lightning_fed.callbacks.ServerOptimizer.privatises>`: with σ > 0 buffers keep their global value, and
            parameters the clients do not train or keep local, e.g. FedPer's head, are neither clipped nor noised;
            the accountant is the same).
        RuntimeError: at the start of a round after which ε would exceed ``target_epsilon`` (the stop overridden).
    Example (a DP version of another rule: the mixin first, then ``setup_privacy``)::

        >>> from lightning_fed.callbacks import FedAvgM
        >>> class DPFedAvgM(DifferentialPrivacy, FedAvgM):
        ...     def __init__(self, clip_norm, noise_multiplier, target_delta, lr=1.0, momentum=0.9):
        ...         FedAvgM.__init__(self, lr=lr, momentum=momentum, weighting="uniform")
        ...         self.setup_privacy(clip_norm, noise_multiplier, target_delta)
        >>> [type(s).__name__ for s in DPFedAvgM(1.0, 1.0, 1e-5).aggregators]
        ['ClipUpdates', 'DPMean', 'GaussianNoise']
    """

    #: ε is accounted (and logged) by this server optimizer: its DP chain raises no "not accounted" warning.
    accounts_privacy = True
    #: The DP settings a repr shows, after those of the server optimizer it is mixed into.
    privacy_repr_fields = ("clip_norm", "noise_multiplier", "target_delta", "adaptive_clipping", "target_epsilon",
                           "sampling", "accounting")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A server optimizer mixing this in shows its own :attr:`repr_fields` then :attr:`privacy_repr_fields`."""
        super().__init_subclass__(**kwargs)
        own = next((vars(b)["repr_fields"] for b in cls.__mro__[1:] if "repr_fields" in vars(b)), None)
        if own is not None and "repr_fields" not in vars(cls) and own[-len(cls.privacy_repr_fields):] != cls.privacy_repr_fields:
            cls.repr_fields = own + cls.privacy_repr_fields

    def setup_privacy(self, clip_norm: float, noise_multiplier: float, target_delta: float,
                      adaptive_clipping: bool = False, target_quantile: float = 0.5, clip_learning_rate: float = 0.2,
                      count_stddev: Optional[float] = None, target_epsilon: Optional[float] = None,
                      sampling: str = "fixed_size", accounting: str = "rdp") -> None:
        """Validate the DP arguments and install the DP-FedAvg aggregator chain (see the class doc)."""
        if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, numbers.Real) \
                or not math.isfinite(noise_multiplier) or noise_multiplier < 0:
            raise ValueError(f"`noise_multiplier` must be a finite number >= 0, got {noise_multiplier!r}.")
        if isinstance(target_delta, bool) or not isinstance(target_delta, numbers.Real) or not 0 < target_delta < 1:
            raise ValueError(f"`target_delta` must be a number in (0, 1), got {target_delta!r}.")
        if target_epsilon is not None:
            if isinstance(target_epsilon, bool) or not isinstance(target_epsilon, numbers.Real) or not target_epsilon > 0:
                raise ValueError(f"`target_epsilon` must be a number > 0 or None, got {target_epsilon!r}.")
            if noise_multiplier == 0:
                raise ValueError("`target_epsilon` needs `noise_multiplier` > 0: with no noise ε is infinite.")
        if sampling not in SAMPLINGS:
            raise ValueError(f"`sampling` must be one of {SAMPLINGS}, got {sampling!r}.")
        if accounting not in ACCOUNTINGS:
            raise ValueError(f"`accounting` must be one of {ACCOUNTINGS}, got {accounting!r}.")
        if not isinstance(adaptive_clipping, bool):
            raise ValueError(f"`adaptive_clipping` must be True or False, got {adaptive_clipping!r}.")
        if getattr(self, "weighting", "uniform") != "uniform":
            raise ValueError(
                f"{type(self).__name__} has weighting={self.weighting!r}; DP-FedAvg weights every client 1 (DPMean): "
                "construct the server optimizer with weighting='uniform'."
            )
        if adaptive_clipping:
            clip = AdaptiveClip(target_quantile, clip_learning_rate, initial_clip=clip_norm, count_stddev=count_stddev)
        else:
            clip = ClipUpdates(clip_norm)
            if noise_multiplier > 0 and math.isinf(clip.clip_norm):
                raise ValueError("`clip_norm` must be finite when `noise_multiplier` > 0 (the noise is σS/C).")
        noise = GaussianNoise(noise_multiplier, clip)
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.target_delta = float(target_delta)
        self.adaptive_clipping = adaptive_clipping
        self.target_epsilon = None if target_epsilon is None else float(target_epsilon)
        self.sampling = sampling
        # recorded in the checkpoint's run record (a changed value is refused on resume unless allowed)
        self.target_quantile = clip.target_quantile if adaptive_clipping else target_quantile
        self.clip_learning_rate = clip.learning_rate if adaptive_clipping else clip_learning_rate
        self.count_stddev = clip.count_stddev if adaptive_clipping else count_stddev
        self.accounting = accounting
        self.aggregators = check_chain([clip, DPMean(), noise])
        if adaptive_clipping:
            self._resolve_update_noise(None)
        #: The privacy accountant (created at fit start, when N and C are known).
        self.accountant: Optional[PrivacyAccountant] = None
        self._saved_privacy: Optional[dict[str, Any]] = None
        self._next_epsilon: Optional[tuple[int, float]] = None

    @property
    def releases_empty_rounds(self) -> bool:
        """Whether a round with no client update still steps the server (with the noise alone): with Poisson
        cohorts (``sampling="poisson"``). Read by the federated loop."""
        return self.sampling == "poisson"

    def _resolve_update_noise(self, clients_per_round: Optional[int]) -> None:
        clip, _, noise = self.aggregators
        if clip.count_stddev is None and clients_per_round is None and self.noise_multiplier != 0:
            noise.noise_multiplier = math.nan  # resolved at fit start (σ_b = C/20 needs C)
            return
        noise.noise_multiplier = update_noise_multiplier(
            self.noise_multiplier, clip.resolved_count_stddev(clients_per_round or 1)
        )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        dm = trainer.datamodule
        n, c = int(dm.num_clients), int(dm.clients_per_round)
        cohorts = getattr(dm, "cohort_sampling", "fixed_size")
        if self.sampling == "poisson" and cohorts != "poisson":
            raise ValueError(
                f"`sampling='poisson'` accounts Poisson-sampled cohorts, but {type(dm).__name__} draws "
                f"{c} distinct clients every round; use sampling='fixed_size' (sampling without replacement)."
            )
        if cohorts not in SAMPLINGS:  # e.g. 'sweep_then_uniform': no sampling the accountant analyses
            raise ValueError(
                f"{type(dm).__name__} has cohort_sampling={cohorts!r}, which DP accounting does not analyse (its "
                f"sampling accepts {SAMPLINGS}); use FederatedDataModule(cohort_sampling='fixed_size') with "
                "sampling='fixed_size' (the default), or cohort_sampling='poisson' with sampling='poisson'."
            )
        if self.sampling != cohorts:
            raise ValueError(
                f"`sampling={self.sampling!r}` but {type(dm).__name__} has cohort_sampling={cohorts!r}: the privacy "
                f"analysis must be that of the cohorts drawn; use sampling={cohorts!r}."
            )
        devices = getattr(dm, "device_model", None)
        if devices is not None and devices.has_availability:
            raise ValueError(
                f"{type(self).__name__} accounts ε for cohorts drawn by {self.sampling!r} sampling from all {n} "
                f"clients, but {type(dm).__name__}'s device_model {type(devices).__name__} has availability: each "
                "round samples only the clients online at its start, so a client's chance of joining follows its "
                "availability (not q = C/N), and the privacy analysis would not hold. Use a device model without "
                "availability (e.g. FedScaleDevices without behaviour_file) for a DP run."
            )
        if getattr(dm, "client_dropout", 0) or getattr(dm, "over_selection", 0):
            rank_zero_warn(
                "DP accounting assumes exactly clients_per_round clients drawn uniformly each round; with "
                "client_dropout/over_selection the reported cohort differs and ε is not analysed for it."
            )
        if self.adaptive_clipping:
            self._resolve_update_noise(c)
        self.accountant = PrivacyAccountant(self.noise_multiplier, n, c, self.sampling, self.accounting)
        if self._saved_privacy is not None:
            self.accountant.load_state_dict(self._saved_privacy)
            self._saved_privacy = None
        # rounds run under earlier server optimizers of this run (an allowed change of class on resume)
        self.accountant.set_history(privacy_history(trainer))
        nonprivate = self.accountant.nonprivate_rounds()
        if nonprivate:
            rank_zero_warn(
                f"{nonprivate} round(s) of this run (before the resume) were aggregated without differential privacy "
                "(by a server optimizer without DP accounting): the models they released have no privacy guarantee, "
                "so privacy/epsilon reports ε = ∞ for the whole run."
            )
        self._next_epsilon = None
        if self.target_epsilon is not None:
            acc = self.accountant
            nxt = acc.epsilon(self.target_delta, acc.rounds + 1)
            if nxt > self.target_epsilon:
                why = f" ({nonprivate} earlier round(s) were not private)" if nonprivate else ""
                raise ValueError(
                    f"target_epsilon={self.target_epsilon} is spent: after {acc.rounds + 1} round(s) "
                    f"ε would be {nxt:.4g} at δ={self.target_delta}{why}. Raise target_epsilon or noise_multiplier."
                )
            # Lightning ignores should_stop until min_epochs rounds have run: refuse a min_epochs beyond the budget
            min_epochs = int(getattr(trainer, "min_epochs", 0) or 0)
            remaining = min_epochs - int(trainer.current_epoch)
            if remaining > 1:
                at_min = acc.epsilon(self.target_delta, acc.rounds + remaining)
                if at_min > self.target_epsilon:
                    allowed = int(trainer.current_epoch) + self._rounds_within_target(remaining)
                    raise ValueError(
                        f"target_epsilon={self.target_epsilon} cannot be kept with min_epochs={min_epochs}: "
                        f"Lightning does not stop a run before min_epochs rounds, and after them ε would be "
                        f"{at_min:.4g} at δ={self.target_delta}. Use min_epochs <= {allowed} (the rounds "
                        "target_epsilon allows), or raise target_epsilon or noise_multiplier."
                    )

    def _rounds_within_target(self, upper: int) -> int:
        """The most further rounds k (1 ≤ k < ``upper``) with ε ≤ ``target_epsilon`` after them (ε after 1 more
        round is known to fit, after ``upper`` not): a binary search, ε growing with the rounds."""
        acc, lo, hi = self.accountant, 1, upper
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if acc.epsilon(self.target_delta, acc.rounds + mid) <= self.target_epsilon:
                lo = mid
            else:
                hi = mid
        return lo

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse to train a round after which ε would exceed ``target_epsilon`` (a stop requested after the previous
        round and overridden, e.g. by a callback resetting ``trainer.should_stop``): ``RuntimeError`` before any
        client trains."""
        super().on_train_epoch_start(trainer, pl_module)
        if self.target_epsilon is None or self.accountant is None:
            return
        if self.aggregator_state is not None:
            self.accountant.rounds = int(self.aggregator_state[2].rounds)
        cached = self._next_epsilon
        nxt = cached[1] if cached is not None and cached[0] == self.accountant.rounds else \
            self.accountant.epsilon(self.target_delta, self.accountant.rounds + 1)
        if nxt > self.target_epsilon:
            raise RuntimeError(
                f"{type(self).__name__}: round index {trainer.current_epoch} would take ε to {nxt:.4g} at "
                f"δ={self.target_delta}, above target_epsilon={self.target_epsilon}; the stop requested after the "
                "previous round was overridden (trainer.should_stop reset). Not training it."
            )

    def privacy_segment(self) -> Optional[dict[str, Any]]:
        """This server optimizer's private rounds as a history segment for the checkpoint's run record
        (``None`` before fit start)."""
        if self.accountant is None:
            if self._saved_privacy is not None:
                return {"private": True, **self._saved_privacy}
            return None
        if self.aggregator_state is not None:
            self.accountant.rounds = int(self.aggregator_state[2].rounds)
        return self.accountant.segment()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Log ``privacy/epsilon`` and ``privacy/clip_norm`` (NaN in a round where no client reported); stop the run
        if one more round would exceed ``target_epsilon``."""
        parent = getattr(super(), "on_train_epoch_end", None)
        if parent is not None:
            parent(trainer, pl_module)
        if self.accountant is None:
            return
        if self.aggregator_state is not None:
            self.accountant.rounds = int(self.aggregator_state[2].rounds)
        eps = self.accountant.epsilon(self.target_delta)
        self.epsilon = eps
        pl_module.log("privacy/epsilon", eps, on_step=False, on_epoch=True, batch_size=1)
        # NaN in a round where no client reported (nothing released), as the loop's other round metrics
        clip_norm = self.aggregators[2].round_clip_norm() if self._stepped else math.nan
        pl_module.log("privacy/clip_norm", clip_norm, on_step=False, on_epoch=True, batch_size=1)
        if self.target_epsilon is not None and not trainer.should_stop:
            nxt = self.accountant.epsilon(self.target_delta, self.accountant.rounds + 1)
            self._next_epsilon = (self.accountant.rounds, nxt)
            if nxt > self.target_epsilon:
                trainer.should_stop = True
                rank_zero_info(
                    f"{type(self).__name__}: stopping after round index {trainer.current_epoch} ({self.accountant.rounds} "
                    f"private rounds): ε = {eps:.4g} at δ = {self.target_delta}; one more round would give "
                    f"ε = {nxt:.4g} > target_epsilon = {self.target_epsilon}."
                )

    def state_dict(self) -> dict[str, Any]:
        out = super().state_dict()
        if self.accountant is not None:
            if self.aggregator_state is not None:
                self.accountant.rounds = int(self.aggregator_state[2].rounds)
            out["privacy"] = self.accountant.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._saved_privacy = state_dict.get("privacy")

    def restore_state(self, snapshot: dict[str, Any], params: list[Any]) -> None:
        """:meth:`ServerOptimizer.restore_state`, the accountant's rounds included (the restored round released
        nothing)."""
        super().restore_state(snapshot, params)
        if self.accountant is not None and self._saved_privacy is not None:
            self.accountant.load_state_dict(self._saved_privacy)
            self._saved_privacy = None


class DPFedAvg(DifferentialPrivacy, FedAvg):
    """DP-FedAvg (McMahan et al. 2018, Alg. 1): x_{t+1} = x_t + η·Δ_t with Δ_t the clipped, noised mean of
    :class:`DifferentialPrivacy` (clients weighted uniformly). With σ = 0 and S = ∞ it is
    ``FedAvg(lr, weighting="uniform")`` exactly (when all C clients report).

    Args: ``clip_norm``, ``noise_multiplier``, ``target_delta`` and the rest as :class:`DifferentialPrivacy`;
    ``lr``: server learning rate η (default 1.0); ``client``: client algorithms (e.g. ``[FedProxClient(mu=0.01)]``:
    DP with FedProx clients; the clipping bounds each client's whole update, whatever the client algorithm).

    Example: a fixed clip of S = 1 and σ = 1::

        >>> DPFedAvg(clip_norm=1.0, noise_multiplier=1.0, target_delta=1e-5).aggregators
        [ClipUpdates(clip_norm=1.0), DPMean(), GaussianNoise(noise_multiplier=1.0, clip_norm=ClipUpdates(clip_norm=1.0))]
    """

    def __init__(self, clip_norm: float, noise_multiplier: float, target_delta: float,
                 adaptive_clipping: bool = False, target_quantile: float = 0.5, clip_learning_rate: float = 0.2,
                 count_stddev: Optional[float] = None, target_epsilon: Optional[float] = None,
                 sampling: str = "fixed_size", lr: float = 1.0, accounting: str = "rdp",
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        FedAvg.__init__(self, lr=lr, weighting="uniform", client=client)
        self.setup_privacy(clip_norm, noise_multiplier, target_delta, adaptive_clipping, target_quantile,
                           clip_learning_rate, count_stddev, target_epsilon, sampling, accounting)


class _DPAdaptive(DifferentialPrivacy):
    def __init__(self, clip_norm: float, noise_multiplier: float, target_delta: float,
                 adaptive_clipping: bool = False, target_quantile: float = 0.5, clip_learning_rate: float = 0.2,
                 count_stddev: Optional[float] = None, target_epsilon: Optional[float] = None,
                 sampling: str = "fixed_size", lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3, initial_accumulator: Optional[float] = None, bias_correction: bool = False,
                 convention: str = "reddi", accounting: str = "rdp",
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, beta1=beta1, beta2=beta2, tau=tau, initial_accumulator=initial_accumulator,
                         bias_correction=bias_correction, weighting="uniform", convention=convention, client=client)
        self.setup_privacy(clip_norm, noise_multiplier, target_delta, adaptive_clipping, target_quantile,
                           clip_learning_rate, count_stddev, target_epsilon, sampling, accounting)


class DPFedAdam(_DPAdaptive, FedAdam):
    """DP-FedAdam: :class:`~lightning_fed.callbacks.FedAdam` (Reddi et al. 2021, Alg. 2) stepping with the DP-FedAvg
    pseudo-gradient of :class:`DifferentialPrivacy`. Args: the DP arguments of :class:`DifferentialPrivacy`, then
    FedAdam's (``lr`` = η default 1e-2, ``beta1``, ``beta2``, ``tau``, …; ``weighting`` is fixed to uniform).

    Example::

        >>> DPFedAdam(clip_norm=0.5, noise_multiplier=0.3, target_delta=1e-3, lr=0.01).aggregators[0]
        ClipUpdates(clip_norm=0.5)
    """


class DPFedYogi(_DPAdaptive, FedYogi):
    """DP-FedYogi: :class:`~lightning_fed.callbacks.FedYogi` with the DP-FedAvg pseudo-gradient (see
    :class:`DPFedAdam` for the arguments).

    Example::

        >>> DPFedYogi(clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-4).weighting
        'uniform'
    """


class DPFedAdagrad(DifferentialPrivacy, FedAdagrad):
    """DP-FedAdagrad: :class:`~lightning_fed.callbacks.FedAdagrad` with the DP-FedAvg pseudo-gradient. Args: the DP
    arguments of :class:`DifferentialPrivacy`, then FedAdagrad's (``weighting`` is fixed to uniform).

    Example::

        >>> type(DPFedAdagrad(clip_norm=1.0, noise_multiplier=0.5, target_delta=1e-4).aggregators[-1]).__name__
        'GaussianNoise'
    """

    def __init__(self, clip_norm: float, noise_multiplier: float, target_delta: float,
                 adaptive_clipping: bool = False, target_quantile: float = 0.5, clip_learning_rate: float = 0.2,
                 count_stddev: Optional[float] = None, target_epsilon: Optional[float] = None,
                 sampling: str = "fixed_size", lr: float = 1e-2, tau: float = 1e-3,
                 initial_accumulator: Optional[float] = None, beta1: Optional[float] = None,
                 bias_correction: bool = False, convention: str = "reddi", accounting: str = "rdp",
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        FedAdagrad.__init__(self, lr=lr, tau=tau, initial_accumulator=initial_accumulator, beta1=beta1,
                            bias_correction=bias_correction, weighting="uniform", convention=convention, client=client)
        self.setup_privacy(clip_norm, noise_multiplier, target_delta, adaptive_clipping, target_quantile,
                           clip_learning_rate, count_stddev, target_epsilon, sampling, accounting)
