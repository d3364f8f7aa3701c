"""FedProx's client half (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Alg. 2): the
proximal term μ/2‖w − w_t‖² added to the client's objective. FedProx has no server half: any server optimizer
aggregates its clients (:class:`~lightning_fed.callbacks.FedProx` is FedAvg with this client half)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from lightning_fed.checks import check_non_negative  # noqa: F401  (re-exported)
from lightning_fed.client.algorithm import ClientAlgorithm, optimizer_param_indices, stepped_indices  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext


class FedProxClient(ClientAlgorithm):
    """FedProx's client half: client k of round t approximately minimises
    h_k(w; w_t) = F_k(w) + μ/2·‖w − w_t‖² (Li et al. 2020, Alg. 2; Sec. 3.2, Eq. (2)).

    With the user's own ``training_step`` as F_k and its own optimizer as the local solver: at every local step, after
    the backward pass and before the optimizer step (before gradient clipping; under AMP after unscaling), the
    proximal gradient is added to each parameter's gradient::

        p.grad ← p.grad + μ·(p − p_t)          (p_t: the parameter's value in the global model x_t)

    so SGD with learning rate γ takes ``w ← w − γ·(∇F_k(w) + μ(w − w_t))``, the authors' local solver
    (``PerturbedGradientDescent``, github.com/litian96/FedProx, flearn/optimizer/pgd.py). A parameter whose gradient
    is ``None`` at a step (unused, frozen) gets no proximal gradient, as torch optimizers skip it. μ = 0 changes
    nothing. Stateless.

    Args:
        mu: Proximal coefficient μ (>= 0). Li et al. tune μ over {0.001, 0.01, 0.1, 1}.

    Raises:
        ValueError: ``mu`` not a finite number >= 0.

    Example: FedProx clients under FedAdam (any server optimizer without its own client side)::

        >>> from lightning_fed.callbacks import FedAdam
        >>> FedAdam(lr=0.01, client=[FedProxClient(mu=0.01)])
        FedAdam(lr=0.01, weighting='num_samples', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi', client=[FedProxClient(mu=0.01)])
    """

    def __init__(self, mu: float) -> None:
        self.mu = check_non_negative("mu", mu)
        self._params: list[Tensor] = []
        self._index: dict[int, int] = {}
        self._anchor: Optional[list[Tensor]] = None

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """Anchor the proximal term at x_t (``context.global_params``) for this client's local steps."""
        self._params = context.parameters(module)  # the federated parameters, aligned with x_t
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._anchor = context.global_params

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """Add μ·(p − p_t) to the gradient of every parameter ``optimizer`` is about to update."""
        if self._anchor is None or self.mu == 0.0:
            return
        stepped = stepped_indices(optimizer, self._params, self._index)
        if not stepped:
            return
        with torch.no_grad():
            grads = [self._params[i].grad for i in stepped]
            drift = torch._foreach_sub([self._params[i].detach() for i in stepped], [self._anchor[i] for i in stepped])
            torch._foreach_add_(grads, drift, alpha=self.mu)  # ∇F_k(w) + μ(w − w_t)

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
        """Detach the anchor; nothing is sent beyond the ordinary Δ_i."""
        self._anchor = None
        return {}, None
