"""The federated fit loop's reports (issue #52: moved out of ``loop.py``): the per-round metrics it logs, the warning
of a round without an update, the end-of-fit summary and the run's one-off TensorBoard records.

:class:`RoundReporting` is a part of :class:`~lightning_fed.loop.FederatedFitLoop` (its base class): its methods read
the loop's state (``round_metrics``, the round counts, the client runner's record) and write nothing else.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_fed import _lightning as pl_private
from lightning_fed.client.update import ClientUpdate

#: Names of the per-round metrics the loop logs (TensorBoard step = round).
ROUND_METRICS = (
    "round_train_loss",
    "round_pseudo_grad_norm",
    "round_gradient_diversity",
    "round_time_s",
    "round_local_steps",
    "round_clients",
    "round_clients_dropped",
    "round_clients_unavailable",
)

class RoundReporting:
    """The reporting part of :class:`~lightning_fed.loop.FederatedFitLoop`: the round's train loss, the warning of a
    round without an update, the end-of-fit summary and message, the round metrics' logging and the partition's
    TensorBoard records. Not used on its own.

    Example: the loop is one::

        >>> from lightning_fed.loop import FederatedFitLoop
        >>> issubclass(FederatedFitLoop, RoundReporting), "round_train_loss" in ROUND_METRICS
        (True, True)
    """

    def _round_train_loss(self, updates: list[ClientUpdate], weights: Tensor, round_idx: int) -> float:
        """Σ_i w_i L̄_i over the clients that reported a loss (weights renormalised over them); NaN if none did."""
        reported = [u.loss_steps > 0 for u in updates]
        if not any(reported):
            rank_zero_warn(f"Round {round_idx}: no client reported a training loss; round_train_loss is NaN.")
            return float("nan")
        losses = torch.tensor([u.loss for u in updates], dtype=torch.float64)
        if not all(reported):
            mask = torch.tensor(reported)
            weights = torch.where(mask, weights, torch.zeros_like(weights))
            weights = weights / weights.sum()
            losses = torch.where(mask, losses, torch.zeros_like(losses))
        return float((weights * losses).nansum())

    def _warn_round_without_update(self, rnd: "_Round") -> None:
        """The warning of a round in which no client update was applied: a DP step on noise alone, too few reports
        for the aggregator, or no report at all (a restored round was warned about by
        :meth:`_nonfinite_server_step`)."""
        if rnd.step is not None:
            rank_zero_warn(f"Round {rnd.idx}: no client reported back; the server stepped with the DP noise alone "
                           "(Poisson cohorts: every round releases a noised update).")
        elif rnd.restored:
            pass  # warned by _nonfinite_server_step
        elif rnd.too_few is not None:
            rank_zero_warn(
                f"Round {rnd.idx}: {rnd.num_too_few} clients reported back, too few for the aggregator: {rnd.too_few} "
                "The round is skipped: the global model and the server optimizer's state are unchanged, and the "
                f"{rnd.num_too_few} reports are counted in round_clients_dropped."
            )
        else:
            cohort = rnd.selection.cohort
            why = (f"all {len(cohort)} sampled clients failed or were dropped" if len(cohort) else
                   _unavailable_reason(self.datamodule) if rnd.selection.unavailable else "no client was sampled")
            rank_zero_warn(f"Round {rnd.idx}: no client reported back ({why}); the global model is unchanged.")

    def _warn_end_of_fit(self, limit: int = 10) -> None:
        """The end-of-fit summary, a warning when there is something to say: the sampled clients that never trained
        (never reported back an update: each failed or was dropped in every round it was sampled in), the first
        ``limit`` named with their rounds and last error; and the rounds whose server step was undone
        (``on_nonfinite_server_step='restore'``)."""
        record = self.client_runner.client_record
        never = record.never_trained()
        parts = []
        if never:
            named = "; ".join(
                f"client {cid} (sampled in {record.sampled[cid]} round(s); last: "
                f"{record.last_failure[cid][1] if cid in record.last_failure else 'no update'})"
                for cid in never[:limit])
            more = f"; and {len(never) - limit} more" if len(never) > limit else ""
            parts.append(f"{len(never)} of the {len(record.sampled)} sampled clients never trained (dropped in every "
                         f"round they were sampled in): {named}{more}")
        if self._rounds_restored:
            parts.append(f"{self._rounds_restored} round(s) had their non-finite server step undone "
                         "(on_nonfinite_server_step='restore')")
        if parts:
            rank_zero_warn(f"End of fit after {self._rounds_run} round(s): " + ". ".join(parts) + ".")

    def _no_update_message(self) -> str:
        """Why no round of the run had an update (:meth:`on_run_end`), from the counts of
        ``_rounds_without_updates``."""
        dm = self.datamodule
        counts, run = self._rounds_without_updates, self._rounds_run
        sampling = getattr(dm, "cohort_sampling", "fixed_size")
        rate = "" if sampling != "poisson" else (
            f"cohort_sampling='poisson' draws each of the num_clients={dm.num_clients} clients with probability "
            f"q = clients_per_round/num_clients = {dm.clients_per_round}/{dm.num_clients} = "
            f"{dm.clients_per_round / dm.num_clients:.4g} per round")
        if counts.get("empty", 0) == run:
            why = rate if sampling == "poisson" else f"cohort_sampling={sampling!r}"
            return (f"No client was sampled in any of the {run} round(s) of this run ({why}): every cohort was empty, "
                    "so the global model was never updated. Use a larger sampling rate (clients_per_round) or more "
                    "rounds (max_epochs).")
        reasons = {
            "empty": "no client was sampled (an empty cohort" + (f": {rate}" if sampling == "poisson" else "") + ")",
            "unavailable": _unavailable_reason(dm),
            "failed": "every sampled client failed or was dropped (see the warnings above)",
            "too_few": "too few clients reported for the aggregator",
            "restored": "the server step made the model or the server state non-finite and was undone "
                        "(on_nonfinite_server_step='restore')",
        }
        parts = [f"{counts[k]} round(s): {text}" for k, text in reasons.items() if counts.get(k)]
        if not parts:  # (every reason is counted above; never an empty "()")
            parts = ["see the warnings above"]
        return (f"No client reported back in any of the {run} round(s) of this run ({'; '.join(parts)}): the global "
                "model was never updated.")

    def _log_round_metrics(self, module: Any) -> None:
        # (a module's own `log` gets every call)
        fast = self.fast_round_logging and type(module).log is LightningModule.log and "log" not in vars(module)
        with pl_private.hook_name(module, "on_train_epoch_end"):
            for name, value in self.round_metrics.items():
                prog_bar = name == "round_train_loss"
                if not (fast and pl_private.log_epoch_mean_again(module, name, value, prog_bar)):
                    module.log(name, value, on_step=False, on_epoch=True, batch_size=1, prog_bar=prog_bar)

    def _log_partition(self) -> None:
        """Once per run, to every TensorBoard logger: the federated hyper-parameters (HParams tab), the partition's
        size statistics and its clients × classes figure (see :mod:`lightning_fed.tensorboard`)."""
        if self._partition_logged:
            return
        self._partition_logged = True
        from lightning_fed.tensorboard import log_federated_hparams, log_partition

        log_federated_hparams(self.trainer)
        log_partition(self.trainer, self.datamodule.partition)


def _unavailable_reason(dm: Any) -> str:
    """Why every sampled client of a round was unavailable, naming the options that make clients unavailable: random
    dropout (``client_dropout``) and, with a device model (issue #53), a missed ``round_deadline`` or a device
    offline."""
    causes = [f"client_dropout={getattr(dm, 'client_dropout', 0)}"]
    if getattr(dm, "device_model", None) is not None:
        deadline = getattr(dm, "round_deadline", None)
        if deadline is not None:
            causes.append(f"missed round_deadline={deadline} s (deadline_policy={getattr(dm, 'deadline_policy', None)!r})")
        causes.append("offline per the device_model's availability")
    if len(causes) == 1:
        return f"every sampled client dropped out ({causes[0]})"
    return "every sampled client dropped out or missed the round (" + "; ".join(causes) + ")"
