"""Client c's personal model after a run: one public call for every method (issue #55, item 4).

A personalised method gives each client a model of its own: FedBN, FedPer and FedRep keep parts of the model on the
client (:class:`~lightning_fed.client.personal.LocalParts`; the personal model is the global model with the client's
own values in those parts), Ditto trains a personal model v_k beside the global one, and any client half that
defines ``personal_model(module, row)`` does the same for its own state. Without such a half (FedAvg, FedAdam, ...)
every client's personal model is the global model. :func:`personal_model` returns that model for client c as a
deep copy of the trainer's module, the same way for every method, after ``trainer.fit`` and after
``trainer.validate`` / ``trainer.test`` with ``ckpt_path`` (the server optimizer then holds the checkpoint's
per-client state): where a half was given (its method's own, ``client=[...]`` of the server optimizer, or
``FederatedTrainer(client_algorithms=[...])``) and where its per-client table lives are looked up here, as the
federated evaluation's ``fed_personal_<m>`` does (:func:`lightning_fed.evaluation.personal_models`).

A client without per-client state — never sampled, or whose every update was dropped — has no personal part of its
own: by default (``untrained="global"``) its personal model is the global model, as in ``fed_personal_<m>``
(FedBN / FedPer / FedRep: the initial values of the kept parts, which the server never changes; Ditto: w^T);
``untrained="raise"`` refuses it instead. A method without per-client state (FedAvg) never raises: the global model
is every client's personal model.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from lightning_fed.checks import ArgumentError, check_choice, check_int

__all__ = ["UNTRAINED", "personal_model", "personal_state_dict", "trained_clients"]

#: The values of ``untrained``: ``"global"`` (a client without personal state gets the global model) or ``"raise"``.
UNTRAINED = ("global", "raise")


def _server(trainer: Any) -> Any:
    from lightning_fed.server.checks import is_server_optimizer

    return next((cb for cb in getattr(trainer, "callbacks", None) or [] if is_server_optimizer(cb)), None)


def _stateful_tables(trainer: Any) -> dict[str, Any]:
    """``{half's state_key: its per-client table}`` of the run's personal halves that keep per-client state."""
    from lightning_fed.evaluation import personal_halves

    server = _server(trainer)
    if server is None:
        return {}
    tables = server.client_algorithm_states
    return {h.state_key: tables[h.state_key] for h in personal_halves(trainer) if h.state_key in tables}


def trained_clients(trainer: Any) -> list[int]:
    """The clients with a personal state of their own: those with a row in every per-client table of the run's
    personal halves (ascending; ``[]`` for a method without per-client state, e.g. FedAvg).

    Example: see :func:`personal_model`.
    """
    tables = list(_stateful_tables(trainer).values())
    if not tables:
        return []
    ids = set(tables[0].ids())
    for table in tables[1:]:
        ids &= set(table.ids())
    return sorted(ids)


def personal_model(trainer: Any, client_id: int, untrained: str = "global") -> nn.Module:
    """Client ``client_id``'s personal model: a deep copy of ``trainer.lightning_module`` (the global model) with
    the client's own state loaded by each personal half of the run (``personal_model(module, row)``: FedBN's
    BatchNorm layers, FedPer's / FedRep's head, Ditto's v_k, ...); the global model itself for a method without
    one (FedAvg). The copy is detached from the trainer, on the module's device, in its train / eval mode; the
    trainer's module is not changed.

    Args:
        trainer: A :class:`~lightning_fed.FederatedTrainer` after ``fit``, or after ``validate`` / ``test`` with
            ``ckpt_path`` (its server optimizer holds the per-client state).
        client_id: The client c, an integer in ``[0, N)`` (N the data module's clients).
        untrained: A client without personal state (never sampled, or its updates all dropped): ``"global"``
            (default) gives it the global model's values, ``"raise"`` refuses it.

    Returns:
        The personal model (the module's class, ``torch.nn.Module``).

    Raises:
        ArgumentError: ``client_id`` not an integer in ``[0, N)``, ``untrained`` not one of :data:`UNTRAINED`;
            with ``untrained="raise"``, a client without personal state (naming it and the trained clients' count).
        ValueError: a trainer without a model (before ``fit`` / ``validate``).

    Example: FedPer keeps each client's head (``lin``'s bias here, the model's one personal tensor)::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.callbacks import FedPer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Reg(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(1, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return torch.nn.functional.mse_loss(self.lin(x).squeeze(1), y)
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> ds = TensorDataset(torch.arange(8.0).reshape(8, 1) / 8, torch.arange(8.0) % 2)
        >>> dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
        ...                          batch_size=2)
        >>> trainer = FederatedTrainer(max_epochs=1, logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False,
        ...                            callbacks=[FedPer(head=["lin.bias"])])
        >>> trainer.fit(Reg(), datamodule=dm)
        >>> trained = trained_clients(trainer)
        >>> len(trained)
        2
        >>> mine = personal_model(trainer, trained[0])
        >>> torch.equal(mine.lin.weight, trainer.lightning_module.lin.weight)  # the shared part: the global model's
        True
        >>> torch.equal(mine.lin.bias, trainer.lightning_module.lin.bias)  # the client's own head
        False
        >>> never = next(c for c in range(4) if c not in trained)
        >>> torch.equal(personal_model(trainer, never).lin.bias, trainer.lightning_module.lin.bias)
        True
        >>> personal_model(trainer, never, untrained="raise")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: Client ... has no personal state (never trained: ...
    """
    import copy

    from lightning_fed.evaluation import personal_models

    untrained = check_choice("untrained", untrained, UNTRAINED)
    module = getattr(trainer, "lightning_module", None)
    if module is None:
        raise ValueError("personal_model(trainer, ...) needs the trainer's model: call trainer.fit(...), or "
                         "trainer.validate(model, datamodule, ckpt_path=...) to read a checkpoint, first.")
    num_clients = getattr(getattr(trainer, "datamodule", None), "num_clients", None)
    tables = _stateful_tables(trainer)
    if num_clients is None and tables:
        num_clients = next(iter(tables.values())).num_clients
    client_id = check_int("client_id", client_id, 0)
    if num_clients is not None and client_id >= num_clients:
        raise ArgumentError(f"`client_id` must be an integer in [0, {num_clients}) (the data module's clients), "
                            f"got {client_id}.")
    missing = [key for key, table in tables.items() if client_id not in table]
    if missing and untrained == "raise":
        raise ArgumentError(
            f"Client {client_id} has no personal state (never trained: no row in {', '.join(missing)}'s per-client "
            f"table; {len(trained_clients(trainer))} client(s) have one), and `untrained` is 'raise'. Pass "
            "untrained='global' for the global model's values, or pick one of trained_clients(trainer)."
        )
    mine = copy.deepcopy(module)  # a LightningModule drops its trainer when copied
    personal = personal_models(trainer)
    if personal is not None:
        personal(mine, client_id)
    return mine


def personal_state_dict(trainer: Any, client_id: int, untrained: str = "global") -> dict[str, Tensor]:
    """The ``state_dict`` of :func:`personal_model` (parameters and buffers, detached copies): client c's personal
    model to save or load into a model of the same class. Arguments and errors as :func:`personal_model`.

    Example::

        >>> import torch
        >>> from lightning_fed import FederatedTrainer
        >>> trainer = FederatedTrainer(logger=False, enable_progress_bar=False)
        >>> personal_state_dict(trainer, 0)
        Traceback (most recent call last):
        ...
        ValueError: personal_model(trainer, ...) needs the trainer's model: call trainer.fit(...), or trainer.validate(model, datamodule, ckpt_path=...) to read a checkpoint, first.
    """
    return {k: v.detach().clone() for k, v in personal_model(trainer, client_id, untrained).state_dict().items()}
