"""The server optimizer's own checks before any client trains (issue #52): at fit start, a ready-made method's chain
kept, a federated trainer, the aggregator chain's checks of the cohort size; at round start, which parameters a chain
that adds DP noise leaves out. Functions of what they check, run by the hooks of
:class:`~lightning_fed.callbacks.ServerOptimizer` (``owner`` names it in the messages); the checks of a stage
(``check_setup``, ``check_fit``, ...) and of a client half are theirs.

Example: SCAFFOLD's own chain replaced by another::

    >>> from lightning_fed.algorithms import ScaffoldControl
    >>> own = [ScaffoldControl()]
    >>> check_own_chain("SCAFFOLD", own, own)
    >>> check_own_chain("SCAFFOLD", own, [ScaffoldControl()])
    Traceback (most recent call last):
    ...
    ValueError: SCAFFOLD aggregates in its own way (its aggregator chain is [ScaffoldControl]), so another `aggregators` chain cannot be used; use them with a server optimizer that takes the default aggregation.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

from torch import Tensor

__all__ = ["check_cohort", "check_federated_trainer", "check_own_chain", "frozen_positions", "local_parameter_ids"]


def check_own_chain(owner: str, own: Optional[Sequence[Any]], aggregators: Optional[Sequence[Any]]) -> None:
    """Refuse a replaced chain of a ready-made method that fixes its own (``own``: SCAFFOLD's ``[ScaffoldControl]``,
    FedAWARE's, Fed-LAMB's; ``None``: any chain is fine): ``aggregators`` must hold the very same stages, in order.

    Raises:
        ValueError: naming ``owner``, its chain and ``aggregators``.
    """
    if own is not None and not (aggregators is not None and len(aggregators) == len(own)
                                and all(a is b for a, b in zip(aggregators, own))):
        raise ValueError(
            f"{owner} aggregates in its own way (its aggregator chain is "
            f"[{', '.join(type(s).__name__ for s in own)}]), so another `aggregators` chain cannot be used; use "
            "them with a server optimizer that takes the default aggregation."
        )


def check_federated_trainer(owner: str, trainer: Any) -> None:
    """Refuse a trainer without lightning_fed's federated loop (recognised by its ``fit_loop.client_runner``): a plain
    :class:`lightning.Trainer` trains centrally and would silently ignore the server optimizer.

    Raises:
        RuntimeError: naming ``owner``, the trainer's class and :class:`~lightning_fed.trainer.FederatedTrainer`.

    Example::

        >>> import lightning
        >>> check_federated_trainer("FedAvg", lightning.Trainer(logger=False, enable_progress_bar=False))
        Traceback (most recent call last):
        ...
        RuntimeError: FedAvg is a server optimizer: it needs lightning_fed.FederatedTrainer, but Trainer trains centrally and would ignore it. Use FederatedTrainer(...), or drop the server optimizer from `callbacks` for a centralized baseline.
    """
    if getattr(trainer.fit_loop, "client_runner", None) is None:
        raise RuntimeError(
            f"{owner} is a server optimizer: it needs lightning_fed.FederatedTrainer, but "
            f"{type(trainer).__name__} trains centrally and would ignore it. Use FederatedTrainer(...), or drop "
            "the server optimizer from `callbacks` for a centralized baseline."
        )


def check_cohort(checks: Iterable[Callable[[int], Any]], datamodule: Any) -> None:
    """Run the chain's ``check_cohort`` hooks (``checks``, e.g. Krum refuses ``clients_per_round`` ≤ 2f + 2,
    TrimmedMean warns when it would trim nothing) with ``datamodule.clients_per_round``; nothing when the data module
    has none.

    Raises:
        ValueError: as a stage's ``check_cohort``.
    """
    cohort = getattr(datamodule, "clients_per_round", None)
    for check in checks if cohort is not None else ():
        check(int(cohort))


def local_parameter_ids(params: Sequence[Tensor], halves: Iterable[Any]) -> set[int]:
    """``id()`` of the entries of ``params`` (the module's parameters) that the client halves keep on the clients
    (:meth:`ClientAlgorithm.local_parameters <lightning_fed.client.algorithm.ClientAlgorithm.local_parameters>`: the
    personal parts of FedBN, FedPer, FedRep, :class:`~lightning_fed.client.personal.LocalParts`), once they are set
    up; positions past ``params`` are skipped. Read at every round's start under a chain that adds DP noise.

    Example::

        >>> import torch
        >>> from lightning_fed.client import ClientAlgorithm
        >>> class KeepsFirst(ClientAlgorithm):
        ...     def local_parameters(self): return [0, 5]
        >>> params = [torch.zeros(1), torch.zeros(2)]
        >>> local_parameter_ids(params, [KeepsFirst(), ClientAlgorithm()]) == {id(params[0])}
        True
    """
    return {id(params[i]) for half in halves for i in half.local_parameters() if i < len(params)}


def frozen_positions(owner: str, params: Sequence[Tensor], trained: Sequence[bool], local_ids: set[int]) -> list[int]:
    """The positions of ``params`` a chain that adds DP noise leaves out (not clipped, not noised, Δ_t = 0): not
    ``trained`` by the clients (:func:`~lightning_fed.server.aggregators.dp.trained_parameters`) or kept local by a
    client half (``local_ids``, :func:`local_parameter_ids`).

    Raises:
        ValueError: every parameter left out, naming ``owner``.

    Example::

        >>> import torch
        >>> params = [torch.zeros(1), torch.zeros(1), torch.zeros(1)]
        >>> frozen_positions("DPFedAvg", params, [True, False, True], {id(params[2])})
        [1, 2]
    """
    frozen = [i for i, t in enumerate(trained) if not t or id(params[i]) in local_ids]
    if len(frozen) == len(params):
        raise ValueError(f"{owner} adds DP noise, but no parameter is trained and shared (all frozen or kept local by "
                         "a client half).")
    return frozen
