"""FedBABU (Oh, Kim, Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification", ICLR 2022,
Algorithm 1): only the body (extractor) is trained and aggregated during federated training; the head (classifier)
stays at its random initialisation and is never updated; each client fine-tunes for personalisation at evaluation.

Algorithm 1 (round k, cohort C^k, τ local epochs)::

    θ_G^0 = (θ_G,ext^0, θ_G,cls^0)                                                       (initialisation)
    client i ∈ C^k:  θ_i,ext^k = ClientBodyUpdate(θ_G,ext^k, θ_G,cls^0)                    (clients)
        ClientBodyUpdate: τ local epochs, at each mini-batch b
                          θ_ext ← θ_ext − η·∇_θext L(θ_ext, θ_cls^0; b)   (the head fixed)   (local steps)
    server:  θ_G,ext^{k+1} = Σ_i (n_i / n)·θ_i,ext^k                                      (server)
    evaluation: client i fine-tunes (θ_G,ext^K, θ_G,cls^0) on its own training data for τ_f epochs

Here a client's local work of a round is ClientBodyUpdate: :class:`FedBABUClient` drops the head's gradients (``grad
= None``) before every local step of the client optimizer, which then skips the head, so the head's Δ_i is 0 and the
global head stays θ_G,cls^0 under every server rule (the head is also left out of a DP chain's clipping norm and
noise: :meth:`FedBABUClient.local_parameters`). The server line is any server rule; :class:`FedBABU` is FedAvg with
the paper's n_i/n weights. No per-client state is stored.

The personal model of client i (``fed_personal_<m>`` and the personal-model accessor) is the global model
fine-tuned on the client's training data at evaluation time: ``finetune_epochs`` (τ_f) passes over its training
data in the batches of its current round (the client's batch size and data order,
:meth:`~lightning_fed.datamodules.FederatedDataModule.client_personalization_batches`), with a fresh client
optimizer from the module's ``configure_optimizers`` (the training learning rate) and the module's
``training_step``, random draws seeded per client and round (:func:`~lightning_fed.client.sequential.client_seed`) —
the same machinery as ``eval_local_steps``. Choices the paper leaves open or that differ from it:

* ``finetune="head"`` (default) fine-tunes only the head (the abstract: "the head is fine-tuned for personalization
  during the evaluation process"); ``finetune="full"`` fine-tunes body and head together.
* the fine-tuning is recomputed at every federated evaluation from the current global model (nothing is stored per
  client); the round of the batches is the trainer's current epoch.
* the head is frozen by dropping its gradients rather than by ``requires_grad=False``, so it stays a federated
  parameter whose update is 0 (the model's parameter list, checkpoints and optimizer are the user's as written).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.checks import check_choice, check_int, check_names
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.client.personal import selected_parameters
from lightning_fed.server.aggregators.base import Stage

__all__ = ["FedBABU", "FedBABUClient"]

FINETUNE_PARTS = ("head", "full")


class FedBABUClient(ClientAlgorithm):
    """FedBABU's client half (Oh et al. 2022, Alg. 1, ClientBodyUpdate): every local step updates the body only; the
    head named in ``head`` keeps its initial values. Its personal model is the global model fine-tuned on the
    client's data (see :mod:`lightning_fed.algorithms.fedbabu`).

    Args:
        head: Names of the head's submodules or tensors (e.g. ``["classifier"]``), a non-empty list of str.
        finetune_epochs: τ_f, the fine-tuning epochs of a client's personal model (an integer ≥ 1; default 5).
        finetune: ``"head"`` (default) or ``"full"``: what the personal model's fine-tuning updates.

    Raises:
        ValueError: ``head`` empty or not a list of names, ``finetune_epochs`` not an integer ≥ 1, ``finetune`` not
            one of ``("head", "full")``; at fit start, a ``head`` that selects no parameter of the model.

    Example::

        >>> net = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
        >>> half = FedBABUClient(head=["1"], finetune_epochs=2)
        >>> half.setup(net)
        >>> half, half.local_parameters()
        (FedBABUClient(head=['1'], finetune_epochs=2, finetune='head'), [2, 3])
    """

    #: Its personal model is fitted on the client's data at evaluation: ``personal_model`` takes the trainer and the
    #: client id (the run's personal evaluation passes them).
    personal_needs_client = True

    def __init__(self, head: Sequence[str], finetune_epochs: int = 5, finetune: str = "head") -> None:
        self.head = check_names("head", head)
        self.finetune_epochs = check_int("finetune_epochs", finetune_epochs, 1)
        self.finetune = check_choice("finetune", finetune, FINETUNE_PARTS)
        self._head: list[int] = []
        self._params_of: list[Tensor] = []

    def setup(self, module: nn.Module) -> None:
        """At fit start: the positions of the head's parameters.

        Raises:
            ValueError: ``head`` selects no parameter of ``module``.
        """
        self._head = selected_parameters(module, self.head, "FedBABUClient", "head")

    def local_parameters(self) -> list[int]:
        """The head's positions: its update is 0, and a DP chain leaves it out of clipping and noise."""
        return list(self._head)

    def start(self, module: Any, context: Any, state: Optional[Tensor]) -> None:
        self._params_of = list(module.parameters())

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """Drop the head's gradients, so the client optimizer updates the body only (local steps)."""
        for i in self._head:
            self._params_of[i].grad = None

    def finish(self, module: Any, context: Any) -> tuple[dict[str, Any], Optional[Tensor]]:
        self._params_of = []
        return {}, None

    def personal_model(self, module: Any, state: Optional[Tensor], trainer: Any = None,
                       client_id: Optional[int] = None) -> None:
        """``module`` (the global model) becomes client ``client_id``'s personal model in place: τ_f epochs of
        fine-tuning (the head only, or everything with ``finetune="full"``) on its training data, in the batches of
        the trainer's current round (``state`` is unused: FedBABU stores nothing per client).

        Raises:
            ValueError: no ``trainer`` or ``client_id`` (the personal model needs the client's data).
        """
        if trainer is None or client_id is None:
            raise ValueError("FedBABU's personal model is the global model fine-tuned on the client's data: pass "
                             "`trainer` (with its federated data module) and `client_id`.")
        from lightning_fed.client.sequential import client_seed
        from lightning_fed.evaluation import _personalize

        dm, cid, round_idx = trainer.datamodule, int(client_id), int(trainer.current_epoch)
        if not self._head:
            self.setup(module)
        per_epoch = math.ceil(dm.client_num_samples(cid) / dm.client_work(cid, round_idx).batch_size)
        params = list(module.parameters())
        frozen = [p for i, p in enumerate(params) if i not in set(self._head) and p.requires_grad]
        if self.finetune == "full":
            frozen = []
        devices = [module.device] if module.device.type == "cuda" else []
        try:
            for p in frozen:
                p.requires_grad_(False)
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(client_seed(dm.seed, round_idx, cid))
                _personalize(trainer, dm, cid, round_idx, self.finetune_epochs * per_epoch, module=module)
        finally:
            for p in frozen:
                p.requires_grad_(True)


