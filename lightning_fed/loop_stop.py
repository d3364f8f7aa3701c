"""Stopping the federated fit loop on a signal (issue #52: moved out of ``loop.py``): where the stop checkpoint goes,
how to resume from it, and discarding a round that SIGTERM/SIGINT interrupted (the signals themselves are caught by
:mod:`lightning_fed.interrupts`).

:class:`StopSignalHandling` is a part of :class:`~lightning_fed.loop.FederatedFitLoop` (its base class).
"""

from __future__ import annotations

import logging
import os
import signal

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger("lightning_fed.loop")  # the loop's own logger, as before the move


class StopSignalHandling:
    """The stop-signal part of :class:`~lightning_fed.loop.FederatedFitLoop` (see its "Stop signals"): the stop
    checkpoint's path, the resume hint, writing the checkpoint and discarding the interrupted round. Not used on its
    own.

    Example: the loop is one::

        >>> from lightning_fed.loop import FederatedFitLoop
        >>> issubclass(FederatedFitLoop, StopSignalHandling)
        True
    """

    @property
    def stop_checkpoint_path(self) -> str:
        """Where a stop signal's checkpoint goes: the trainer's :class:`ModelCheckpoint`'s "last" file
        (``<dirpath>/last.ckpt``, so ``ckpt_path="last"`` finds it; a ``save_last="link"`` symlink is replaced by
        a file); else, with a logger, the run's own folder, where Lightning's default ModelCheckpoint writes:
        ``<save_dir>/<name>/version_N/checkpoints/last.ckpt`` of the first logger (so the runs of a sweep started in
        one folder never overwrite each other's); without a logger ``<default_root_dir>/last.ckpt``."""
        trainer = self.trainer
        callback = trainer.checkpoint_callback
        given = getattr(trainer, "_model_checkpoint_given", True)
        if given and isinstance(callback, ModelCheckpoint) and callback.dirpath is not None:
            metrics = {"epoch": torch.tensor(trainer.current_epoch), "step": torch.tensor(trainer.global_step)}
            return callback.format_checkpoint_name(metrics, callback.CHECKPOINT_NAME_LAST)
        if trainer.loggers:  # as Lightning resolves its default ModelCheckpoint's dirpath
            logger = trainer.loggers[0]
            version = logger.version
            version = version if isinstance(version, str) else f"version_{version}"
            save_dir = logger.save_dir or trainer.default_root_dir
            return os.path.join(save_dir, str(logger.name), version, "checkpoints", "last.ckpt")
        return os.path.join(trainer.default_root_dir, "last.ckpt")

    def resume_hint(self, path: str) -> str:
        """How to resume from the stop checkpoint ``path``: under ``lightning-fed fit`` (a Lightning
        ``SaveConfigCallback`` among the callbacks) ``lightning-fed fit --config <the run's saved config.yaml>
        --ckpt_path <path>``; otherwise ``trainer.fit(..., ckpt_path=<path>)``."""
        from lightning.pytorch.cli import SaveConfigCallback

        trainer = self.trainer
        for callback in trainer.callbacks:
            if isinstance(callback, SaveConfigCallback):
                config = os.path.join(trainer.log_dir or trainer.default_root_dir, callback.config_filename)
                if os.path.isfile(config):
                    return f"lightning-fed fit --config {config} --ckpt_path {path}"
        return f"trainer.fit(..., ckpt_path={path!r})"

    def _save_stop_checkpoint(self) -> str:
        """Write the trainer's checkpoint (taken between rounds) to :attr:`stop_checkpoint_path`; returns it."""
        path = self.stop_checkpoint_path
        if os.path.islink(path):
            os.unlink(path)
        self.trainer.save_checkpoint(path, weights_only=False)
        return path

    def _stop_round(self, round_idx: int, signum: int) -> None:
        """Discard round ``round_idx``'s local work, go back to its start, write the checkpoint and end the run.

        Raises:
            SIGTERMException: after SIGTERM.
            KeyboardInterrupt: after SIGINT.
        """
        trainer = self.trainer
        self.client_runner.reset_to_global()
        trainer.lightning_module.zero_grad(set_to_none=True)
        # Progress as at the end of round t-1: optimizer-step counts (global_step) from before this round's clients,
        # the epoch counters back from "round t ready/started" to "t rounds processed and completed".
        self.epoch_loop.load_state_dict(self._round_start_state)
        for tracker in (self.epoch_progress.total, self.epoch_progress.current):
            tracker.ready = tracker.started = tracker.processed
            tracker.completed = tracker.processed
        self.round_failures = []
        self.in_round = False  # the module holds x_t again: the checkpoint is a global model
        path = self._save_stop_checkpoint()
        name = signal.Signals(signum).name
        message = (
            f"Round {round_idx} stopped by {name}: its local work was discarded and the global model reset to the "
            f"round's start; checkpoint written to {path} (resume with {self.resume_hint(path)})."
        )
        log.warning(message)  # logging, not a warning: shown even where warnings are filtered
        if signum == getattr(signal, "SIGINT", None):
            raise KeyboardInterrupt(message) from None
        raise SIGTERMException(message) from None
