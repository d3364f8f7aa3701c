"""A progress bar that shows the round and the client being trained."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar

from lightning_fed._lightning import tqdm_update_n


class FederatedProgressBar(TQDMProgressBar):
    """Lightning's tqdm progress bar, counting clients instead of batches: ``Round 12: 4/10 [client=731]``.

    Installed by :class:`~lightning_fed.FederatedTrainer` unless another progress bar is given or
    ``enable_progress_bar=False``. Arguments as :class:`lightning.pytorch.callbacks.TQDMProgressBar`.

    Example: installed by default, not with ``enable_progress_bar=False``::

        >>> from lightning_fed import FederatedTrainer
        >>> trainer = FederatedTrainer(max_epochs=1, logger=False, enable_model_summary=False, accelerator="cpu")
        >>> [type(cb).__name__ for cb in trainer.callbacks if isinstance(cb, FederatedProgressBar)]
        ['FederatedProgressBar']
        >>> quiet = FederatedTrainer(max_epochs=1, logger=False, enable_progress_bar=False, accelerator="cpu")
        >>> any(isinstance(cb, FederatedProgressBar) for cb in quiet.callbacks)
        False
    """

    def on_train_epoch_start(self, trainer: Any, *_: Any) -> None:
        super().on_train_epoch_start(trainer)
        self.train_progress_bar.set_description(f"Round {trainer.current_epoch}")

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """Local mini-batches do not move the bar; clients do (:meth:`on_client_end`)."""

    def on_client_end(self, trainer: Any, pl_module: Any, update: Any, position: int) -> None:
        """Called by the federated loop after each client's local work (``position`` counts from 0)."""
        n = position + 1
        if self._should_update(n, self.train_progress_bar.total):
            tqdm_update_n(self.train_progress_bar, n)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module) | {"client": update.client_id})
