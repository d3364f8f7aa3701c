"""Fed-LAMB and Fed-AMS (Karimi, Li, Li, *Layerwise and Dimensionwise Locally Adaptive Optimization*, Algorithm 1)
as one unit: the client optimizers (local AMSGrad moments, with (Fed-LAMB) or without (Fed-AMS) a layerwise trust
ratio, l. 7-13), the client half :class:`LocalAdaptiveClient` (seeds each client's optimizer with the broadcast
moments, l. 5-6, and sends its second moment back, l. 14) and the server half :class:`MaxSecondMoment` (model
averaging and the max-averaged second moment, l. 16). :class:`~lightning_fed.algorithms.fedlamb.FedLAMB` and
:class:`~lightning_fed.algorithms.fedlamb.FedAMS` are the three together under server SGD.

The client optimizers are ordinary ``torch.optim.Optimizer`` s; they work without the federated server too. Inside
federated training the server callbacks install them in place of the module's own optimizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import torch
from torch import Tensor

from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, WeightedMean, weighted_sum
from lightning_fed.server.checks import check_choice, check_in_range, check_phi_bounds  # noqa: F401  (re-exported)
from lightning_fed.server.rules.lamb import layerwise_scale  # noqa: F401  (re-exported)
from lightning_fed.callbacks.server_optimizer import ServerOptimizer, check_positive, check_unit_interval, none_if_infinite
from lightning_fed.server.rules.sgd import SGD
from lightning_fed.algorithms.fedlamb_optim import (  # noqa: F401  (re-exported: this module's API)
    BIAS_CORRECTIONS,
    RATIO_DENOMINATORS,
    AMSGradClient,
    FedLAMBClient,
    LocalAMSGrad,
)

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext


class MaxSecondMoment(Stage):
    """Reducer of Karimi et al., Alg. 1, l. 16, with w_i = counts_i / Σ counts (uniform counts: the paper's mean)::

        Δ_t     = Σ_i w_i·Δ_i                   (the model average; the rule steps θ̄ + η·Δ_t)
        v̂_{r+1} = max(v̂_r, Σ_i w_i·v_i^T)      (v_i^T = ``extras["exp_avg_sq"]``)
        m̄_{r+1} = Σ_i w_i·m_i^T                 (``average_first_moment``; m_i^T = ``extras["exp_avg"]``)

    Δ_t is summed in float64 (:class:`~lightning_fed.server.aggregators.WeightedMean`); the moments are summed in
    their own dtype with the float weights w_i, and v̂, m̄ are updated in place. The :class:`State` holds
    v̂ = ``initial_second_moment``·1 and m̄ = 0 shaped like the parameters (:meth:`init_state`).

    Args:
        initial_second_moment: v̂_0 (≥ 0; Alg. 1, l. 2: ε).
        average_first_moment: Keep and average m̄ (``first_moment="average"``; default ``False``).
        owner: The name in error messages (default ``"MaxSecondMoment"``).

    Raises:
        ValueError: in :meth:`apply`, ``ClientDeltas.updates`` missing or an update without the extras needed.

    Example: two clients (uniform weights) with Δ = [1], [3] and v^T = [4], [0]: Δ_t = 2 and
    v̂ = max(0.5, (4 + 0)/2) = 2::

        >>> from lightning_fed import ClientUpdate
        >>> updates = [ClientUpdate(0, [torch.tensor([1.0])], 1, 1, 0.0, extras={"exp_avg_sq": [torch.tensor([4.0])]}),
        ...            ClientUpdate(1, [torch.tensor([3.0])], 1, 1, 0.0, extras={"exp_avg_sq": [torch.tensor([0.0])]})]
        >>> x = ClientDeltas([0, 1], [u.delta for u in updates], torch.ones(2, dtype=torch.float64), updates)
        >>> stage = MaxSecondMoment(initial_second_moment=0.5)
        >>> stage.apply(x, stage.init_state(x.deltas[0], 2), RoundInfo(0, 0, 2, 2))
        ([tensor([2.])], State(second_moment=[tensor([2.])], first_moment=None))
    """

    kind = "reduce"

    class State(NamedTuple):
        """v̂ and m̄ (``None`` without ``average_first_moment``), one tensor per parameter."""

        second_moment: Optional[list[Tensor]] = None
        first_moment: Optional[list[Tensor]] = None

    @property
    def required_fields(self) -> tuple:
        """After a server step a checkpoint must hold v̂ (and m̄ with ``average_first_moment``)."""
        return ("second_moment",) + (("first_moment",) if self.average_first_moment else ())

    def __init__(self, initial_second_moment: float = 1e-8, average_first_moment: bool = False,
                 owner: str = "MaxSecondMoment") -> None:
        self.initial_second_moment = initial_second_moment
        self.average_first_moment = average_first_moment
        self.owner = owner

    def init_state(self, params: list[Tensor], num_clients: int = 0) -> "MaxSecondMoment.State":
        """v̂_0 = ``initial_second_moment``·1 and (with ``average_first_moment``) m̄_0 = 0, shaped like ``params``."""
        return self.State(
            [torch.full_like(p, self.initial_second_moment) for p in params],
            [torch.zeros_like(p) for p in params] if self.average_first_moment else None,
        )

    def moments(self, server: Any, params: list[Tensor]) -> "MaxSecondMoment.State":
        """v̂_r and m̄_r on ``params``' device, in ``server``'s chain state (created as v̂_0 the first time)."""
        index = next(i for i, s in enumerate(server.aggregators) if s is self)
        states = list(server.chain_state(params))
        state = states[index]
        tensors = [t for t in (state.second_moment, state.first_moment) if t]
        if any(t[0].device != params[0].device for t in tensors):
            state = MaxSecondMoment.State(*(None if t is None else [x.to(p.device) for x, p in zip(t, params)]
                                            for t in (state.second_moment, state.first_moment)))
            states[index] = state
            server.aggregator_state = tuple(states)
        return state

    def prepare_round(self, server: Any, params: list[Tensor], updates: Any) -> None:
        """Create the server moments (v̂_0, m̄_0 = 0) or move them to the parameters' device before the round
        (:meth:`moments`)."""
        self.moments(server, params)

    def _weighted_mean(self, updates: list, weights: list[float], key: str) -> list[Tensor]:
        for u in updates:
            if key not in u.extras:
                raise ValueError(
                    f"{self.owner}: client {u.client_id}'s update has no `extras[{key!r}]`; the client "
                    "executor must call `collect_client_extras`."
                )
        return weighted_sum([u.extras[key] for u in updates], weights, accumulate=False)

    def apply(self, x: ClientDeltas, state: "MaxSecondMoment.State", info: RoundInfo) -> tuple[list[Tensor], "MaxSecondMoment.State"]:
        """Δ_t and the state with v̂ (and m̄) updated in place."""
        if x.updates is None:
            raise ValueError(f"{self.owner} needs `ClientDeltas.updates` (the clients' moments in their extras).")
        pseudo_gradient, _ = WeightedMean().apply(x, state, info)
        if state.second_moment is None:
            state = self.init_state(x.deltas[0])
        weights = (x.counts / x.counts.sum()).tolist()
        with torch.no_grad():
            mean_v = self._weighted_mean(x.updates, weights, "exp_avg_sq")
            for v_hat, v in zip(state.second_moment, mean_v):
                torch.maximum(v_hat, v.to(v_hat.device, v_hat.dtype), out=v_hat)
            if self.average_first_moment:
                mean_m = self._weighted_mean(x.updates, weights, "exp_avg")
                for m_bar, m in zip(state.first_moment, mean_m):
                    m_bar.copy_(m)
        return pseudo_gradient, state


def _track_step_for_schedulers(optimizer: torch.optim.Optimizer) -> None:
    """Mark ``optimizer.step`` the way ``torch.optim.lr_scheduler.LRScheduler.__init__`` does, so a scheduler
    re-bound to ``optimizer`` does not warn that ``optimizer.step()`` was overridden."""
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]
        return step(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = wrapper  # type: ignore[method-assign]


def install_client_optimizer(trainer: Any, optimizer_class: type, client_lr: Optional[float],
                             optimizer_kwargs: dict[str, Any], owner: str) -> "LocalAMSGrad":
    """Replace the trainer's single optimizer by ``optimizer_class`` (a :class:`LocalAMSGrad`) and return it
    (``owner``: the method named in messages, e.g. ``"FedLAMB"``; ``optimizer_kwargs``: its hyper-parameters other
    than ``params`` and ``lr``).

    The new optimizer gets the old one's parameter groups (same parameters, same grouping), the learning
    rate ``client_lr`` or each group's own, and ``optimizer_kwargs``. It is set with
    ``trainer.strategy.optimizers = [new]``, which also re-creates Lightning's ``LightningOptimizer``
    wrappers (so ``self.optimizers()`` in manual optimization returns it), and every LR scheduler of the old
    optimizer is re-bound to the new one (with ``client_lr``, its base learning rates become ``client_lr``
    and the current factor is kept). An optimizer that already is an ``optimizer_class`` is kept
    unchanged, with its own hyper-parameters.

    Raises:
        ValueError: not exactly one optimizer, or one without parameters.
    """
    optimizers = list(trainer.optimizers)
    if len(optimizers) != 1 or not optimizers[0].param_groups:
        raise ValueError(
            f"{owner} needs exactly one client optimizer with parameters from the module's "
            f"`configure_optimizers` (its parameter groups and learning rate are reused); got "
            f"{[type(o).__name__ for o in optimizers]}."
        )
    old = optimizers[0]
    cls = optimizer_class
    if type(old) is cls:
        rank_zero_info(f"{owner}: the module's optimizer already is {cls.__name__}; kept as is.")
        return old
    groups = []
    for group in old.param_groups:
        new_group: dict[str, Any] = {"params": group["params"]}
        lr = float(group["lr"])
        initial = group.get("initial_lr")
        if client_lr is not None:
            factor = lr / float(initial) if initial is not None and float(initial) > 0 else 1.0
            lr = client_lr * factor
            initial = client_lr if initial is not None else None
        new_group["lr"] = lr
        if initial is not None:
            new_group["initial_lr"] = float(initial)
        groups.append(new_group)
    lr0 = groups[0]["lr"]
    new = cls(groups, lr=lr0, **optimizer_kwargs)
    for config in trainer.lr_scheduler_configs:
        scheduler = config.scheduler
        if getattr(scheduler, "optimizer", None) is old:
            scheduler.optimizer = new
            if client_lr is not None and hasattr(scheduler, "base_lrs"):
                scheduler.base_lrs = [client_lr for _ in new.param_groups]
            if hasattr(scheduler, "_last_lr"):
                scheduler._last_lr = [g["lr"] for g in new.param_groups]
            _track_step_for_schedulers(new)
    trainer.strategy.optimizers = [new]
    return new


class LocalAdaptiveClient(ClientAlgorithm):
    """The client half of Fed-LAMB / Fed-AMS (Karimi et al., Alg. 1, l. 5-6 and 14): each client of round r starts
    its local optimizer (a :class:`LocalAMSGrad`, installed by :class:`~lightning_fed.algorithms.fedlamb.FedLAMB` /
    :class:`~lightning_fed.algorithms.fedlamb.FedAMS` at fit start) from the broadcast moments — local step 0,
    v⁰ = v̂⁰ = v̂_r and m⁰ = 0 (or m̄_r under ``first_moment="average"``) — and, when its local work is over, sends
    its uncorrected second moment v_i^T (``extras["exp_avg_sq"]``; ``extras["exp_avg"]`` = m_i^T too when the
    server averages m), one tensor per parameter. A parameter the client never stepped reports the broadcast values.

    v̂_r and m̄_r are the state of the server half (:class:`MaxSecondMoment`, the server optimizer's only such
    stage), created as v̂_0 = ``initial_second_moment``·1 before the first client starts. Stateless as a client
    algorithm (``state_dim`` 0).

    Raises:
        ValueError: at fit start, no :class:`MaxSecondMoment` (or more than one) in the server optimizer's chain.
        RuntimeError: a client starts while the trainer's optimizer is not one :class:`LocalAMSGrad`.

    Example: the half alone, beside a server optimizer without its server half, is refused::

        >>> from lightning_fed.callbacks import FedAvg
        >>> LocalAdaptiveClient().check(FedAvg())
        Traceback (most recent call last):
        ...
        ValueError: LocalAdaptiveClient() (Fed-LAMB's client half) needs exactly one MaxSecondMoment (its server half) in FedAvg's `aggregators`; use FedLAMB or FedAMS.
    """

    def __init__(self) -> None:
        self._server: Any = None
        self._stage_index = -1

    def check(self, server: Any) -> None:
        """Bind to the server optimizer whose :class:`MaxSecondMoment` holds v̂ and m̄ (errors as in the class doc)."""
        stages = [i for i, s in enumerate(getattr(server, "aggregators", None) or ()) if isinstance(s, MaxSecondMoment)]
        if len(stages) != 1:
            raise ValueError(
                f"{self!r} (Fed-LAMB's client half) needs exactly one MaxSecondMoment (its server half) in "
                f"{type(server).__name__}'s `aggregators`; use FedLAMB or FedAMS."
            )
        self._server, self._stage_index = getattr(server, "composer", server), stages[0]  # the chain's state holder

    def moments(self, params: list[Tensor]) -> "MaxSecondMoment.State":
        """v̂_r and m̄_r on ``params``' device (created as v̂_0 in the server optimizer's chain state the first time):
        :meth:`MaxSecondMoment.moments`."""
        return self._server.aggregators[self._stage_index].moments(self._server, params)

    def fit_start(self, trainer: Any, server: Any) -> None:
        """Install the client optimizer of ``server`` (its ``client_optimizer_class``; nothing when it has none)
        before a checkpoint's optimizer state is restored and before the loop snapshots the hyper-parameters at
        the start of the first round (:meth:`install_optimizer`)."""
        if getattr(server, "client_optimizer_class", None) is not None:
            self.install_optimizer(trainer, server)

    @staticmethod
    def install_optimizer(trainer: Any, server: Any) -> "LocalAMSGrad":
        """:func:`install_client_optimizer` with ``server``'s ``client_optimizer_class``, ``client_lr`` and
        ``client_optimizer_kwargs()`` (:class:`~lightning_fed.algorithms.fedlamb.FedLAMB`'s, :class:`~lightning_fed.algorithms.fedlamb.FedAMS`'s).

        Raises:
            ValueError: as :func:`install_client_optimizer`.
        """
        return install_client_optimizer(trainer, server.client_optimizer_class, server.client_lr,
                                        server.client_optimizer_kwargs(), type(server).__name__)

    @staticmethod
    def _optimizer(module: Any) -> LocalAMSGrad:
        optimizers = list(module.trainer.optimizers)
        if len(optimizers) != 1 or not isinstance(optimizers[0], LocalAMSGrad):
            raise RuntimeError(
                f"Fed-LAMB's client half needs the client optimizer installed at fit start (a LocalAMSGrad); the "
                f"trainer has {[type(o).__name__ for o in optimizers]} — was FedLAMB/FedAMS passed to the trainer "
                "that runs `fit`?"
            )
        return optimizers[0]

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """Seed the (just cleared) client optimizer: step 0, v⁰ = v̂⁰ = v̂_r (Alg. 1, l. 6) and m⁰ = 0 or m̄_r."""
        params = context.parameters(module)  # the federated parameters, aligned with the moments
        moments = self.moments([p.detach() for p in params])
        optimizer = self._optimizer(module)
        index = {id(p): k for k, p in enumerate(params)}
        for group in optimizer.param_groups:
            for p in group["params"]:
                k = index.get(id(p))
                if k is None:
                    continue
                first = None if moments.first_moment is None else moments.first_moment[k]
                optimizer.state[p] = LocalAMSGrad.make_state(p, moments.second_moment[k], first)

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
        """``({"exp_avg_sq": [v_i^T]} (+ ``"exp_avg"``: [m_i^T]), None)`` — uncorrected, Alg. 1, l. 14."""
        params = context.parameters(module)
        moments = self._server.aggregator_state[self._stage_index]
        optimizer = self._optimizer(module)
        extras: dict[str, Any] = {"exp_avg_sq": []}
        if moments.first_moment is not None:
            extras["exp_avg"] = []
        for k, p in enumerate(params):
            state = optimizer.state.get(p) or {}
            v = state.get("exp_avg_sq")
            extras["exp_avg_sq"].append((moments.second_moment[k] if v is None else v).detach().clone())
            if "exp_avg" in extras:
                m = state.get("exp_avg")
                extras["exp_avg"].append((moments.first_moment[k] if m is None else m).detach().clone())
        return extras, None

    def settings(self) -> dict[str, Any]:
        return {}


#: Accepted values of ``first_moment``: m restarts at 0 every round, or the server broadcasts the clients' mean m.
FIRST_MOMENTS = ("reset", "average")


class LocalAdaptiveServer(ServerOptimizer):
    """Karimi et al., Algorithm 1, with the client optimizer left to subclasses (:class:`FedLAMB`,
    :class:`FedAMS`); not used directly.

    **Clients** (Alg. 1, l. 5-14). At fit start the callback replaces the module's client optimizer (whatever
    ``configure_optimizers`` returned, e.g. SGD) by ``client_optimizer_class`` over the same parameter groups,
    with learning rate α = ``client_lr`` or, if ``None``, the user's optimizer's learning rate per group
    (:meth:`install_client_optimizer`). Each client of round r starts from the global model θ̄_r (l. 5) with
    the optimizer state seeded by the client half
    (:class:`~lightning_fed.algorithms.fedlamb.LocalAdaptiveClient`): local step 0, v⁰ = v̂⁰ = v̂_r, the broadcast second
    moment (l. 6), and m⁰ = 0 (``first_moment="reset"``) or the broadcast m̄_r (``"average"``). It then takes its
    local steps (l. 7-13, :class:`~lightning_fed.algorithms.fedlamb.LocalAMSGrad`) and sends back its model
    and its uncorrected second moment v_i^T (l. 14; the client half
    :class:`~lightning_fed.algorithms.fedlamb.LocalAdaptiveClient`, ``ClientUpdate.extras``).

    **Server** (Alg. 1, l. 16): a composition ``ServerOptimizer(aggregators=[MaxSecondMoment(...)], rule=SGD(lr))``
    — the reducer :class:`~lightning_fed.algorithms.fedlamb.MaxSecondMoment` (:attr:`moment_stage`, whose state
    holds v̂ and m̄) and the server SGD rule — with w_i the aggregation weights (1/|S| by default, the paper's plain mean)::

        θ̄_{r+1} = θ̄_r + η·Σ_i w_i·(θ_i^T − θ̄_r)       (η = ``lr`` = 1: model averaging, as the paper)
        v̂_{r+1} = max(v̂_r, Σ_i w_i·v_i^T)               (v̂_0 = ``initial_second_moment`` = ε·1, l. 2)
        m̄_{r+1} = Σ_i w_i·m_i^T                          (only with ``first_moment="average"``)

    Server state: ``second_moment`` (v̂) and, with ``first_moment="average"``, ``first_moment`` (m̄); one tensor
    per parameter, checkpointed with the callback.

    Choices where Algorithm 1 is ambiguous (the alternatives are options):

    * **m across rounds** (l. 9 writes m_i^t without a round index): the bias correction 1 − β₁ᵗ of l. 9 counts
      t = 1..T within the round (l. 7), which is only a correction for an m restarted at 0, and clients of a
      cross-device cohort keep no state between rounds; so by default m restarts at 0 every round
      (``first_moment="reset"``). ``"average"`` broadcasts the clients' weighted mean final m instead (the
      bias correction still counts local steps).
    * **The ratio's denominator** (l. 11 writes v̂_r^t, defined nowhere else): by default the client runs
      AMSGrad's max v̂^t = max(v̂^{t−1}, v^t) from v̂^0 = v̂_r (``ratio_denominator="amsgrad"``, which keeps the
      denominator ≥ the broadcast v̂_r as the max of l. 16 intends); ``"broadcast"`` divides by the broadcast
      v̂_r for the whole round (then round 0 divides by √ε + ε: enormous steps for Fed-AMS).
    * **Bias corrections** (l. 9-10 overwrite m, v with their corrected values): read as Adam's temporaries;
      m, v are kept uncorrected, the max and the message to the server use uncorrected values (sending the
      corrected v^T would multiply v̂ by about β₂^T/(1 − β₂^T) every round). The correction of v, applied as the
      paper says (``bias_correction="both"``, default), also divides the broadcast-initialised v̂ by 1 − β₂ᵗ:
      early in rounds r ≥ 1 it shrinks the steps (up to √(1/(1 − β₂)) ≈ 32× at t = 1 for β₂ = 0.999).
      Without it (``"first_moment"``/``"none"``) v is under-estimated by 1 − β₂^(local steps so far) until some
      1/(1 − β₂) local steps have accumulated, so the first round's steps are up to 32× larger — Fed-AMS with
      α = 1e-3 diverged that way on Fashion-MNIST Hybrid+, and trained with ``"both"``. For Fed-LAMB with
      λ = 0 a per-tensor rescaling of p is normalised away, so the choice matters little.
    * l. 8 computes g at θ^0 and l. 10 uses v_{r−1,i}^t: read as θ^{t−1} and v^{t−1} (typos).
    * "Layers" are parameter tensors (a weight and its bias are two layers), as in LAMB implementations.

    Args:
        client_lr: α > 0 for every parameter group; ``None`` (default): the learning rate(s) of the module's own
            optimizer.
        beta1: β₁ in [0, 1) (default 0.9, the paper's Sec. 4).
        beta2: β₂ in [0, 1) (default 0.999, the paper's Sec. 4).
        eps: ε > 0 (default 1e-8).
        weight_decay: λ ≥ 0 (default 0; the paper tunes it in {0, 0.01, 0.1}).
        bias_correction: ``"both"`` (default, l. 9-10), ``"first_moment"`` or ``"none"``.
        ratio_denominator: ``"amsgrad"`` (default) or ``"broadcast"``.
        first_moment: ``"reset"`` (default) or ``"average"``.
        initial_second_moment: v̂_0 ≥ 0 (default ``None``: ε, Alg. 1, l. 2).
        lr: Server learning rate η > 0 (default 1: plain model averaging, l. 16).
        weighting: ``"uniform"`` (default, the paper's 1/n mean in l. 16) or ``"num_samples"``; used for both
            the models and the second moments.

    Raises:
        ValueError: an argument outside its range (the message names it and what is allowed).

    Example: the shared arguments and their checks (use :class:`FedLAMB` or :class:`FedAMS`)::

        >>> server = FedLAMB(client_lr=0.01, first_moment="average")
        >>> server.initial_second_moment, server.client_optimizer_class.__name__  # v̂_0 = ε by default
        (1e-08, 'FedLAMBClient')
        >>> FedAMS(first_moment="keep")
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `first_moment` must be one of ('reset', 'average'), got 'keep'.
        >>> FedAMS(beta2=1.0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `beta2` must be a number in [0, 1), got 1.0.
    """

    state_key_fields = ("lr", "client_lr", "beta1", "beta2", "eps", "weight_decay", "first_moment", "weighting")
    repr_fields = ("lr", "weighting", "client_lr", "beta1", "beta2", "eps", "weight_decay", "bias_correction",
                   "ratio_denominator", "first_moment", "initial_second_moment")

    #: The client optimizer class the callback installs.
    client_optimizer_class: type[LocalAMSGrad] = LocalAMSGrad

    def __init__(
        self,
        client_lr: Optional[float] = None,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        bias_correction: str = "both",
        ratio_denominator: str = "amsgrad",
        first_moment: str = "reset",
        initial_second_moment: Optional[float] = None,
        lr: float = 1.0,
        weighting: str = "uniform",
    ) -> None:
        #: The reducer stage (:class:`~lightning_fed.algorithms.fedlamb.MaxSecondMoment`): Δ, v̂ and m̄.
        self.moment_stage = MaxSecondMoment(owner=type(self).__name__)
        super().__init__(weighting=weighting, aggregators=[self.moment_stage], rule=SGD(lr))
        #: The client half: installs the client optimizer at fit start, seeds it, sends v_i^T back.
        self._own_client = [LocalAdaptiveClient()]
        self._own_aggregators = [self.moment_stage]  # its own chain: another one is refused at fit start
        self.client_lr = None if client_lr is None else check_positive("client_lr", client_lr)
        self.beta1 = check_unit_interval("beta1", beta1)
        self.beta2 = check_unit_interval("beta2", beta2)
        self.eps = check_positive("eps", eps)
        self.weight_decay = check_in_range("weight_decay", weight_decay, low=0.0, low_open=False)
        self.bias_correction = check_choice("bias_correction", bias_correction, BIAS_CORRECTIONS)
        self.ratio_denominator = check_choice("ratio_denominator", ratio_denominator, RATIO_DENOMINATORS)
        self.first_moment = check_choice("first_moment", first_moment, FIRST_MOMENTS)
        if initial_second_moment is None:
            initial_second_moment = self.eps
        self.initial_second_moment = check_in_range(
            "initial_second_moment", initial_second_moment, low=0.0, low_open=False
        )
        self.moment_stage.initial_second_moment = self.initial_second_moment
        self.moment_stage.average_first_moment = self.first_moment == "average"

    def _stage_state(self) -> MaxSecondMoment.State:
        fields = self.stage_state_fields(self.moment_stage)  # the live state, or the one loaded before it is re-made
        return MaxSecondMoment.State() if fields is None else MaxSecondMoment.State(**fields)

    @property
    def state(self) -> dict[str, list[Tensor]]:
        """``{"second_moment": v̂}`` plus ``"first_moment": m̄`` with ``first_moment="average"`` (the stage
        state's tensors; ``{}`` before the first client)."""
        st = self._stage_state()
        out = {} if st.second_moment is None else {"second_moment": st.second_moment}
        if st.first_moment is not None:
            out["first_moment"] = st.first_moment
        return out

    @state.setter
    def state(self, value: dict[str, list[Tensor]]) -> None:
        self.aggregator_state = (MaxSecondMoment.State(value.get("second_moment"), value.get("first_moment")),)

    # ------------------------------------------------------------------ the client optimizer
    def client_optimizer_kwargs(self) -> dict[str, Any]:
        """The client optimizer's hyper-parameters other than ``params`` and ``lr``."""
        return dict(
            betas=(self.beta1, self.beta2),
            eps=self.eps,
            weight_decay=self.weight_decay,
            bias_correction=self.bias_correction,
            ratio_denominator=self.ratio_denominator,
            initial_second_moment=self.initial_second_moment,
        )

    def install_client_optimizer(self, trainer: Any) -> LocalAMSGrad:
        """Replace the trainer's single optimizer by ``client_optimizer_class`` and return it (done by the client
        half at fit start: :meth:`LocalAdaptiveClient.install_optimizer
        <lightning_fed.algorithms.fedlamb.LocalAdaptiveClient.install_optimizer>`, where the rules are).

        Raises:
            ValueError: not exactly one optimizer, or one without parameters.
        """
        return self._own_client[0].install_optimizer(trainer, self)


class FedLAMB(LocalAdaptiveServer):
    """Fed-LAMB (Karimi, Li, Li, *Layerwise and Dimensionwise Locally Adaptive Optimization*, Algorithm 1).

    Clients run :class:`~lightning_fed.algorithms.fedlamb.FedLAMBClient` — local AMSGrad moments and the
    layerwise step θ^ℓ ← θ^ℓ − α·φ(‖θ^ℓ‖)·(p^ℓ + λθ^ℓ)/‖p^ℓ + λθ^ℓ‖ (l. 8-12) — from the global model and the
    broadcast second moment v̂_r; the server averages the models and sets v̂_{r+1} = max(v̂_r, mean_i v_i^T)
    (l. 16). The module's own ``configure_optimizers`` (e.g. SGD) is replaced at fit start; see
    :class:`LocalAdaptiveServer` for the whole rule, the choices made where the paper is ambiguous, and the
    shared arguments.

    Paper settings (Sec. 4): β₁ = 0.9, β₂ = 0.999, φ = identity, λ ∈ {0, 0.01, 0.1}, α tuned on a log grid,
    uniform averaging, 50 clients with half of them per round, batch size 32.

    Args:
        phi_min: γ_l ≥ 0 of φ(z) = min(max(z, γ_l), γ_u) (default 0; the paper's H4 asks φ ≥ φ_m > 0).
        phi_max: γ_u > 0 (default ``None``: ∞; φ = identity by default, as the paper's experiments).
        client_lr, beta1, beta2, eps, weight_decay, bias_correction, ratio_denominator, first_moment,
        initial_second_moment, lr, weighting: see :class:`LocalAdaptiveServer`.

    Raises:
        ValueError: an argument outside its range (the message names it).

    Example: one client, one local step from θ = [3, 4] with g = [−1, −2], α = 0.1 and the defaults (β₁ = 0.9,
    β₂ = 0.999, ε = v̂_0 = 1e-8), against l. 9-12 and 16 by hand::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Lin(L.LightningModule):  # loss −θ·x, so g = −x
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.theta = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         return -(self.theta * batch[0]).sum()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)  # replaced; its lr is α
        >>> dm = FederatedDataModule(TensorDataset(torch.tensor([[1.0, 2.0]], dtype=torch.float64)),
        ...                          partitioner=IIDPartitioner(num_clients=1), clients_per_round=1, batch_size=1)
        >>> model, server = Lin(), FedLAMB()
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[server], logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(model, datamodule=dm)
        >>> g = torch.tensor([-1.0, -2.0], dtype=torch.float64)
        >>> v = 0.999 * 1e-8 + 0.001 * g**2                     # l. 10 from v⁰ = v̂_0 = ε (max(v̂, v) = v)
        >>> p = (0.1 * g / 0.1) / ((v / 0.001).sqrt() + 1e-8)  # l. 11: m/(1 − β₁), v̂/(1 − β₂) at t = 1
        >>> theta = torch.tensor([3.0, 4.0], dtype=torch.float64)
        >>> theta - 0.1 * theta.norm() / p.norm() * p          # l. 12: θ − α·φ(‖θ‖)·p/‖p‖, ‖θ‖ = 5
        tensor([3.3536, 4.3536], dtype=torch.float64)
        >>> model.theta.detach()
        tensor([3.3536, 4.3536], dtype=torch.float64)
        >>> v_hat = torch.maximum(torch.full_like(v, 1e-8), v)  # l. 16: v̂_1 = max(v̂_0, v_1^T), one client
        >>> torch.allclose(server.state["second_moment"][0], v_hat, rtol=1e-12, atol=0)
        True
    """

    repr_fields = LocalAdaptiveServer.repr_fields + ("phi_min", "phi_max")
    repr_formats = {"phi_max": none_if_infinite}

    client_optimizer_class = FedLAMBClient

    def __init__(
        self,
        client_lr: Optional[float] = None,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        phi_min: float = 0.0,
        phi_max: Optional[float] = None,
        bias_correction: str = "both",
        ratio_denominator: str = "amsgrad",
        first_moment: str = "reset",
        initial_second_moment: Optional[float] = None,
        lr: float = 1.0,
        weighting: str = "uniform",
    ) -> None:
        super().__init__(
            client_lr=client_lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
            bias_correction=bias_correction, ratio_denominator=ratio_denominator, first_moment=first_moment,
            initial_second_moment=initial_second_moment, lr=lr, weighting=weighting,
        )
        self.phi_min, self.phi_max = check_phi_bounds(phi_min, phi_max)

    def client_optimizer_kwargs(self) -> dict[str, Any]:
        kwargs = super().client_optimizer_kwargs()
        kwargs.update(phi_min=self.phi_min, phi_max=none_if_infinite(self.phi_max))
        return kwargs


class FedAMS(LocalAdaptiveServer):
    """Fed-AMS, the baseline of Karimi et al. (Sec. 4): Algorithm 1 with plain local AMSGrad on the clients
    (:class:`~lightning_fed.algorithms.fedlamb.AMSGradClient`, θ ← θ − α·(p + λθ), no layerwise
    normalisation; the Local AMSGrad of Chen, Li, Li 2020), the same model averaging and v̂ max-averaging on
    the server. (Not the server-side AMSGrad that Wang et al. 2022 also call FedAMS.)

    See :class:`LocalAdaptiveServer` for the rule, the ambiguity choices and the arguments. The paper's
    settings: β₁ = 0.9, β₂ = 0.999, α tuned on a log grid.

    Example: one client, one local step from θ = [3, 4] with g = [−1, −2] and α = 0.1: the first AMSGrad step
    moves each coordinate by about α (|m̃/√ṽ| = |g|/|g|), against l. 9-11 by hand::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Lin(L.LightningModule):  # loss −θ·x, so g = −x
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.theta = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         return -(self.theta * batch[0]).sum()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)  # replaced; its lr is α
        >>> dm = FederatedDataModule(TensorDataset(torch.tensor([[1.0, 2.0]], dtype=torch.float64)),
        ...                          partitioner=IIDPartitioner(num_clients=1), clients_per_round=1, batch_size=1)
        >>> model, server = Lin(), FedAMS()
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[server], logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(model, datamodule=dm)
        >>> type(trainer.optimizers[0]).__name__
        'AMSGradClient'
        >>> g = torch.tensor([-1.0, -2.0], dtype=torch.float64)
        >>> v = 0.999 * 1e-8 + 0.001 * g**2
        >>> p = g / ((v / 0.001).sqrt() + 1e-8)
        >>> torch.allclose(model.theta, torch.tensor([3.0, 4.0], dtype=torch.float64) - 0.1 * p, rtol=0, atol=1e-12)
        True
        >>> model.theta.detach()
        tensor([3.1000, 4.1000], dtype=torch.float64)
    """

    client_optimizer_class = AMSGradClient
