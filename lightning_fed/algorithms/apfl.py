"""APFL (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv 2003.13461, 2020, Algorithm 1 and
eq. (10)): every client i keeps a local model v_i and a mixing weight α_i; its personal model is the mixture
v̄_i = α_i·v_i + (1 − α_i)·w of v_i and the global model w, and both w (federated) and v_i (local) are trained.

Algorithm 1 (client i ∈ U_t, local step with mini-batch ξ, step size η; every quantity on the right at the step's
start)::

    w_i ← w_i − η·∇f_i(w_i; ξ)                                                    (the global model's local step)
    v_i ← v_i − η·∇_v f_i(v̄_i; ξ),   ∇_v f_i(v̄_i) = α_i·∇f_i(v̄_i; ξ)            (the local model's step)
    α_i ← α_i − η_α·⟨v_i − w_i, ∇f_i(v̄_i; ξ)⟩                                       (eq. (10), adaptive α)
    v̄_i = α_i·v_i + (1 − α_i)·w_i
    every τ steps:  w = (1/|U_t|)·Σ_{j∈U_t} w_j                                      (the server's uniform mean)

Here the τ local steps are the client's local work of a round and the w step is the client optimizer's step (plain
SGD with the client learning rate η is the paper's); :class:`APFLClient` does the v and α steps in
``before_optimizer_step`` on the step's own mini-batch (:class:`~lightning_fed.client.personal_grad.StepBatches`),
with ∇f_i(v̄_i; ξ) from the module's ``training_step`` at v̄_i
(:func:`~lightning_fed.client.personal_grad.loss_gradient_at`). (v_i, α_i) is the client's per-client state (the
model's size plus one). The server step is any server rule over w; :class:`~lightning_fed.algorithms.apfl.APFL` is
FedAvg with the uniform mean. The personal model of client i (``fed_personal_<m>``) is v̄_i = α_i·v_i + (1 − α_i)·w
with the current global model w (Alg. 1's output).

Choices the paper leaves open or that differ from it:

* α_i is projected onto [0, 1] after each step (it is a mixing weight; the authors' code, FedTorch ``alpha_update``,
  clips it so too, and also adds 0.02·α_i to its gradient, a term not in eq. (10) and not added here); η_α is
  ``alpha_lr`` (default: the client learning rate η, as eq. (10)); ``adaptive=False`` keeps α_i fixed (the paper's
  APFL with a fixed α);
* a client sampled for the first time starts v_i from the global model it receives (w^t) and α_i from ``alpha``;
* the authors' code (FedTorch) updates w first and v with the updated w, and α once per round; Alg. 1's updates,
  implemented here, are simultaneous (every right-hand side at the step's start);
* buffers (BatchNorm statistics) are the global model's during the step at v̄_i and are put back afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.checks import ArgumentError, check_in_range, check_positive
from lightning_fed.client.algorithm import ClientAlgorithm, flat, unflat
from lightning_fed.client.personal_grad import StepBatches, loss_gradient_at, parameter_names, parameters_named
from lightning_fed.server.aggregators.base import Stage

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext

__all__ = ["APFL", "APFLClient"]


class APFLClient(ClientAlgorithm):
    """APFL's client half (Deng et al. 2020, Alg. 1, eq. (10)): at every local step, besides the global model's
    own step, the local model v_i and the mixing weight α_i step on the same mini-batch at the mixed model v̄_i.

    Args:
        alpha: α_i of a client's first round, in [0, 1) (default 0.25; the paper's experiments start at 0.25 and
            also report fixed α ∈ {0.25, 0.5, 0.75}; α = 1 would be a purely local model, not APFL).
        adaptive: update α_i by eq. (10) (default ``True``); ``False`` keeps every α_i at ``alpha``.
        lr: η of the v_i steps (> 0; default ``None``: the round's client learning rate).
        alpha_lr: η_α of the α_i steps (> 0; default ``None``: the round's client learning rate).

    Raises:
        ValueError: ``alpha`` not in [0, 1), ``lr`` / ``alpha_lr`` not a finite number > 0, ``adaptive`` not a bool;
            in a fit, a half run outside the federated loop (no client batches).

    Example::

        >>> APFLClient(alpha=0.5, adaptive=False)
        APFLClient(alpha=0.5, adaptive=False, lr=None, alpha_lr=None)
    """

    def __init__(self, alpha: float = 0.25, adaptive: bool = True, lr: Optional[float] = None,
                 alpha_lr: Optional[float] = None) -> None:
        self.alpha = check_in_range("alpha", alpha, low=0.0, low_open=False, high=1.0)
        if not isinstance(adaptive, bool):
            raise ArgumentError(f"`adaptive` must be a bool, got {adaptive!r}.")
        self.adaptive = adaptive
        self.lr = None if lr is None else check_positive("lr", lr)
        self.alpha_lr = None if alpha_lr is None else check_positive("alpha_lr", alpha_lr)
        self._names: Optional[list[str]] = None  # the federated parameters' names (v_i covers them only)
        self._params: list[Tensor] = []
        self._v: list[Tensor] = []
        self._mix = 0.0
        self._batches: Optional[StepBatches] = None
        self._eta = self._eta_alpha = 0.0

    def state_dim(self, num_params: int) -> int:
        """(v_i, α_i): one number per federated parameter entry, and α_i last."""
        return num_params + 1

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """Load (v_i, α_i) (``None``: the client's first round, v_i = w^t and α_i = ``alpha``)."""
        self._params = context.parameters(module)
        self._names = parameter_names(module, self._params)
        if state is None:
            self._v = [p.detach().clone() for p in self._params]
            self._mix = self.alpha
        else:
            self._v = unflat(state[:-1], self._params)
            self._mix = float(state[-1])
        self._batches = StepBatches(context, type(self).__name__)
        self._eta = context.client_lr if self.lr is None else self.lr
        self._eta_alpha = context.client_lr if self.alpha_lr is None else self.alpha_lr

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """The v_i and α_i steps of Alg. 1 / eq. (10) at this step's w_i (the module) and mini-batch."""
        if self._batches is None:
            return
        batch_idx, batch = self._batches.next()
        alpha = self._mix
        with torch.no_grad():
            w = [p.detach() for p in self._params]
            mixed = [alpha * v + (1.0 - alpha) * wi for v, wi in zip(self._v, w)]
        g = loss_gradient_at(module, self._params, mixed, batch, batch_idx)
        if g is None:
            return
        with torch.no_grad():
            if self.adaptive:
                inner = sum(float(((v - wi) * gi).sum()) for v, wi, gi in zip(self._v, w, g))
                self._mix = min(1.0, max(0.0, alpha - self._eta_alpha * inner))
            self._v = [v - self._eta * alpha * gi for v, gi in zip(self._v, g)]

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
        """The new (v_i, α_i)."""
        state = torch.cat([flat(self._v), torch.tensor([self._mix], dtype=self._v[0].dtype)])
        self._batches, self._v = None, []
        return {}, state

    def personal_model(self, module: Any, state: Optional[Tensor]) -> None:
        """``module`` (the global model w) becomes client i's personal model v̄_i = α_i·v_i + (1 − α_i)·w in place
        (``None``: never trained, the global model)."""
        if state is None:
            return
        params = parameters_named(module, self._names)
        alpha = float(state[-1])
        with torch.no_grad():
            for p, v in zip(params, unflat(state[:-1], params)):
                p.copy_(alpha * v + (1.0 - alpha) * p)


class APFL(FedAvg):
    """APFL (Deng et al. 2020, Alg. 1): FedAvg (the uniform mean over the round's clients) whose clients also train
    a local model v_i and a mixing weight α_i (see :mod:`lightning_fed.algorithms.apfl`).

    Args:
        alpha: α_i of a client's first round (default 0.25).
        adaptive: update α_i by eq. (10) (default ``True``).
        personal_lr: η of the v_i steps (default ``None``: the client learning rate).
        alpha_lr: η_α of the α_i steps (default ``None``: the client learning rate).
        lr: Server learning rate (default 1.0).
        weighting: ``"uniform"`` (default, Alg. 1) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after APFL's (default ``None``).

    Example::

        >>> APFL(alpha=0.5).client_algorithms
        [APFLClient(alpha=0.5, adaptive=True, lr=None, alpha_lr=None)]
    """

    repr_fields = ("alpha", "adaptive", "personal_lr", "alpha_lr", "lr", "weighting")
    #: The client half a CLI swap of the server optimizer carries into ``trainer.client_algorithms`` (its argument:
    #: this class's).
    carried_client_half = ("APFLClient", {"alpha": "alpha", "adaptive": "adaptive", "lr": "personal_lr",
                                          "alpha_lr": "alpha_lr"})

    def __init__(self, alpha: float = 0.25, adaptive: bool = True, personal_lr: Optional[float] = None,
                 alpha_lr: Optional[float] = None, lr: float = 1.0, weighting: str = "uniform",
                 aggregators: Optional[list[Stage]] = None, client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [APFLClient(alpha, adaptive, personal_lr, alpha_lr)]
        self.alpha, self.adaptive = self._own_client[0].alpha, adaptive
        self.personal_lr, self.alpha_lr = personal_lr, alpha_lr
