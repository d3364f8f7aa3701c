"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021, Algorithm 1): a shared representation φ (the body), averaged by the server, and a head h_i per
client; in each round a client first trains its head with the body fixed, then the body with its new head fixed, and
sends only the body.

Algorithm 1 (round t, client i of the cohort I^t, step size α; GRD one gradient step)::

    h_i^{t,0} = h_i^{t−1,τ}                                                   (l. 6: the client's own head)
    for s = 1 … τ_h:  h_i^{t,s} = GRD(f_i(φ^t, h_i^{t,s−1}), h_i^{t,s−1}, α)      (l. 7-9: head, body fixed)
    φ_i^{t,0} = φ^t
    for s = 1 … τ_φ:  φ_i^{t,s} = GRD(f_i(φ_i^{t,s−1}, h_i^{t,τ_h}), φ_i^{t,s−1}, α)   (l. 10-12: body, head fixed)
    server:  φ^{t+1} = (1/|I^t|)·Σ_{i∈I^t} φ_i^{t,τ_φ}                              (l. 14)

Here a client's local work of a round (the data module's ``local_epochs`` / ``local_steps``) is τ_h + τ_φ steps:
:class:`FedRepClient` lets its first τ_h local steps update only the head — the body's gradients are dropped
(``grad = None``) before the client optimizer steps, so it skips them — and the remaining steps only the body (the
head's gradients dropped). τ_h is given one of two ways (exactly one):

* ``head_epochs`` = e_h, the paper's way (Sec. 5: the head is trained for 10 local epochs, the body for 1 to 5; the
  authors' code counts epochs too): τ_h is the steps of the client's first e_h passes over its data in the round,
  e_h·⌈n_i / B_i⌉ (⌊·⌋ with ``drop_last``; n_i its samples, B_i its batch size of the round), so with
  ``local_epochs = e_h + e_b`` the head takes e_h epochs and the body e_b, whatever each client's size;
* ``head_steps`` = τ_h local steps, the same number for every client (default 10 when neither is given: today's
  behaviour, kept).

It is a :class:`~lightning_fed.client.personal.LocalParts` keeping the head local, so only the body is aggregated,
by any server rule (e.g. FedRep's body under FedAdam). l. 14's mean is uniform,
:class:`~lightning_fed.algorithms.fedrep.FedRep`'s default ``weighting="uniform"``.

Where this differs from the paper:

* τ_h counts steps by default (``head_steps=10``); ``head_epochs`` counts epochs as the paper's experiments do.
* Partial participation and returning clients: a client never sampled before starts from the initial head (the
  global model's, which the server never changes); the paper initialises every h_i once too, so this only fixes
  which initial head.
* The head and body phases use the module's own client optimizer (its state, momentum for instance, runs across
  both phases); Alg. 1's GRD is one plain gradient step with step size α — equal for plain SGD.
* The global model's head stays at its initial values: its central ``val_*`` measure the shared body with that
  untrained head (a warning says so at fit start; read ``fed_personal_<m>``, or
  :func:`lightning_fed.personal.personal_model`).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from torch import Tensor

from lightning_fed.checks import ArgumentError, check_int
from lightning_fed.client.personal import LocalParts
from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.server.aggregators.base import Stage

__all__ = ["FedRep", "FedRepClient"]


class FedRepClient(LocalParts):
    """FedRep's client half (Collins et al. 2021, Alg. 1): the head (``head``, by name) stays local; the first τ_h
    local steps of a round train only the head (l. 7-9), the rest only the body (l. 10-12).

    Args:
        head: Names of the head's submodules or tensors (e.g. ``["net.2"]``).
        head_steps: τ_h as local steps per round (an integer ≥ 0; default ``None``: 10 unless ``head_epochs`` is
            given). A client whose local work has at most τ_h steps trains only its head that round.
        head_epochs: τ_h as local epochs e_h (an integer ≥ 0; default ``None``), the paper's way: the steps of the
            client's first e_h passes over its data in the round, e_h·⌈n_i / B_i⌉ (⌊·⌋ with ``drop_last``).

    Raises:
        TypeError: ``head`` not a list of names.
        ArgumentError: ``head_steps`` / ``head_epochs`` not an integer ≥ 0, or both given.
        ValueError: ``head`` empty; at fit start, a name that selects nothing.
        RuntimeError: with ``head_epochs``, a client run outside a federated trainer with a data module (its
            passes over the data are unknown).

    Example::

        >>> FedRepClient(head=["classifier"], head_steps=5)
        FedRepClient(head=['classifier'], head_steps=5)
        >>> FedRepClient(head=["classifier"], head_epochs=10)
        FedRepClient(head=['classifier'], head_epochs=10)
        >>> FedRepClient(head=["classifier"], head_steps=5, head_epochs=10)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: Give exactly one of `head_steps` (local steps) and `head_epochs` (local epochs, the paper's way) for the head's share of a round, got head_steps=5 and head_epochs=10.
    """

    def __init__(self, head: Sequence[str], head_steps: Optional[int] = None, head_epochs: Optional[int] = None) -> None:
        super().__init__(names=head)
        if not self.names:
            raise ValueError("`head` must name at least one submodule or tensor of the model (e.g. ['classifier']).")
        if head_steps is not None and head_epochs is not None:
            raise ArgumentError(
                "Give exactly one of `head_steps` (local steps) and `head_epochs` (local epochs, the paper's way) for "
                f"the head's share of a round, got head_steps={head_steps!r} and head_epochs={head_epochs!r}."
            )
        self.head_epochs = check_int("head_epochs", head_epochs, 0, optional=True)
        self.head = list(self.names)
        self.head_steps = None if head_epochs is not None else check_int(
            "head_steps", 10 if head_steps is None else head_steps, 0)
        self._step = 0
        self._round_head_steps = 0
        self._params_of: list[Tensor] = []

    def settings(self) -> dict[str, Any]:
        if self.head_epochs is not None:
            return {"head": self.head, "head_epochs": self.head_epochs}
        return {"head": self.head, "head_steps": self.head_steps}

    def start(self, module: Any, context: Any, state: Optional[Tensor]) -> None:
        super().start(module, context, state)
        self._step = 0
        self._params_of = list(module.parameters())
        self._round_head_steps = self.head_steps if self.head_epochs is None else self._epoch_steps(module, context)

    def _epoch_steps(self, module: Any, context: Any) -> int:
        """e_h·(the client's steps per pass over its data in this round), from the trainer's data module."""
        from lightning_fed.datamodules.local_work import ClientWork, num_local_steps

        if self.head_epochs == 0:
            return 0
        try:
            datamodule = getattr(module.trainer, "datamodule", None)
        except (AttributeError, RuntimeError):  # a module attached to no trainer
            datamodule = None
        if datamodule is None or not hasattr(datamodule, "client_work"):
            raise RuntimeError(f"{self!r} counts the head's local epochs from the client's data and batch size: it "
                               "runs only in a FederatedTrainer with a FederatedDataModule (or give `head_steps`).")
        cid = int(context.client_id)
        work = datamodule.client_work(cid, int(context.round_idx))
        head = ClientWork(epochs=self.head_epochs, batch_size=work.batch_size)
        return num_local_steps(len(datamodule.client_indices(cid)), head, datamodule.drop_last)

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """Drop the body's gradients in the first τ_h steps (l. 7-9), the head's afterwards (l. 10-12)."""
        head = set(self._params)
        train_head = self._step < self._round_head_steps
        for i, p in enumerate(self._params_of):
            if (i in head) != train_head:
                p.grad = None
        self._step += 1


class FedRep(FedAvg):
    """FedRep (Collins et al., ICML 2021, Alg. 1): each client trains its own head for τ_h local steps (or epochs)
    with the body fixed, then the body with the head fixed; the server averages the body (see
    :mod:`lightning_fed.algorithms.fedrep`).

    Args:
        head: Names of the head (submodules or tensors), e.g. ``["classifier"]``.
        head_steps: τ_h as local steps per round (default ``None``: 10 unless ``head_epochs`` is given).
        head_epochs: τ_h as local epochs, the paper's way (default ``None``); give at most one of the two.
        lr: Server learning rate η (default 1.0).
        weighting: ``"uniform"`` (default, Alg. 1, l. 14) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after FedRep's (default ``None``).

    Raises:
        ArgumentError: as :class:`FedRepClient`.

    Example::

        >>> FedRep(head=["net.2"], head_steps=3).client_algorithms
        [FedRepClient(head=['net.2'], head_steps=3)]
        >>> FedRep(head=["net.2"], head_epochs=10)
        FedRep(head=['net.2'], head_epochs=10, lr=1.0, weighting='uniform')
    """

    repr_fields = ("head", "head_steps", "head_epochs", "lr", "weighting")
    repr_hidden = {"head_steps": None, "head_epochs": None}

    def __init__(self, head: Sequence[str], head_steps: Optional[int] = None, head_epochs: Optional[int] = None,
                 lr: float = 1.0, weighting: str = "uniform", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedRepClient(head, head_steps, head_epochs)]
        half = self._own_client[0]
        self.head, self.head_steps, self.head_epochs = list(half.head), half.head_steps, half.head_epochs
