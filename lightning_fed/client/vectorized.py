"""A client executor that trains the whole cohort at once with ``torch.func`` (``vmap`` over clients).

The cross-device FL simulation of Reddi et al. 2021 (Alg. 1, l. 4-9) trains C clients from the same x_t, each
with its own data and a fresh client optimizer. :class:`~lightning_fed.client.sequential.SequentialExecutor` does that one
client and one mini-batch at a time through Lightning's optimization loop; :class:`VectorizedExecutor` instead keeps
one stacked copy of the trainable parameters per client (``[C, *shape]``) and, at local step k, computes every
still-active client's gradient of its own k-th mini-batch in one call,
``vmap(grad_and_value(training_step under functional_call))``, then applies the client optimizer's update rule
to the stacked tensors through torch's functional optimizers, ``torch.optim.sgd.sgd`` / ``torch.optim.adam.adam``
with ``foreach=True`` (elementwise ops, so row i is what ``torch.optim.SGD``/``Adam`` computes for client i alone,
bit for bit on CPU). Not ``fused=True``: torch 2.14's fused CPU kernels round differently (one float32 step, fresh
state, 100 003 elements: Adam max |fused − foreach| 6e-8; SGD with momentum 3e-8 after six steps, on the elements
past the last full SIMD vector), which would change today's results.

It is exact — the same :class:`~lightning_fed.ClientUpdate` s as the sequential executor up to floating-point
rounding of batched kernels — where it applies, and falls back to the sequential executor (logging the reason once)
wherever it cannot be: see :meth:`VectorizedExecutor.incompatibility`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from typing import Any, Callable, Optional

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, ModelSummary, ProgressBar
from lightning.pytorch.core.hooks import DataHooks
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.optim.adam import adam as functional_adam
from torch.optim.sgd import sgd as functional_sgd
from torch.utils._pytree import tree_map
from torch.utils.data import TensorDataset, default_collate

from lightning_fed import _lightning as pl_private
from lightning_fed.checks import check_int
from lightning_fed.client.algorithm import dispatch_only
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.client.cohort_lstm import cohort_lstm, uses_fused_rnn
from lightning_fed.client.runner import ClientRunner
from lightning_fed.client.lean_step import unwrapped_federated_ddp
from lightning_fed.client.sequential import (
    ClientExecutor,
    RoundResult,
    SequentialExecutor,
    client_seed,
    gather_round,
    rank_share,
    seed_client,
)
from lightning_fed.client.vectorized_logging import ClientLogSums, LogRecorder, register_logged_values
from lightning_fed.datamodules.federated import FederatedDataModule

__all__ = ["VectorizedExecutor"]

log = logging.getLogger(__name__)

_RANDOMNESS = ("error", "different")
_ON_UNSUPPORTED = ("fallback", "raise")

#: LightningModule hooks that the sequential executor runs at every local step; a module overriding one of them
#: needs the sequential executor (the vectorized step calls ``training_step`` only).
_MODULE_STEP_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_zero_grad",
    "optimizer_zero_grad",
    "on_before_backward",
    "backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "configure_gradient_clipping",
    "optimizer_step",
)
#: Batch-transfer hooks (on the module or the data module).
_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")
#: Callback hooks that fire at every local step in the sequential executor.
_CALLBACK_STEP_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)
#: Normalisation layers whose running statistics are updated in place in train mode.
_RUNNING_STAT_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)


class _Unsupported(Exception):
    """Raised internally when the module/optimizer cannot be vectorized exactly."""


class _TrainingStep(nn.Module):
    """Wraps a LightningModule so that ``functional_call`` runs its ``training_step`` instead of ``forward``."""

    def __init__(self, module: nn.Module, pass_batch_idx: bool) -> None:
        super().__init__()
        self.module = module
        self.pass_batch_idx = pass_batch_idx

    def forward(self, batch: Any, batch_idx: int) -> Any:
        if self.pass_batch_idx:
            return self.module.training_step(batch, batch_idx)
        return self.module.training_step(batch)


@contextlib.contextmanager
def _logging_recorded(module: nn.Module, recorder: Optional[LogRecorder] = None):
    """Make ``module.log`` and ``module.log_dict`` (instance attributes) record into ``recorder`` (a throwaway one
    by default), restoring them afterwards."""
    recorder = LogRecorder() if recorder is None else recorder
    patched = []
    for name in ("log", "log_dict"):
        if name not in module.__dict__:
            module.__dict__[name] = getattr(recorder, name)
            patched.append(name)
    try:
        yield
    finally:
        for name in patched:
            del module.__dict__[name]


def _loss_of(output: Any) -> Tensor:
    """The loss tensor of a ``training_step`` output (a tensor, or a mapping with ``"loss"``).

    Raises:
        _Unsupported: ``None`` (a skipped step) or anything else.
    """
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("loss"), Tensor):
        return output["loss"]
    raise _Unsupported(
        f"training_step returned {type(output).__name__}; the vectorized executor needs a loss tensor (or a dict "
        "with 'loss') at every step"
    )


def _group_hparams(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The supported optimizer's per-group hyper-parameters as plain Python numbers.

    Raises:
        _Unsupported: an optimizer or an option the executor does not implement.
    """
    kind = type(optimizer)
    groups = []
    for group in optimizer.param_groups:
        lr = group["lr"]
        lr = float(lr.item()) if isinstance(lr, Tensor) else float(lr)
        if kind is torch.optim.SGD:
            h = dict(
                kind="sgd",
                lr=lr,
                momentum=float(group.get("momentum", 0.0)),
                dampening=float(group.get("dampening", 0.0)),
                weight_decay=float(group.get("weight_decay", 0.0)),
                nesterov=bool(group.get("nesterov", False)),
                maximize=bool(group.get("maximize", False)),
            )
        elif kind in (torch.optim.Adam, torch.optim.AdamW):
            beta1, beta2 = (float(b.item()) if isinstance(b, Tensor) else float(b) for b in group["betas"])
            h = dict(
                kind="adam",
                lr=lr,
                beta1=beta1,
                beta2=beta2,
                eps=float(group["eps"]),
                weight_decay=float(group.get("weight_decay", 0.0)),
                amsgrad=bool(group.get("amsgrad", False)),
                maximize=bool(group.get("maximize", False)),
                decoupled=bool(group.get("decoupled_weight_decay", kind is torch.optim.AdamW)),
            )
        else:
            raise _Unsupported(
                f"client optimizer {kind.__name__} is not supported (only torch.optim.SGD, Adam and AdamW)"
            )
        if any(p.is_complex() or p.is_sparse for p in group["params"]):
            raise _Unsupported("complex or sparse parameters are not supported")
        groups.append(h)
    return groups


