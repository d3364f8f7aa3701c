"""Validation against simulated time in TensorBoard (issue #53 item 2).

With a device model (:mod:`lightning_fed.clock`), each round's validation metrics (``val_*``, federated evaluation's
``fed_*val_*``: :func:`lightning_fed.report.validation_metrics`) and ``round_train_loss`` are written a second time
to every TensorBoard logger of the run, under the tag ``time/<metric>``, with the TensorBoard step = the simulated
seconds elapsed at the round's end, rounded to the nearest second (and the event's wall time = those seconds too).
So TensorBoard's scalar ``time/val_acc`` shows accuracy against simulated time on its ``Step`` axis, next to
``val_acc`` against the round; ``clock/elapsed_seconds`` (step = round) gives the exact times. Rounds shorter than a
second may share a step (TensorBoard draws both points). ``lightning-fed report`` leaves the ``time/`` tags out of its
default metrics (they are not ``val_*``); ``scripts/plot_time_to_accuracy.py`` draws the matplotlib figure from the
exact times.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TIME_PREFIX", "log_against_simulated_time"]

#: The tags' prefix: ``time/val_acc`` is ``val_acc`` against simulated seconds.
TIME_PREFIX = "time/"


def log_against_simulated_time(trainer: Any, elapsed_seconds: float) -> dict[str, float]:
    """Write the round's validation metrics and ``round_train_loss`` (``trainer.callback_metrics``) as ``time/<name>``
    at step ``round(elapsed_seconds)`` to each TensorBoard logger of ``trainer`` (rank zero only). Returns what was
    written, ``{tag: value}``.

    Example: nothing to write to without a TensorBoard logger::

        >>> from lightning_fed import FederatedTrainer
        >>> log_against_simulated_time(FederatedTrainer(logger=False, accelerator="cpu"), 12.0)
        {}
    """
    from lightning.pytorch.loggers import TensorBoardLogger

    from lightning_fed.report import validation_metrics

    loggers = [lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
    if not loggers or not trainer.is_global_zero:
        return {}
    metrics = trainer.callback_metrics
    names = [*validation_metrics(metrics), *(["round_train_loss"] if "round_train_loss" in metrics else [])]
    values = {f"{TIME_PREFIX}{n}": float(metrics[n]) for n in names}
    step = int(round(float(elapsed_seconds)))
    for logger in loggers:
        writer = logger.experiment
        for tag, value in values.items():
            writer.add_scalar(tag, value, global_step=step, walltime=float(elapsed_seconds))
        writer.flush()
    return values
