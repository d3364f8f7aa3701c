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
local steps. v_k is the client's per-client state (one vector of the model's size); a client sampled for the first
time starts v_k from w^t (the authors' code starts every v_k from w^0; w^t keeps a resumed run equal to the
uninterrupted one without storing w^0). Buffers (BatchNorm statistics) are the global model's during the personal
steps and are put back afterwards. l. 10 is any server rule; :class:`~lightning_fed.algorithms.ditto.Ditto` is FedAvg with
the uniform mean of l. 10. The personal model of client k (for ``fed_personal_<m>``) is v_k.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from lightning_fed.client.algorithm import ClientAlgorithm, flat, unflat
from lightning_fed.client.personal import personal_step
from lightning_fed.checks import check_non_negative, check_positive
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.server.aggregators.base import Stage

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext

__all__ = ["Ditto", "DittoClient"]


class DittoClient(ClientAlgorithm):
    """Ditto's client half (Li et al. 2021, Alg. 1, l. 6-7): after the client's local work on the global model, its
    personal model v_k takes one step v_k ← v_k − η(∇F_k(v_k) + λ(v_k − w^t)) per local batch of the round.

    Args:
        lam: λ (≥ 0), the pull of the personal models towards the global model (the paper tunes λ ∈ {0.01, 0.1,
            1, 2}; λ = 0 trains purely local models).
        lr: η, the personal step size (> 0; default ``None``: the round's client learning rate γ).

    Raises:
        ValueError: ``lam`` not a finite number ≥ 0, ``lr`` not a finite number > 0; at fit start, a half run
            outside the federated loop (no client batches).

    Example::

        >>> DittoClient(lam=0.1)
        DittoClient(lam=0.1, lr=None)
    """

    def __init__(self, lam: float = 0.1, lr: Optional[float] = None) -> None:
        self.lam = check_non_negative("lam", lam)
        self.lr = None if lr is None else check_positive("lr", lr)
        self._state: Optional[Tensor] = None
        self._names: Optional[list[str]] = None  # the federated parameters' names (v_k covers them only)

    def state_dim(self, num_params: int) -> int:
        """v_k: one number per model parameter."""
        return num_params

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """Remember v_k (``None``: the client's first round, v_k starts from w^t)."""
        self._state = state
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
        the global model)."""
        if state is not None:
            named = dict(module.named_parameters())
            params = [named[n] for n in self._names] if self._names is not None else list(module.parameters())
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

    Example::

        >>> Ditto(lam=0.5).client_algorithms
        [DittoClient(lam=0.5, lr=None)]
    """

    repr_fields = ("lam", "personal_lr", "lr", "weighting")

    def __init__(self, lam: float = 0.1, personal_lr: Optional[float] = None, lr: float = 1.0,
                 weighting: str = "uniform", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [DittoClient(lam, personal_lr)]
        self.lam, self.personal_lr = self._own_client[0].lam, personal_lr