class VectorizedExecutor(ClientExecutor):
    """Trains the cohort's clients simultaneously with ``torch.func.vmap``: one stacked parameter copy per client.

    Per round: the trainable parameters x_t (those in the client optimizer that require a gradient and that the
    loss uses) are stacked into ``[C', *shape]`` tensors, one row per client (C' = ``max_parallel`` or the cohort
    size C). At local step k the clients that still have a k-th mini-batch (clients sorted by their number of
    steps, so the active ones are a prefix) are grouped by the size of that batch; each group's batches are
    stacked (``[G, B, ...]``) and one ``vmap(grad_and_value(training_step))`` call gives every client's loss and
    gradient at its own parameters. The client optimizer's rule is then applied to the active rows only — a client
    that has finished keeps its parameters and optimizer state — with the hyper-parameters of the client optimizer
    at the start of the round (per parameter group):

    * ``torch.optim.SGD``: weight decay, momentum (the buffer starts as the first gradient), dampening, Nesterov,
      ``maximize`` — ``torch.optim.sgd.sgd(..., foreach=True)`` on the stacked rows;
    * ``torch.optim.Adam``/``AdamW``: bias corrections 1 − β^k, ε added to √v̂, coupled (Adam) or decoupled
      (AdamW / ``decoupled_weight_decay``) weight decay, AMSGrad, ``maximize`` —
      ``torch.optim.adam.adam(..., foreach=True)`` on the stacked rows and moments (step count k + 1).

    The resulting :class:`~lightning_fed.ClientUpdate` s mean what the sequential executor's mean: Δ_i = x_i − x_t,
    ``num_samples`` = |D_i|, ``num_steps``, the mean local loss, the round's client learning rate, the global
    buffers (unchanged by local work), ``extras = {}``. Batches are those of ``datamodule.client_batches(cid,
    round)``, fetched as the data module's ``client_dataloader`` would: a dataset's ``get_batch(index)`` if it has
    one, a ``TensorDataset``'s tensors indexed directly, else per-sample ``__getitem__`` (or ``__getitems__``) and
    ``default_collate``. ``trainer.global_step`` advances by the cohort's total local steps, as in sequential training.

    Contract with the module: ``training_step(batch, batch_idx)`` must be a pure function of the parameters and the
    batch that returns the loss (or ``{"loss": ...}``). Values it logs with ``self.log``/``self.log_dict`` are
    recorded per client inside ``vmap`` (:mod:`lightning_fed.client.vectorized_logging`) and reach the round's log,
    the callback metrics and the loggers as through the sequential executor (the same client-weighted values up to
    float rounding); a ``torchmetrics.Metric``, a reduction other than the mean, ``sync_dist`` or
    ``metric_attribute`` cannot be recorded that way, and a ``UserWarning`` names such values once (the loop's
    round metrics, ``round_train_loss``, ..., are always logged). Inputs of a group of clients must have equal
    shapes; clients whose k-th batches differ in size (a short last batch) are run in separate vmapped calls, never
    padded (a padded mean would change the loss).

    Falls back to :class:`~lightning_fed.client.sequential.SequentialExecutor` (exactly the sequential result; the reason is
    logged once at WARNING and kept in :attr:`fallback_reason`) when :meth:`incompatibility` names a reason: module
    buffers updated in train mode (BatchNorm/InstanceNorm running statistics, or any buffer the first probe step
    changes in place), random operations in ``training_step`` (e.g. Dropout with p > 0; vmap's
    ``randomness="error"`` detects them) unless ``randomness="different"``, another optimizer or several,
    manual optimization, gradient clipping, a non-32-bit precision plugin, a strategy other than single-device or
    lightning_fed's :class:`~lightning_fed.distributed.FederatedDDPStrategy` (there each rank vectorizes its share of
    the cohort and the updates are gathered as the sequential executor's are), per-step
    hooks overridden by the module or a callback (other than progress bars, :class:`ModelSummary` and a
    :class:`ModelCheckpoint` without step-based saving), callbacks defining ``on_client_start`` (they may change
    the module per client), a server optimizer with a client channel (``configure_client`` /
    ``collect_client_extras`` overridden: client-side algorithms), a data module that overrides
    ``client_dataloader`` or the batch-transfer hooks, a per-client time limit (the loop's ``client_timeout_s``:
    vmapped clients cannot be stopped one by one, so the sequential executor applies it), or an operation ``vmap``
    cannot batch. With ``on_unsupported="raise"`` each of these is instead a ``ValueError`` naming it, raised on
    the fit's first round before any client is trained.

    So it supports: modules whose ``training_step`` is built from operations with ``vmap`` batching rules (linear,
    convolution, pooling, activations, embeddings, LayerNorm/GroupNorm, BatchNorm without running statistics,
    losses; ``torch.nn.LSTM`` through the cohort LSTM, other recurrent layers through PyTorch's composite
    implementation); one client optimizer, ``torch.optim.SGD``, ``Adam`` or ``AdamW`` (exactly those classes; every
    option, any number of parameter groups; ``foreach``/``fused``/``capturable`` only choose kernels and are
    ignored), parameters frozen or unused by the loss; the loop's per-round learning-rate schedulers
    (``interval="epoch"``); ``precision="32-true"`` on one device (CPU or one GPU), or on each rank of a
    :class:`~lightning_fed.distributed.FederatedDDPStrategy`; a
    :class:`~lightning_fed.datamodules.FederatedDataModule` (or a subclass keeping ``client_dataloader``).

    Failures: if the vectorized training of a round raises, the error propagates with the loop's
    ``on_client_failure="raise"``; with ``"skip"`` the round is retried by the sequential executor, which isolates
    and drops the failing client(s) as usual. A client whose update is not finite does not affect the others (vmap
    rows are independent) and is dropped by the runner.

    Randomness: with the default ``randomness="error"`` every random operation inside ``training_step`` makes the
    executor fall back, so results equal the sequential executor's. ``randomness="different"`` runs such modules
    vectorized with independent random draws per client (vmap's ``randomness="different"``), seeded per round by
    :func:`~lightning_fed.client.sequential.client_seed` of the chunk's first client: statistically the same training,
    but the dropout masks differ from the sequential executor's, so results are not bitwise comparable.

    Memory: the stacked parameters, gradients and optimizer state (momentum buffer; Adam's two moments) take about
    (2 + state) × C' × the model's parameter bytes, plus the activations of C' clients' batches at once. Use
    ``max_parallel`` to bound C' (the cohort is then trained in chunks of at most that many clients).

    Recurrent layers: oneDNN's and cuDNN's fused RNN kernels have no ``vmap`` batching rule. While the vectorized
    step runs, every ``torch.nn.LSTM`` (exactly that class) with ``bidirectional=False``, ``proj_size=0`` and no
    active inter-layer dropout (``dropout=0``, or ``num_layers=1``, or eval mode), called on a batched tensor
    (``batch_first`` True or False, any ``num_layers``/``bias``, with or without ``(h_0, c_0)``), runs the
    cohort-batched LSTM of :mod:`lightning_fed.client.cohort_lstm` (one batched matrix product over the clients
    per time step, hand-written back-propagation through time; the same function). Other recurrent layers (GRU,
    RNN, bidirectional or projected LSTMs, ``PackedSequence`` inputs) run PyTorch's composite implementation with
    the fused kernels disabled: exact, but slower and with more memory than sequential training.

    Args:
        randomness: ``"error"`` (default: exact; fall back on random ops) or ``"different"`` (see above).
        max_parallel: Most clients trained simultaneously (default ``None``: the whole cohort).
        on_unsupported: ``"fallback"`` (default: train sequentially, exactly, with the reason logged once) or
            ``"raise"``: a ``ValueError`` naming the reason (the setting, hook, layer or optimizer) on the fit's
            first round (the static checks and the probe step run there) or, for a ``training_step`` that stops
            returning a loss, at that step's round.

    Raises:
        ValueError: an unknown ``randomness`` or ``on_unsupported``, or a ``max_parallel`` that is not a positive
            integer; with ``on_unsupported="raise"``, during ``fit`` when the run cannot be vectorized.

    Example: the same run vectorised and sequential (3 clients, 2 local epochs of batch size 1)::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Line(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return ((self.w * x - y) ** 2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
        >>> data = TensorDataset(x, 2 * x)
        >>> def quiet_trainer(**kwargs):
        ...     return FederatedTrainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
        ...                             enable_checkpointing=False, accelerator="cpu", **kwargs)
        >>> def run(executor):
        ...     dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=3), clients_per_round=3,
        ...                              batch_size=1, local_epochs=2)
        ...     model, trainer = Line(), quiet_trainer(max_epochs=2, client_executor=executor)
        ...     trainer.fit(model, datamodule=dm)
        ...     return model.w.detach(), trainer.global_step
        >>> vectorized = VectorizedExecutor()
        >>> (w_vec, steps_vec), (w_seq, steps_seq) = run(vectorized), run("sequential")
        >>> vectorized.fallback_reason is None, steps_vec, steps_seq  # 2 rounds × (2 + 1 + 1 batches) × 2 epochs
        (True, 16, 16)
        >>> torch.allclose(w_vec, w_seq, rtol=1e-12, atol=0)
        True
        >>> VectorizedExecutor(randomness="same")
        Traceback (most recent call last):
        ...
        ValueError: `randomness` must be one of ('error', 'different'), got 'same'.
    """

    supports_client_timeout = True  # by falling back to sequential training

    def __init__(
        self, randomness: str = "error", max_parallel: Optional[int] = None, on_unsupported: str = "fallback"
    ) -> None:
        if randomness not in _RANDOMNESS:
            raise ValueError(f"`randomness` must be one of {_RANDOMNESS}, got {randomness!r}.")
        if on_unsupported not in _ON_UNSUPPORTED:
            raise ValueError(f"`on_unsupported` must be one of {_ON_UNSUPPORTED}, got {on_unsupported!r}.")
        self.on_unsupported = on_unsupported
        check_int("max_parallel", max_parallel, 1, optional=True)
        self.randomness = randomness
        self.max_parallel = None if max_parallel is None else int(max_parallel)
        self.sequential = SequentialExecutor()
        #: Why the last round fell back to sequential training (``None`` if it ran vectorized).
        self.fallback_reason: Optional[str] = None
        self._warned: set[str] = set()
        self._recorder = LogRecorder()  # self.log in the vmapped training_step (values recorded per client)
        self._warned_logs: set[str] = set()
        self._probed: dict[tuple[int, int], Optional[str]] = {}
        self._frozen: dict[tuple[int, int], frozenset[int]] = {}

    # ------------------------------------------------------------------ compatibility
    def incompatibility(self, runner: ClientRunner) -> Optional[str]:
        """Why this trainer/module/optimizer cannot be trained vectorized (static checks), or ``None``.

        A ``None`` here is followed, on the first round of a fit, by a probe step (one ordinary and one vmapped
        ``training_step`` on cohort data) that catches what only running shows: random operations, in-place buffer
        updates, operations without a batching rule, a ``training_step`` that does not return a loss.
        """
        trainer = runner.trainer
        module = trainer.lightning_module
        if runner.client_timeout_s is not None:
            return "client_timeout_s is set (a per-client time limit needs the clients trained one at a time)"
        if not module.automatic_optimization:
            return "the module uses manual optimization"
        if len(trainer.optimizers) != 1:
            return f"{len(trainer.optimizers)} optimizers (the vectorized executor supports exactly one)"
        try:
            _group_hparams(trainer.optimizers[0])
        except _Unsupported as err:
            return str(err)
        if type(trainer.precision_plugin) is not Precision:
            return f"precision plugin {type(trainer.precision_plugin).__name__} (only 32-bit '32-true' is supported)"
        if type(trainer.strategy) is not SingleDeviceStrategy and not unwrapped_federated_ddp(trainer.strategy):
            return (f"strategy {type(trainer.strategy).__name__} (single-device training, or lightning_fed's "
                    "FederatedDDPStrategy: each rank vectorizes its share of the cohort)")
        if trainer.gradient_clip_val:
            return f"gradient clipping (gradient_clip_val={trainer.gradient_clip_val})"
        for name in _MODULE_STEP_HOOKS + _TRANSFER_HOOKS:
            if is_overridden(name, module):
                return f"the module overrides the per-step hook `{name}`"
        datamodule = runner.datamodule
        for name in _TRANSFER_HOOKS:
            if is_overridden(name, datamodule, parent=DataHooks):
                return f"the data module overrides `{name}`"
        if type(datamodule).client_dataloader is not FederatedDataModule.client_dataloader:
            return f"{type(datamodule).__name__} overrides `client_dataloader`"
        for sub in module.modules():
            if isinstance(sub, _RUNNING_STAT_LAYERS) and sub.training and sub.track_running_stats:
                return f"{type(sub).__name__} updates its running statistics in train mode"
            if getattr(sub, "sparse", False) is True:
                return f"{type(sub).__name__} has sparse gradients"
        server = runner.server_optimizer
        for name in ("configure_client", "collect_client_extras"):
            if server is not None and is_overridden(name, server, parent=ServerOptimizer):
                return f"server optimizer {type(server).__name__} overrides `{name}` (a client-side algorithm)"
        if server is not None and server.server_client_algorithms:
            return f"server optimizer {type(server).__name__} runs client algorithms {server.server_client_algorithms}"
        if runner.client_halves.algorithms:
            return f"the run has client algorithms {runner.client_halves.algorithms}"
        for callback in trainer.callbacks:
            if callable(getattr(callback, "on_client_start", None)):
                name = type(callback).__name__
                return f"callback {name} defines `on_client_start` (it may change the module per client)"
            if isinstance(callback, (ProgressBar, ModelSummary)):
                continue
            if isinstance(callback, ModelCheckpoint):
                every_n_train_steps, train_time_interval = pl_private.model_checkpoint_step_triggers(callback)
                if not every_n_train_steps and train_time_interval is None:
                    continue
            for name in _CALLBACK_STEP_HOOKS:
                if is_overridden(name, callback, parent=Callback) and not dispatch_only(callback, name):
                    return f"callback {type(callback).__name__} overrides the per-step hook `{name}`"
        return None

    def _fall_back(self, runner: ClientRunner, cohort: np.ndarray, round_idx: int, reason: str):
        if self.on_unsupported == "raise":
            raise ValueError(
                f"VectorizedExecutor(on_unsupported='raise') cannot train round {round_idx}'s cohort vectorized: "
                f"{reason}. Change that, or use on_unsupported='fallback' (exact sequential training) or "
                "client_executor='sequential'."
            )
        self.fallback_reason = reason
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("VectorizedExecutor: training clients sequentially because %s.", reason)
        return self.sequential.run_round(runner, cohort, round_idx)

    # ------------------------------------------------------------------ the round
    def run_round(self, runner: ClientRunner, cohort: np.ndarray, round_idx: int) -> RoundResult:
        reason = self.incompatibility(runner)
        if reason is not None:
            return self._fall_back(runner, cohort, round_idx, reason)
        trainer = runner.trainer
        module = trainer.lightning_module
        key = (id(trainer), id(module))
        if key not in self._probed:
            self._probed[key] = self._probe(runner, cohort, round_idx, key)
        if self._probed[key] is not None:
            return self._fall_back(runner, cohort, round_idx, self._probed[key])
        self.fallback_reason = None

        datamodule = runner.datamodule
        cids = rank_share(runner, cohort)  # the whole cohort, or under several processes this rank's share
        schedules = {cid: datamodule.client_batches(cid, round_idx) for cid in cids}
        steps = np.array([len(schedules[c]) for c in cids], dtype=np.int64)
        order = np.argsort(-steps, kind="stable")  # most steps first: the active clients are always a prefix
        chunk = self.max_parallel or max(len(cids), 1)
        results: dict[int, tuple[list[Tensor], float, dict[str, float]]] = {}
        marks = runner.frozen_marks()
        try:
            with torch.no_grad():
                for start in range(0, len(cids), chunk):
                    members = [cids[i] for i in order[start : start + chunk]]
                    if self.randomness == "different":
                        seed_client(client_seed(datamodule.seed, round_idx, members[0]), runner.trainer.strategy.root_device)
                    results.update(self._train_chunk(runner, members, [schedules[c] for c in members], key))
        except _Unsupported as err:  # found only at a later step (e.g. training_step returned None): fall back for good
            self._probed[key] = str(err)
            return self._fall_back(runner, cohort, round_idx, str(err))
        except Exception as error:  # noqa: BLE001 - isolate the failing client(s) as the sequential executor does
            if runner.raises_on_failure:
                raise
            log.warning(
                "VectorizedExecutor: round %d failed (%s: %s); retrying it sequentially to isolate the failing "
                "client(s).", round_idx, type(error).__name__, error,
            )
            self.fallback_reason = f"round {round_idx} failed under vmap ({type(error).__name__})"
            return self.sequential.run_round(runner, cohort, round_idx)
        runner.check_frozen(marks, "the cohort's vectorized local work")  # frozen parameters: shared, read-only
        for opt in trainer.optimizers:
            opt.state.clear()  # as a fresh client optimizer would be; the sequential run leaves the last client's state
        runner.count_optimizer_steps(int(steps.sum()))
        recorder = self._recorder
        new_names = sorted(recorder.unsupported - self._warned_logs)
        if new_names:  # never silently: values the vmapped training_step logs that cannot be recorded per client
            self._warned_logs.update(new_names)
            rank_zero_warn(
                f"VectorizedExecutor: the values training_step logs with self.log/self.log_dict ({new_names}) are not "
                "recorded while the cohort is trained vectorized (only one number per client with mean reduction, "
                "without sync_dist or metric_attribute, is); the loop's round metrics (round_train_loss, ...) are. "
                "Use client_executor='sequential' to log them."
            )
        logged = [name for name in recorder.kwargs if name not in recorder.unsupported
                  and any(name + "/step" in values or name + "/epoch" in values for _, _, values in results.values())]
        if logged:
            register_logged_values(trainer, recorder, logged)
            for cid in cids:
                runner.round_log.record_client(cid, {f"training_step.{k}": v for k, v in results[cid][2].items()})
        updates = []
        for position, cid in enumerate(cids):
            delta, loss, _ = results[cid]
            update = runner.build_update(cid, delta, num_steps=len(schedules[cid]), loss=loss)
            updates.append(update)
            runner.client_end(update, position)
        return gather_round(runner, updates, [], cohort)

    # ------------------------------------------------------------------ internals
    def _setup(self, runner: ClientRunner, key: tuple[int, int]):
        """Trainable parameters (name, index in ``module.parameters()``, group hyper-parameters) and the wrapper."""
        trainer = runner.trainer
        module = trainer.lightning_module
        optimizer = trainer.optimizers[0]
        hparams = _group_hparams(optimizer)
        group_of = {id(p): g for g, group in enumerate(optimizer.param_groups) for p in group["params"]}
        frozen = self._frozen.get(key, frozenset())
        trainable = []
        for index, (name, p) in enumerate(module.named_parameters()):
            if p.requires_grad and id(p) in group_of and index not in frozen:
                trainable.append((name, index, group_of[id(p)]))
        wrapper = _TrainingStep(module, is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2))
        return trainable, hparams, wrapper

    @staticmethod
    @contextlib.contextmanager
    def _kernel_flags(module: nn.Module):
        """While vmapping: ``torch.nn.LSTM`` layers run the cohort-batched LSTM (:mod:`.cohort_lstm`) where their
        configuration allows; if other recurrent layers remain, the fused RNN kernels (no vmap batching rule) are
        disabled so that they run PyTorch's composite implementation."""
        with cohort_lstm(module):
            if not uses_fused_rnn(module):
                yield
                return
            saved = torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled
            torch.backends.mkldnn.enabled = False
            torch.backends.cudnn.enabled = False
            try:
                yield
            finally:
                torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled = saved

    def _fetch(self, runner: ClientRunner, index_batches: list[np.ndarray], device: torch.device) -> Any:
        """Stack the given clients' mini-batches (equal sizes) into one batch with a leading client dimension."""
        dataset = runner.datamodule.train_dataset
        get_batch = getattr(dataset, "get_batch", None)
        if callable(get_batch):  # the TensorBatches protocol of the data module: one slicing call per client
            parts = [get_batch(torch.from_numpy(np.ascontiguousarray(i, dtype=np.int64))) for i in index_batches]
            batch = tree_map(lambda *xs: torch.stack(xs), *parts)
        elif isinstance(dataset, TensorDataset):
            idx = torch.from_numpy(np.stack(index_batches).astype(np.int64, copy=False))
            batch = tuple(t[idx] for t in dataset.tensors)
        else:
            collated = []
            for indices in index_batches:
                items = indices.tolist()
                if hasattr(dataset, "__getitems__"):
                    samples = dataset.__getitems__(items)
                else:
                    samples = [dataset[i] for i in items]
                collated.append(default_collate(samples))
            batch = tree_map(lambda *xs: torch.stack(xs), *collated)
        return tree_map(lambda x: x.to(device, non_blocking=True) if isinstance(x, Tensor) else x, batch)

    def _grad_fn(self, wrapper: _TrainingStep, names: list[str], batch_idx: int, recorder: LogRecorder) -> Callable:
        """``vmap(grad_and_value(training_step))``: per client the gradients and ``(loss, logged values)``."""
        def loss_fn(params: dict[str, Tensor], batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
            recorder.begin()
            loss = _loss_of(functional_call(wrapper, params, (batch, batch_idx), strict=False))
            return loss, recorder.take()

        return vmap(grad_and_value(loss_fn, has_aux=True), in_dims=(0, 0), randomness=self.randomness)

    def _probe(self, runner: ClientRunner, cohort: np.ndarray, round_idx: int, key: tuple[int, int]):
        """One ordinary and one vmapped ``training_step`` on the first cohort clients' first batches; returns a
        fallback reason or ``None``. Also records the trainable parameters the loss does not use (the sequential
        optimizer skips them: no gradient, no weight decay)."""
        trainer = runner.trainer
        module = trainer.lightning_module
        datamodule = runner.datamodule
        device = runner.global_params[0].device if runner.global_params else torch.device("cpu")
        params = list(module.parameters())
        buffers = list(module.buffers())
        versions = [b._version for b in buffers]
        try:
            trainable, _, wrapper = self._setup(runner, key)
            firsts = []
            for cid in cohort.tolist()[:2]:
                batches = datamodule.client_batches(int(cid), round_idx)
                if batches:
                    firsts.append(batches[0])
            if not firsts:
                return None
            firsts = [b for b in firsts if len(b) == len(firsts[0])]
            batch = self._fetch(runner, firsts, device)
            probe_log = LogRecorder()  # what the probe steps log is thrown away
            with _logging_recorded(module, probe_log), self._kernel_flags(module):
                with torch.enable_grad():
                    single = tree_map(lambda x: x[0] if isinstance(x, Tensor) else x, batch)
                    loss = _loss_of(wrapper(single, 0))
                    wrt = [params[i] for _, i, _ in trainable]
                    grads = (
                        torch.autograd.grad(loss, wrt, allow_unused=True) if loss.requires_grad else [None] * len(wrt)
                    )
                self._frozen[key] = frozenset(i for (_, i, _), g in zip(trainable, grads) if g is None)
                trainable, _, wrapper = self._setup(runner, key)
                names = ["module." + n for n, _, _ in trainable]
                stacked = {
                    n: params[i].detach().unsqueeze(0).expand(len(firsts), *params[i].shape)
                    for n, (_, i, _) in zip(names, trainable)
                }
                self._grad_fn(wrapper, names, 0, probe_log)(stacked, batch)
        except _Unsupported as err:
            return str(err)
        except Exception as err:  # an op vmap cannot batch, a random op, data that cannot be stacked, ...
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            return f"the probe step failed under vmap ({type(err).__name__}: {message})"
        finally:
            changed = [b._version != v for b, v in zip(buffers, versions)]
            if any(changed):
                with torch.no_grad():
                    for b, g in zip(buffers, runner.global_buffers):
                        b.copy_(g)
        if any(changed):
            return "training_step updates module buffers in place"
        return None

    def _train_chunk(
        self, runner: ClientRunner, members: list[int], schedules: list[list[np.ndarray]], key: tuple[int, int]
    ) -> dict[int, tuple[list[Tensor], float, dict[str, float]]]:
        """Train ``members`` (sorted by number of steps, descending) together; returns cid -> (Δ, mean loss, the
        client's logged values as :meth:`ClientLogSums.client_values` gives them)."""
        module = runner.trainer.lightning_module
        trainable, hparams, wrapper = self._setup(runner, key)
        names = ["module." + n for n, _, _ in trainable]
        x_t = runner.client_start_params  # F only (frozen ones are shared, never stacked); x̂_t under a downlink
        at = {index: j for j, index in enumerate(runner.federated_positions)}  # module position -> position in F
        device = x_t[0].device
        n = len(members)
        stacked = [x_t[at[i]].detach().unsqueeze(0).repeat(n, *([1] * x_t[at[i]].dim())) for _, i, _ in trainable]
        state: dict[str, dict[int, Tensor]] = {}  # optimizer state name -> trainable index -> [n, *shape]
        loss_sum = torch.zeros(n, dtype=torch.float32, device=device)
        loss_dtype_set = False
        num_steps = [len(s) for s in schedules]
        groups_of_params: dict[int, list[int]] = {}
        for j, (_, _, g) in enumerate(trainable):
            groups_of_params.setdefault(g, []).append(j)

        recorder = self._recorder
        logged = ClientLogSums(n)
        with _logging_recorded(module, recorder), self._kernel_flags(module):
            for k in range(max(num_steps, default=0)):
                active = sum(1 for s in num_steps if s > k)
                sizes = [len(schedules[i][k]) for i in range(active)]
                by_size: dict[int, list[int]] = {}
                for i, size in enumerate(sizes):
                    by_size.setdefault(size, []).append(i)
                views = [p[:active] for p in stacked]
                grad_fn = self._grad_fn(wrapper, names, k, recorder)
                if len(by_size) == 1:
                    batch = self._fetch(runner, [schedules[i][k] for i in range(active)], device)
                    with torch.enable_grad():
                        grads_dict, (losses, values) = grad_fn(dict(zip(names, views)), batch)
                    logged.add(values, recorder.taken, list(range(active)), sizes[0])
                    grads = [grads_dict[nm] for nm in names]
                else:
                    grads = [torch.empty_like(v) for v in views]
                    losses = torch.empty(active, dtype=loss_sum.dtype, device=device)
                    for size, rows in by_size.items():
                        index = torch.tensor(rows, dtype=torch.long, device=device)
                        batch = self._fetch(runner, [schedules[i][k] for i in rows], device)
                        sub = {nm: v.index_select(0, index) for nm, v in zip(names, views)}
                        with torch.enable_grad():
                            g_dict, (l_group, values) = grad_fn(sub, batch)
                        logged.add(values, recorder.taken, rows, size)
                        for j, nm in enumerate(names):
                            grads[j].index_copy_(0, index, g_dict[nm])
                        losses.index_copy_(0, index, l_group.to(losses.dtype))
                if not loss_dtype_set:
                    loss_sum = loss_sum.to(losses.dtype)
                    loss_dtype_set = True
                loss_sum[:active] += losses.detach()
                for g, js in groups_of_params.items():
                    self._optimizer_step(
                        hparams[g], [views[j] for j in js], [grads[j] for j in js], state, js, k, active
                    )

        out: dict[int, tuple[list[Tensor], float]] = {}
        position = {at[index]: j for j, (_, index, _) in enumerate(trainable)}  # position in F -> stacked row
        deltas_stacked = [torch.sub(p, x_t[at[i]].unsqueeze(0)) for p, (_, i, _) in zip(stacked, trainable)]
        for row, cid in enumerate(members):
            delta = []
            for index, g in enumerate(x_t):
                j = position.get(index)
                delta.append(deltas_stacked[j][row] if j is not None else torch.zeros_like(g))
            steps = num_steps[row]
            loss = math.nan if steps == 0 else float(loss_sum[row]) / steps
            out[cid] = (delta, loss, logged.client_values(row))
        return out

    @staticmethod
    def _optimizer_step(
        h: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        state: dict[str, dict[int, Tensor]],
        js: list[int],
        k: int,
        active: int,
    ) -> None:
        """One client-optimizer step on the active rows (``params`` are ``[active, ...]`` views): torch's functional
        ``torch.optim.sgd.sgd`` / ``torch.optim.adam.adam`` with ``foreach=True`` on the stacked tensors, the
        optimizer state (``state[name][j]``, ``[C', *shape]``, created at step ``k = 0``) sliced to the same rows."""
        if h["kind"] == "sgd":
            bufs = state.setdefault("momentum_buffer", {}) if h["momentum"] != 0 else {}
            momentum_buffers = [bufs[j][:active] if k else None for j in js] if h["momentum"] != 0 else []
            functional_sgd(
                params, grads, momentum_buffers, foreach=True, weight_decay=h["weight_decay"],
                momentum=h["momentum"], lr=h["lr"], dampening=h["dampening"], nesterov=h["nesterov"],
                maximize=h["maximize"],
            )
            if not k:  # torch created the buffers (the first gradients): keep them for the next steps
                bufs.update(zip(js, momentum_buffers))
            return
        names = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if h["amsgrad"] else ())
        moments = [state.setdefault(name, {}) for name in names]
        steps = state.setdefault("step", {})  # every active row has taken k steps: torch increments these to k + 1
        if k == 0:
            for moment in moments:
                moment.update((j, torch.zeros_like(p)) for j, p in zip(js, params))
            steps.update((j, torch.zeros((), dtype=torch.float64)) for j in js)  # float64: exact step counts
        sliced = [[moment[j][:active] for j in js] for moment in moments]
        functional_adam(
            params, grads, sliced[0], sliced[1], sliced[2] if h["amsgrad"] else [], [steps[j] for j in js],
            foreach=True,
            decoupled_weight_decay=h["decoupled"], amsgrad=h["amsgrad"], beta1=h["beta1"], beta2=h["beta2"],
            lr=h["lr"], weight_decay=h["weight_decay"], eps=h["eps"], maximize=h["maximize"],
        )
