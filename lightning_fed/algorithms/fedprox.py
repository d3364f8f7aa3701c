"""FedProx's client half (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Alg. 2): the
proximal term μ/2‖w − w_t‖² added to the client's objective. FedProx has no server half: any server optimizer
aggregates its clients (:class:`~lightning_fed.algorithms.fedprox.FedProx` is FedAvg with this client half)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from lightning_fed.checks import check_non_negative  # noqa: F401  (re-exported)
from lightning_fed.client.algorithm import ClientAlgorithm, optimizer_param_indices, stepped_indices  # noqa: F401  (re-exported)
from lightning_fed.callbacks.fedavg import FedAvg

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

    Example: FedProx clients under FedAdam (any server optimizer without its own client side), given to the trainer
    (YAML/CLI: ``trainer.client_algorithms``)::

        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.callbacks import FedAdam
        >>> trainer = FederatedTrainer(callbacks=[FedAdam(lr=0.01)], client_algorithms=[FedProxClient(mu=0.01)],
        ...                            logger=False, enable_checkpointing=False,
        ...                            enable_progress_bar=False, enable_model_summary=False)
        >>> trainer.client_algorithms
        [FedProxClient(mu=0.01)]
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


class FedProx(FedAvg):
    """FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Algorithm 2).

    Client k of round t approximately minimises (Alg. 2; the local objective of Sec. 3.2, Eq. (2))::

        h_k(w; w_t) = F_k(w) + μ/2·‖w − w_t‖²

    with the user's own ``training_step`` as F_k and its own optimizer as the local solver: at every local step,
    after the backward pass and before the optimizer step (Lightning's ``on_before_optimizer_step`` hook, which
    fires before gradient clipping and, under AMP, after unscaling), this callback adds the proximal gradient
    to each parameter's gradient::

        p.grad ← p.grad + μ·(p − p_t)          (p_t: the parameter's value in the global model x_t)

    so plain SGD with learning rate γ takes ``w ← w − γ·(∇F_k(w) + μ(w − w_t))``, the authors' local solver
    (``PerturbedGradientDescent`` in their code, github.com/litian96/FedProx, flearn/optimizer/pgd.py). The
    anchor w_t is the round's starting point x_t, sent to the client with its
    :class:`~lightning_fed.client.runner.ClientContext` (``context.global_params``). The server side is :class:`FedAvg`:
    x_{t+1} = x_t + η·Σ_k λ_k Δ_k.

    Choices where the paper leaves room:

    * Aggregation: Alg. 2 samples devices with probability p_k ∝ n_k and averages uniformly; the public code
      (flearn/trainers/fedbase.py: ``select_clients``, ``aggregate``) — and this framework's cohort sampling —
      draws devices uniformly and averages with weights ∝ n_k, which is ``weighting="num_samples"`` (the
      default); ``"uniform"`` gives the unweighted mean.
    * "γ-inexact minimiser": each client runs the local work its data module prescribes (epochs/steps, batch
      size; heterogeneous under e.g. :class:`~lightning_fed.datamodules.SampledLocalWork`) and all of it is
      aggregated — partial work is kept, never dropped, as FedProx does with stragglers (flearn/trainers/fedprox.py).
    * A parameter whose gradient is ``None`` at a step (not used by the loss, or frozen) gets no proximal
      gradient at that step, consistent with torch optimizers skipping such parameters.

    With μ = 0 this is :class:`FedAvg` exactly. Hyper-parameters: Li et al. tune μ over {0.001, 0.01, 0.1, 1};
    Zeng et al. 2024 (FedAWARE, App. C.1) over {0.01, 0.1, 1, 10} with η = 1. No server state.

    Args:
        mu: Proximal coefficient μ (>= 0).
        lr: Server learning rate η (> 0, default 1.0).
        weighting: ``"num_samples"`` (default) or ``"uniform"`` client weights.

    Raises:
        ValueError: ``mu`` not a finite number >= 0, ``lr`` not a finite number > 0, or an unknown ``weighting``.

    Example: one client fits y = w·x on x = [1, 2], y = [2, 4] (loss mean((w·x − y)²), ∇ = 2·mean(x(w·x − y)))
    from w_0 = 0 with two full-batch SGD steps of γ = 0.1, μ = 1, η = 1::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Line(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return ((self.w * x - y) ** 2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> data = TensorDataset(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64))
        >>> dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=1), clients_per_round=1,
        ...                          batch_size=2, local_epochs=2)
        >>> model = Line()
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[FedProx(mu=1.0)], logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(model, datamodule=dm)
        >>> w1 = 0 - 0.1 * (2 * (1 * (0 - 2) + 2 * (0 - 4)) / 2 + 1.0 * (0 - 0))  # step 1: ∇F = −10, w = w_t: no pull
        >>> w2 = w1 - 0.1 * (2 * (1 * (w1 - 2) + 2 * (2 * w1 - 4)) / 2 + 1.0 * (w1 - 0))  # step 2: ∇F = −5, μ(w − w_t) = 1
        >>> round(w1, 10), round(w2, 10), round(model.w.item(), 10)  # x_1 = x_0 + η·Δ = w2 (FedAvg would give 1.5)
        (1.0, 1.4, 1.4)
    """

    state_key_fields = ("lr", "mu", "weighting")
    repr_fields = ("mu", "lr", "weighting")

    def __init__(self, mu: float, lr: float = 1.0, weighting: str = "num_samples") -> None:
        super().__init__(lr=lr, weighting=weighting)
        self.mu = check_non_negative("mu", mu)
        self._own_client = [FedProxClient(self.mu)]  # the client half (lightning_fed.algorithms.fedprox)
