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

**The global model's own metrics.** FedBN, FedPer, FedRep (and every
:class:`~lightning_fed.client.personal.LocalParts` half) never federate the parts they keep: the global model holds
their *initial* values, which the server never changes. Central validation (Lightning's ``validation_step`` on the
data module's ``val_dataset``, logged as ``val_*``; ``test_*`` likewise) evaluates that global model, so its
metrics measure the shared part with an untrained head / untrained BatchNorm layers — no model any client uses. We
keep those metrics (they are what Lightning's ``validation_step`` means: the module the trainer holds, and callbacks
monitoring them keep working) and warn at fit start (:func:`warn_untrained_global_parts`, a
:class:`GlobalModelPartsWarning` naming the method, the parts and the metrics) rather than evaluate them with a stand-in:
a central sample belongs to no client, so any client's part put in for it (or an average of the clients' parts,
which the methods never train) would be a model nobody trains either, and a renamed metric would break monitors
that name ``val_loss`` without saying why. The personal models are measured by federated evaluation,
``fed_personal_<m>`` (the data module's ``eval_clients_per_round``), and returned by :func:`personal_model`. Ditto
(its global model is trained as FedAvg's) and methods without personal parts get no warning.

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

__all__ = ["GlobalModelPartsWarning", "UNTRAINED", "personal_model", "personal_state_dict", "trained_clients",
           "warn_untrained_global_parts"]

#: The values of ``untrained``: ``"global"`` (a client without personal state gets the global model) or ``"raise"``.
UNTRAINED = ("global", "raise")


class GlobalModelPartsWarning(UserWarning):
    """The global model's central metrics (``val_*`` / ``test_*``) use parts a personalised method never trains
    (:func:`warn_untrained_global_parts`). Silence it with
    ``warnings.filterwarnings("ignore", category=GlobalModelPartsWarning)``.

    >>> issubclass(GlobalModelPartsWarning, UserWarning)
    True
    """


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
    personal halves (ascending; ``[]`` for a method without per-client state, e.g. FedAvg, or before a fit).

    Example (after a fit: see :func:`personal_model`)::

        >>> from lightning_fed import FederatedTrainer
        >>> trained_clients(FederatedTrainer(logger=False, enable_progress_bar=False))
        []
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
    personal = personal_models(trainer, untrained="global")
    if personal is not None:
        from lightning.pytorch import LightningModule

        attach = isinstance(mine, LightningModule)
        if attach:  # a half reading the client's data through the module's trainer (Per-FedAvg's one step)
            mine.trainer = trainer
        try:
            personal(mine, client_id)
        finally:
            if attach:
                mine.trainer = None
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


def _kept_parts(half: Any) -> str:
    """What a :class:`~lightning_fed.client.personal.LocalParts` half keeps, in words (names, layer types, predicate)."""
    parts = [*map(str, half.names), *(f"every {t.__name__.lstrip('_')} layer" for t in half.types)]
    if half.predicate is not None:
        parts.append(f"the tensors {getattr(half.predicate, '__name__', 'its predicate')} selects")
    return ", ".join(parts)


def warn_untrained_global_parts(trainer: Any, module: Any) -> None:
    """At fit start: a :class:`GlobalModelPartsWarning` for each client half that keeps parts of the model local
    (:class:`~lightning_fed.client.personal.LocalParts`: FedBN, FedPer, FedRep, ...; not FedRoD, whose global model
    is its generic model: ``global_model_holds_unused_parts``) when the global model is
    evaluated centrally (``module`` overrides ``validation_step`` or ``test_step``, and ``limit_val_batches`` is
    not 0), naming the method, the parts and the metrics (see the module doc); nothing otherwise.

    Example::

        >>> import warnings, lightning as L, torch
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.callbacks import FedPer
        >>> class M(L.LightningModule):
        ...     def validation_step(self, batch, batch_idx):
        ...         pass
        >>> trainer = FederatedTrainer(callbacks=[FedPer(head=["head"])], logger=False, enable_progress_bar=False)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_untrained_global_parts(trainer, M())
        >>> print(caught[0].message)  # doctest: +ELLIPSIS
        FedPer (its client half FedPerClient) keeps head local: the server never trains it, so the global model holds its initial values and central validation's `val_*` (every metric validation_step logs...
    """
    from lightning.pytorch.utilities.model_helpers import is_overridden
    from lightning.pytorch.utilities.rank_zero import rank_zero_warn

    from lightning_fed.client.personal import LocalParts
    from lightning_fed.evaluation import personal_halves

    halves = [h for h in personal_halves(trainer)
              if isinstance(h, LocalParts) and h.global_model_holds_unused_parts]
    validated = is_overridden("validation_step", module) and getattr(trainer, "limit_val_batches", 1) != 0
    tested = is_overridden("test_step", module)
    if not halves or not (validated or tested):
        return
    metrics = " and ".join(m for m, on in (("central validation's `val_*` (every metric validation_step logs, e.g. "
                                            "`val_loss`)", validated), ("`test_*`", tested)) if on)
    server = _server(trainer)
    for half in halves:
        own = server is not None and any(h is half for h in getattr(server, "server_client_algorithms", ()))
        who = (f"{type(server).__name__} (its client half {type(half).__name__})" if own else
               f"The client half {type(half).__name__}")
        rank_zero_warn(
            f"{who} keeps {_kept_parts(half)} local: the server never trains "
            f"it, so the global model holds its initial values and {metrics} measure the shared part with that "
            "untrained part, which no client uses. The personal models are measured by federated evaluation's "
            "`fed_personal_<metric>` (set the data module's `eval_clients_per_round`; monitor e.g. "
            "`fed_personal_val_loss/weighted` in ModelCheckpoint / EarlyStopping) and returned by "
            "lightning_fed.personal_model(trainer, client_id).",
            category=GlobalModelPartsWarning,
        )
