"""A progress bar that shows the round and the client being trained."""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch.callbacks import TQDMProgressBar

from lightning_fed._lightning import tqdm_update_n


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class FederatedProgressBar(TQDMProgressBar):
    """Lightning's tqdm progress bar, counting clients instead of batches: ``Round 12: 4/10 [client=731]``.

    Installed by :class:`~lightning_fed.FederatedTrainer` unless another progress bar is given or
    ``enable_progress_bar=False``. Arguments as :class:`lightning.pytorch.callbacks.TQDMProgressBar`.

    In a terminal the bar is redrawn in place, one line for the whole fit (as Lightning's). When standard output is
    not a terminal (a log file, a pipe) each round's bar ends with a newline, so the log holds one line per round.
    Either way Lightning's closing message (```Trainer.fit` stopped: `max_epochs=N` reached.``) starts a line of its
    own, and the bar is titled ``Round N`` from its first draw (never Lightning's ``Epoch N``).

    Example: installed by default, not with ``enable_progress_bar=False``::

        >>> from lightning_fed import FederatedTrainer
        >>> trainer = FederatedTrainer(max_epochs=1, logger=False, enable_model_summary=False, accelerator="cpu")
        >>> [type(cb).__name__ for cb in trainer.callbacks if isinstance(cb, FederatedProgressBar)]
        ['FederatedProgressBar']
        >>> quiet = FederatedTrainer(max_epochs=1, logger=False, enable_progress_bar=False, accelerator="cpu")
        >>> any(isinstance(cb, FederatedProgressBar) for cb in quiet.callbacks)
        False
    """

    @property
    def train_description(self) -> str:
        """``"Round N"``: the title of a training bar created during the fit."""
        trainer = getattr(self, "_trainer", None)
        return f"Round {trainer.current_epoch}" if trainer is not None else "Training"

    def _line_per_round(self) -> bool:
        return not self._leave and not _is_terminal(sys.stdout)

    def on_train_epoch_start(self, trainer: Any, *_: Any) -> None:
        """Lightning's reset of the bar, titled ``Round N`` before it is drawn (Lightning's own draws ``Epoch N``
        first: one line of its own in a log file)."""
        from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf

        if self._leave or (self._line_per_round() and self.train_progress_bar.disable and not self.is_disabled):
            self.train_progress_bar = self.init_train_tqdm()  # the last round's bar was closed
        bar = self.train_progress_bar
        bar.set_description(f"Round {trainer.current_epoch}", refresh=False)
        bar.reset(total=convert_inf(self.total_train_batches))
        bar.initial = 0

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """The round's metrics on the bar; the bar is then closed (its line ends there) outside a terminal, and after
        the last round (``max_epochs``) in a terminal too, before Lightning's "`Trainer.fit` stopped" line."""
        super().on_train_epoch_end(trainer, pl_module)
        max_epochs = trainer.max_epochs
        last = max_epochs is not None and max_epochs >= 0 and trainer.current_epoch + 1 >= max_epochs
        if not self._leave and (self._line_per_round() or last):
            self.train_progress_bar.close()

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        """Local mini-batches do not move the bar; clients do (:meth:`on_client_end`)."""

    def on_client_end(self, trainer: Any, pl_module: Any, update: Any, position: int) -> None:
        """Called by the federated loop after each client's local work (``position`` counts from 0)."""
        n = position + 1
        if self._should_update(n, self.train_progress_bar.total):
            tqdm_update_n(self.train_progress_bar, n)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module) | {"client": update.client_id})
