"""What each ``lightning.Trainer`` argument means in federated training, checked once at fit start.

One Lightning epoch is one communication round. Every ``Trainer`` argument either keeps its meaning with that
reading (``max_epochs`` counts rounds, ``check_val_every_n_epoch`` validates the global model every n rounds, ...)
or is refused by :func:`check_trainer_arguments` with an error naming it. The guide's table "Trainer arguments
in federated training" (docs/guide/your-own-lightningmodule-federated.md) lists the ones whose meaning changes; this module is the single place that enforces it.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional

from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_fed._lightning import sync_batchnorm
from lightning_fed.distributed import FederatedDDPStrategy


def _refuse(argument: str, value: Any, why: str) -> None:
    raise ValueError(f"Trainer argument `{argument}={value!r}` is not supported in federated training: {why}")


def check_trainer_arguments(trainer: Any) -> Optional[int]:
    """Refuse the ``Trainer`` arguments that have no federated meaning; return the per-client batch limit.

    Meanings kept (one epoch = one round): ``max_epochs``/``min_epochs`` count rounds; ``max_time`` stops the
    run at the end of the round in which the time ran out (a round is never cut short); ``fast_dev_run=n``
    runs one round in which every client takes at most n local batches (and validation at most n batches);
    ``limit_train_batches=k`` (an int) caps every client's local batches per round at k.

    Args:
        trainer: The :class:`~lightning_fed.FederatedTrainer` about to fit.

    Returns:
        The most local batches a client may take in one round (``None``: no limit; its whole local work).

    Raises:
        ValueError: naming the argument, for ``max_steps``/``min_steps`` (local steps differ by client: count
            rounds with ``max_epochs``/``min_epochs``), ``limit_train_batches`` as a fraction other than 1.0 or
            0, ``overfit_batches``, ``val_check_interval`` other than 1.0 and ``check_val_every_n_epoch=None``
            (the global model is validated at round ends), ``accumulate_grad_batches`` other than 1,
            ``sync_batchnorm`` (clients on different ranks are independent), or a strategy other than one device or
            :class:`~lightning_fed.distributed.FederatedDDPStrategy`.

    >>> from lightning_fed import FederatedTrainer
    >>> check_trainer_arguments(FederatedTrainer(limit_train_batches=5, logger=False, enable_progress_bar=False))
    5
    """
    fast_dev_run = trainer.fast_dev_run
    if not fast_dev_run:
        if trainer.max_steps != -1:
            _refuse("max_steps", trainer.max_steps, "clients take different numbers of local steps, so a step "
                    "budget would end the run inside a round; count rounds with `max_epochs`.")
    if trainer.min_steps is not None:
        _refuse("min_steps", trainer.min_steps, "count rounds with `min_epochs`.")
    if trainer.overfit_batches:
        _refuse("overfit_batches", trainer.overfit_batches, "it has no per-client meaning; to train on few "
                "clients use a partitioner with few clients, or `limit_train_batches` (local batches per client).")
    if trainer.accumulate_grad_batches != 1:
        _refuse("accumulate_grad_batches", trainer.accumulate_grad_batches, "a client's local step is one "
                "optimizer step on one mini-batch; use a larger `batch_size` in the data module.")
    interval = trainer.val_check_interval
    if isinstance(interval, bool) or not (isinstance(interval, float) and interval == 1.0):
        _refuse("val_check_interval", interval, "the global model exists only at the end of a round; validate "
                "every n rounds with `check_val_every_n_epoch`.")
    if trainer.check_val_every_n_epoch is None:
        _refuse("check_val_every_n_epoch", None, "validation follows rounds; give an int (rounds).")
    if sync_batchnorm(trainer):
        _refuse("sync_batchnorm", True, "ranks train different clients, whose BatchNorm statistics must not be "
                "synchronised per step; buffers are averaged once per round.")
    strategy = trainer.strategy
    if not isinstance(strategy, (SingleDeviceStrategy, FederatedDDPStrategy)):
        _refuse("strategy", type(strategy).__name__, "use one device or strategy='ddp' (FederatedDDPStrategy); "
                "model-sharding strategies would split one client's model across ranks training different clients.")
    limit = trainer.limit_train_batches
    if fast_dev_run:
        return int(fast_dev_run)
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real):
        _refuse("limit_train_batches", limit, "give an int (local batches per client per round).")
    if isinstance(limit, float):
        if limit == 1.0:
            return None
        _refuse("limit_train_batches", limit, "a fraction has no per-round meaning; give an int k, the most "
                "local batches a client takes per round.")
    if limit < 1:
        _refuse("limit_train_batches", limit, "it would train nothing; give an int >= 1.")
    return int(limit)
