"""FedDyn: FedAvg (uniform mean, η = 1) with FedDyn's client half and its server half (both in
:mod:`lightning_fed.algorithms.feddyn`)."""

from __future__ import annotations

from typing import Optional

from lightning_fed.algorithms.feddyn import FedDynClient, FedDynCorrection
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.checks import check_positive


class FedDyn(FedAvg):
    """FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, Algorithm 1): the
    composition ``FedAvg(lr, weighting="uniform", aggregators=[FedDynCorrection(alpha)],
    client=[FedDynClient(alpha)])``; write that composition by hand to add client transforms (e.g. clipping) before
    the reducer, or give the two halves to another server rule.

    Client k of round t (cohort P_t, global model θ^{t−1}) runs its local work on the gradient
    ``∇L_k(θ) − g_k + α(θ − θ^{t−1})`` (Alg. 1's local objective L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2‖θ − θ^{t−1}‖²),
    then stores g_k ← g_k − α(θ_k^t − θ^{t−1}) (Alg. 1's local-gradient update); the server keeps h (zeros at the
    start) and takes::

        h   ← h − (α/N)·Σ_{k∈P_t} (θ_k^t − θ^{t−1})
        θ^t = θ^{t−1} + η·((1/|P_t|)·Σ_{k∈P_t} (θ_k^t − θ^{t−1}) − h/α)      (η = 1: θ^t = mean_k θ_k^t − h/α)

    N is the data module's ``num_clients``. Shapes: g_k is one flat vector of d numbers per client seen (d = the
    model's number of parameters, its dtype, kept on the CPU in the server optimizer's client-state table), h is one
    tensor per parameter on the model's device; both are checkpointed (``"client_algorithms"`` and
    ``"aggregators"`` in the server optimizer's state) and restored on resume. Conventions, and where the authors'
    code, Flower and FedLab differ: :mod:`lightning_fed.algorithms.feddyn`.

    Args:
        alpha: α (> 0, default 0.01, the authors' example value); Acar et al. search {0.1, 0.01, 0.001}.
        lr: Server learning rate η (> 0, default 1.0, Alg. 1; other values scale the corrected step).
        client: Further client algorithms, run after FedDyn's own (default ``None``).
        client_state_store: Where the g_k live: ``"memory"`` (default) or ``"disk"`` (one file per client row,
            checkpoints reference them; :class:`~lightning_fed.callbacks.ServerOptimizer`).
        client_state_dir: The ``"disk"`` store's directory (default ``None``: ``<default_root_dir>/client_state``).

    Raises:
        ValueError: ``alpha`` or ``lr`` not a finite number > 0, an unknown ``client_state_store``.

    Example: one client fits y = w·x on x = [1, 2], y = [2, 4] (loss mean((w·x − y)²), ∇ = 2·mean(x(w·x − y)))
    from w = 0, two full-batch SGD steps of γ = 0.1 per round, α = 0.5, N = 1::

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
        >>> model, server = Line(), FedDyn(alpha=0.5)
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[server], logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(model, datamodule=dm)
        >>> w1 = 0 - 0.1 * (-10 + 0.5 * (0 - 0))             # ∇L = 5w − 10; g = 0, θ^{t−1} = 0: w1 = 1
        >>> w2 = w1 - 0.1 * (5 * w1 - 10 + 0.5 * (w1 - 0))   # 1 + 0.1·4.5 = 1.45
        >>> h = 0 - 0.5 / 1 * (w2 - 0)                       # −0.725
        >>> round(w2 - h / 0.5, 10), round(model.w.item(), 10)  # θ^1 = mean θ_k − h/α = 2·w2
        (2.9, 2.9)
        >>> round(server.client_algorithm_states["FedDynClient"].get(0).item(), 10)  # g_0 = 0 − α(θ_0^1 − θ^0)
        -0.725
        >>> FedDyn(alpha=0)
        Traceback (most recent call last):
        ...
        ValueError: `alpha` must be a finite number > 0, got 0.
    """

    state_key_fields = ("lr", "alpha")
    repr_fields = ("alpha", "lr")

    def __init__(self, alpha: float = 0.01, lr: float = 1.0, client: Optional[list[ClientAlgorithm]] = None,
                 client_state_store: str = "memory", client_state_dir: Optional[str] = None) -> None:
        self.alpha = check_positive("alpha", alpha)
        super().__init__(lr=lr, weighting="uniform", aggregators=[FedDynCorrection(self.alpha)], client=client,
                         client_state_store=client_state_store, client_state_dir=client_state_dir)
        self._own_client = [FedDynClient(self.alpha)]  # the client half (lightning_fed.algorithms.feddyn)
