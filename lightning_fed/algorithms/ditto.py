"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021,
Algorithm 1): the global model is trained as in FedAvg, and every client also keeps a personal model v_k, trained on
its own data towards the global model by a proximal term λ/2‖v_k − w^t‖².

Algorithm 1 (round t, cohort S_t, s local iterations, step size η)::

    server sends w^t to every k ∈ S_t
    client k:  w_k^t = the local solver of G (FedAvg's local SGD) started from w^t                      (l. 5)
               for s local iterations:  v_k ← v_k − η·(∇F_k(v_k) + λ(v_k − w^t))                        (l. 6-7)
               send Δ_k^t = w_k^t − w^t                                                                 (l. 8)
    server:    w^{t+1} = w^t + (1/|S_t|)·Σ_{k∈S_t} Δ_k^t                                                (l. 10)

Here l. 5 is the client's ordinary local work of the round (its optimizer, batches and steps); l. 6-7 run in
:class:`DittoClient`'s ``finish``, over the same batches again (``ClientContext.client_batches``), one plain gradient
step per batch with :func:`~lightning_fed.client.personal.personal_step` — the module's own ``training_step``, its
``self.log`` calls and torchmetrics states kept apart from the round's values — so s is the client's number of
local steps. v_k is the client's per-client state (one vector of the model's size). Buffers (BatchNorm statistics)
are the global model's during the personal steps and are put back afterwards. l. 10 is any server rule;
:class:`~lightning_fed.algorithms.ditto.Ditto` is FedAvg with the uniform mean of l. 10. The personal model of
client k (for ``fed_personal_<m>`` and :func:`lightning_fed.personal.personal_model`) is v_k.

Where v_k starts, the first time client k is sampled (``personal_init``; Alg. 1 leaves it open):

* ``"global"`` (default): from w^t, the global model it receives that round;
* ``"initial"``: from w^0, as the authors' code (github.com/litian96/ditto, every client's personal model is made
  from the initial model at start). w^0 is kept by the server half :class:`DittoInitialModel` (an aggregator stage
  that only holds it, recorded from x_0 by the first client of round 0 and checkpointed with the chain's state, so
  a resumed run equals the uninterrupted one); :class:`Ditto` adds it, and another server rule takes it in its
  ``aggregators`` (e.g. ``FedAdam(aggregators=[DittoInitialModel(), WeightedMean()])``), refused at fit start
  without it.

Where this differs from the paper:

* l. 6-7's s local iterations are one step per batch of the client's local work of the round (its batches again,
  in the same order), with plain gradient steps of size η (``lr``; default the client's learning rate γ);
* v_k starts from w^t by default (see ``personal_init`` above: ``"initial"`` is the authors' w^0);
* partial participation: only the round's cohort updates its v_k (the paper's Alg. 1 does the same for S_t);
* the personal steps see the global model's buffers (BatchNorm statistics), which are not personalised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.client.algorithm import ClientAlgorithm, flat, unflat
from lightning_fed.client.personal import personal_step
from lightning_fed.checks import check_choice, check_non_negative, check_positive
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, WeightedMean

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext

__all__ = ["Ditto", "DittoClient", "DittoInitialModel", "PERSONAL_INITS"]

#: Where a client's personal model starts the first time it is sampled: ``"global"`` (w^t) or ``"initial"`` (w^0).
PERSONAL_INITS = ("global", "initial")


class DittoInitialModel(Stage):
    """Ditto's server half for ``personal_init="initial"``: holds w^0, the initial global model, for the clients
    sampled later (a client transform that leaves the round's updates as they are; its state is only w^0, saved
    with the chain's state in every checkpoint).

    The :class:`State` holds ``initial``: w^0 as one tensor per federated parameter (``None`` until the first client
    of round 0 records it, :meth:`initial_model`).

    Example::

        >>> stage = DittoInitialModel()
        >>> state = stage.init_state([torch.zeros(2)], 4)
        >>> state.initial is None, stage.apply("the round's updates", state, None) == ("the round's updates", state)
        (True, True)
    """

    kind = "transform"
    #: After a server step a checkpoint must hold w^0 (a resume without it would start later clients elsewhere).
    required_fields = ("initial",)

    class State(NamedTuple):
        """w^0 (one tensor per federated parameter; ``None`` before round 0's first client)."""

        initial: Optional[list[Tensor]] = None

    def init_state(self, params: list[Tensor], num_clients: int) -> "DittoInitialModel.State":
        return self.State(None)

    def check_fit(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """At fit start: the run has a :class:`DittoClient` with ``personal_init="initial"`` (without one nothing
        records w^0, and a checkpoint could not be resumed).

        Raises:
            ValueError: no such half, naming the stage, the server optimizer and the half to give.
        """
        if not any(isinstance(a, DittoClient) and a.personal_init == "initial" for a in server.client_algorithms):
            raise ValueError(
                f"DittoInitialModel in {type(server).__name__}'s `aggregators` keeps w^0 for "
                "DittoClient(personal_init='initial'), which this run does not have: drop it from `aggregators`, or "
                "give that client half (or use Ditto(personal_init='initial'))."
            )

    def apply(self, x: ClientDeltas, state: "DittoInitialModel.State", info: RoundInfo) -> tuple[Any, "DittoInitialModel.State"]:
        """The round's updates unchanged; w^0 kept."""
        return x, state

    def initial_model(self, server: Any, global_params: list[Tensor]) -> list[Tensor]:
        """w^0 from ``server``'s chain state, on ``global_params``' devices; recorded as ``global_params`` (x_t) when
        none is held yet and the server has not stepped (t = 0: x_0 = w^0).

        Raises:
            RuntimeError: no w^0 held after a server step (a run resumed from a checkpoint saved without this stage).
        """
        index = next(i for i, s in enumerate(server.aggregators) if s is self)
        states = list(server.chain_state(global_params))
        initial = states[index].initial
        if initial is None:
            if server.num_steps > 0:
                raise RuntimeError(
                    "DittoClient(personal_init='initial') needs w^0, the initial global model, which DittoInitialModel "
                    f"records in round 0; this run is at server step {server.num_steps} without it (resumed from a "
                    "checkpoint of a run without personal_init='initial'?). Resume with the run's own settings."
                )
            initial = [p.detach().clone() for p in global_params]
            states[index] = states[index]._replace(initial=initial)
            server.aggregator_state = tuple(states)
        return [w.to(device=p.device, dtype=p.dtype) for w, p in zip(initial, global_params)]


def check_ditto_initial(server: Any) -> Optional[DittoInitialModel]:
    """At fit start: a :class:`DittoClient` with ``personal_init="initial"`` has :class:`DittoInitialModel` in
    ``server.aggregators``; returns that stage (``None`` when the run has no such half).

    Raises:
        ValueError: the stage missing, naming the half, the server optimizer and the ``aggregators`` to give.

    Example::

        >>> from lightning_fed.callbacks import FedAdam
        >>> server = FedAdam()
        >>> server.bind_client_algorithms([DittoClient(personal_init="initial")])  # the run's halves, at fit start
        >>> check_ditto_initial(server)
        Traceback (most recent call last):
        ...
        ValueError: DittoClient(lam=0.1, lr=None, personal_init='initial') starts each personal model from w^0, which Ditto's server half DittoInitialModel keeps: give FedAdam `aggregators=[DittoInitialModel(), WeightedMean()]` (or use Ditto(personal_init='initial')).
    """
    halves = [a for a in getattr(server, "client_algorithms", ()) if isinstance(a, DittoClient)
              and a.personal_init == "initial"]
    stage = next((s for s in getattr(server, "aggregators", None) or () if isinstance(s, DittoInitialModel)), None)
    if halves and stage is None:
        raise ValueError(
            f"{halves[0]!r} starts each personal model from w^0, which Ditto's server half DittoInitialModel keeps: "
            f"give {type(server).__name__} `aggregators=[DittoInitialModel(), WeightedMean()]` (or use "
            "Ditto(personal_init='initial'))."
        )
    return stage if halves else None


class DittoClient(ClientAlgorithm):
    """Ditto's client half (Li et al. 2021, Alg. 1, l. 6-7): after the client's local work on the global model, its
    personal model v_k takes one step v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w^t)) per local batch of the round.

    Args:
        lam: λ (≥ 0), the pull of the personal models towards the global model (the paper tunes λ ∈ {0.01, 0.1,
            1, 2}; λ = 0 trains purely local models).
        lr: η, the personal step size (> 0; default ``None``: the round's client learning rate γ).
        personal_init: Where v_k starts the first time client k is sampled: ``"global"`` (default, w^t) or
            ``"initial"`` (w^0, the authors' code; needs :class:`DittoInitialModel` in the server's chain).

    Raises:
        ValueError: ``lam`` not a finite number ≥ 0, ``lr`` not a finite number > 0, ``personal_init`` not one of
            :data:`PERSONAL_INITS`; at fit start, ``"initial"`` without :class:`DittoInitialModel`
            (:func:`check_ditto_initial`); a half run outside the federated loop (no client batches).

    Example::

        >>> DittoClient(lam=0.1)
        DittoClient(lam=0.1, lr=None)
        >>> DittoClient(lam=0.1, personal_init="initial")
        DittoClient(lam=0.1, lr=None, personal_init='initial')
    """

    def __init__(self, lam: float = 0.1, lr: Optional[float] = None, personal_init: str = "global") -> None:
        self.lam = check_non_negative("lam", lam)
        self.lr = None if lr is None else check_positive("lr", lr)
        self.personal_init = check_choice("personal_init", personal_init, PERSONAL_INITS)
        self._state: Optional[Tensor] = None
        self._names: Optional[list[str]] = None  # the federated parameters' names (v_k covers them only)
        self._server: Any = None  # with personal_init="initial": the server side holding DittoInitialModel's state
        self._initial_stage: Optional[DittoInitialModel] = None

    def settings(self) -> dict[str, Any]:
        out = {"lam": self.lam, "lr": self.lr}
        return out if self.personal_init == "global" else {**out, "personal_init": self.personal_init}

    def check(self, server: Any) -> None:
        """With ``personal_init="initial"``: :func:`check_ditto_initial`, then remember where w^0 is kept."""
        stage = check_ditto_initial(server) if self.personal_init == "initial" else None
        self._initial_stage = stage
        self._server = getattr(server, "composer", server) if stage is not None else None

    def state_dim(self, num_params: int) -> int:
        """v_k: one number per model parameter."""
        return num_params

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """Remember v_k (``None``: the client's first round, v_k starts from w^t, or w^0 with
        ``personal_init="initial"``)."""
        self._state = state
        if state is None and self._initial_stage is not None:
            self._state = flat(self._initial_stage.initial_model(self._server, list(context.global_params)))
        federated = {id(p) for p in context.parameters(module)}
        self._names = [n for n, p in module.named_parameters() if id(p) in federated]

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
        """l. 6-7 on the client's batches of the round; the module is back at w_k^t afterwards. Returns the new v_k."""
        if context.client_batches is None:
            raise RuntimeError("DittoClient needs the client's batches (ClientContext.client_batches); it runs only "
                               "inside the federated loop.")
        params = context.parameters(module)  # the federated parameters, aligned with w^t
        buffers = list(module.buffers())
        anchor = context.global_params  # w^t
        eta = context.client_lr if self.lr is None else self.lr
        with torch.no_grad():
            local = [p.detach().clone() for p in params]  # w_k^t, sent to the server
            saved_buffers = [b.detach().clone() for b in buffers]
            grads = [p.grad for p in params]
            start = anchor if self._state is None else unflat(self._state, params)
            for p, v in zip(params, start):
                p.copy_(v)
        try:
            for batch_idx, batch in enumerate(context.client_batches()):
                for p in params:
                    p.grad = None
                with torch.enable_grad():
                    loss = personal_step(module, batch, batch_idx)
                if loss is None:
                    continue
                loss.backward()
                with torch.no_grad():
                    for p, w in zip(params, anchor):
                        g = p.grad if p.grad is not None else torch.zeros_like(p)
                        p.sub_(g + self.lam * (p - w), alpha=eta)  # v − η(∇F_k(v) + λ(v − w^t))
            new_state = flat(params)
        finally:
            with torch.no_grad():
                for p, w, g in zip(params, local, grads):
                    p.copy_(w)
                    p.grad = g
                for b, saved in zip(buffers, saved_buffers):
                    b.copy_(saved)
        self._state = None
        return {}, new_state

    def personal_model(self, module: Any, state: Optional[Tensor]) -> None:
        """``module`` (the global model) becomes client k's personal model v_k in place (``None``: never trained,
        the global model). v_k covers the federated parameters: those of the fit (after a fit), else — the half
        only loaded from a checkpoint — every parameter, or those that require gradients when v_k is that size.

        Raises:
            ValueError: a ``state`` whose size matches neither (naming both sizes)."""
        if state is not None:
            named = dict(module.named_parameters())
            params = [named[n] for n in self._names] if self._names is not None else list(module.parameters())
            if self._names is None and sum(p.numel() for p in params) != state.numel():
                params = [p for p in params if p.requires_grad]  # frozen parameters are not federated
                if sum(p.numel() for p in params) != state.numel():
                    raise ValueError(
                        f"DittoClient's personal model v_k holds {state.numel()} numbers, but {type(module).__name__} "
                        f"has {sum(p.numel() for p in module.parameters())} parameter entries "
                        f"({sum(p.numel() for p in params)} trainable): another model than the run's?"
                    )
            with torch.no_grad():
                for p, v in zip(params, unflat(state, params)):
                    p.copy_(v)


class Ditto(FedAvg):
    """Ditto (Li et al., ICML 2021, Alg. 1): FedAvg (the uniform mean of l. 10) whose clients also train a personal
    model v_k towards the global one (see :mod:`lightning_fed.algorithms.ditto`).

    Args:
        lam: λ (≥ 0, default 0.1).
        personal_lr: η of the personal steps (default ``None``: the client learning rate).
        lr: Server learning rate (default 1.0).
        weighting: ``"uniform"`` (default, Alg. 1, l. 10) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after Ditto's (default ``None``).
        personal_init: Keyword only (the positional order of the arguments above is unchanged): ``"global"``
            (default: v_k starts from w^t) or ``"initial"`` (from w^0, the authors' code; adds
            :class:`DittoInitialModel` before the chain, ``aggregators`` or the weighted mean).

    Example::

        >>> Ditto(lam=0.5).client_algorithms
        [DittoClient(lam=0.5, lr=None)]
        >>> Ditto(lam=0.5, personal_init="initial").aggregators
        [DittoInitialModel(), WeightedMean()]
    """

    repr_fields = ("lam", "personal_lr", "personal_init", "lr", "weighting")
    repr_hidden = {"personal_init": "global"}

    def __init__(self, lam: float = 0.1, personal_lr: Optional[float] = None, lr: float = 1.0,
                 weighting: str = "uniform", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None, *, personal_init: str = "global") -> None:
        half = DittoClient(lam, personal_lr, personal_init)
        if half.personal_init == "initial":
            aggregators = [DittoInitialModel(), *(aggregators if aggregators is not None else [WeightedMean()])]
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [half]
        self.lam, self.personal_lr, self.personal_init = half.lam, personal_lr, half.personal_init