class FedBABU(FedAvg):
    """FedBABU (Oh et al., ICLR 2022, Alg. 1): FedAvg (the n_i/n mean of its server line) over the body; the head named
    in ``head`` keeps its initial values; personal models fine-tuned at evaluation (see
    :mod:`lightning_fed.algorithms.fedbabu`).

    Args:
        head: Names of the head (submodules or tensors), e.g. ``["classifier"]``.
        finetune_epochs: τ_f of the personal models (default 5).
        finetune: ``"head"`` (default) or ``"full"``.
        lr: Server learning rate (default 1.0).
        weighting: ``"num_samples"`` (default, Alg. 1) or ``"uniform"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after FedBABU's (default ``None``).

    Example::

        >>> FedBABU(head=["net.1"])
        FedBABU(head=['net.1'], finetune_epochs=5, finetune='head', lr=1.0, weighting='num_samples')
    """

    repr_fields = ("head", "finetune_epochs", "finetune", "lr", "weighting")
    carried_client_half = ("FedBABUClient", {"head": "head", "finetune_epochs": "finetune_epochs",
                                             "finetune": "finetune"})

    def __init__(self, head: Sequence[str], finetune_epochs: int = 5, finetune: str = "head", lr: float = 1.0,
                 weighting: str = "num_samples", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedBABUClient(head, finetune_epochs, finetune)]
        half = self._own_client[0]
        self.head, self.finetune_epochs, self.finetune = half.head, half.finetune_epochs, half.finetune
