"""Federated evaluation: the global model evaluated on sampled clients' own data, with statistics over clients.

Whenever the global model is validated (every ``check_val_every_n_epoch`` rounds during ``fit``, and under
``trainer.validate``) and the data module has ``eval_clients_per_round`` set, :class:`FederatedEvaluation` (a
callback every :class:`~lightning_fed.FederatedTrainer` carries) evaluates the global model on
``datamodule.select_eval_clients(round)``: for each client it runs the module's own ``validation_step`` over the
client's evaluation batches (:meth:`~lightning_fed.datamodules.FederatedDataModule.client_eval_dataloader`, the
same direct slicing as training) and reads what ``validation_step`` logged into a results collection of its own,
so each client gets the value Lightning would report for that client alone (the batch-size-weighted mean for
``self.log``'s default ``reduce_fx="mean"``, ``compute()`` for a logged ``torchmetrics.Metric``); the central
``val_*`` metrics and the module's ``torchmetrics`` states are left as they were.

For every metric ``m`` logged in ``validation_step`` it logs, in ``on_validation_epoch_end`` (same step as the
central validation metrics):

* ``fed_m/weighted``: Σ_i n_i m_i / Σ_i n_i, n_i = client i's evaluation samples;
* ``fed_m/mean``: the unweighted mean over clients;
* ``fed_m/p10``, ``fed_m/p50``, ``fed_m/p90``: percentiles over clients, NumPy's default ("linear",
  Hyndman & Fan type 7) definition;
* ``fed_m/worst10``: the mean over the worst ⌈0.1·K⌉ of the K clients — the lowest values for a metric that
  grows with quality (accuracy), the highest for one that falls (a name containing ``loss``, ``err``, ``perplexity``,
  ``ppl``, ``mse``, ``mae``, ``rmse`` or ``nll``: :func:`lower_is_better`);
* a TensorBoard histogram ``fed_m`` of the per-client values;
* ``fed_eval_clients``: K.

With ``eval_local_steps`` = k > 0, personalised evaluation (Wang et al. 2019, "Federated Evaluation of On-device
Personalization", local adaptation): each evaluation client starts from the global model, takes k steps of the
module's own optimizer (a fresh one from ``configure_optimizers``) on its training data
(:meth:`~lightning_fed.datamodules.FederatedDataModule.client_personalization_batches`) with the module's
``training_step``, is evaluated as above, and the global model (parameters, buffers, gradients, train/eval mode)
is restored bit for bit; statistics go to ``fed_personalized_m/...``. Its random draws (dropout) use a forked torch
generator seeded by :func:`~lightning_fed.executor.client_seed`, so the training run's random stream is unchanged.

With a personalised method — client halves that keep parts of the model local
(:class:`~lightning_fed.client.personal.LocalParts`: FedBN, FedPer, FedRep) — each evaluation client is also evaluated
with its personal model, the global model with its own state in the kept parts (:func:`personal_models`; a client
never trained has the global model), into ``fed_personal_m/...`` (the same statistics), and the global model is
restored bit for bit. One tag family for every method: without a personalised method each client's personal model
is the global model, so ``fed_personal_m/<stat>`` is logged too, equal to ``fed_m/<stat>``
(:meth:`ClientEvaluation.logged_statistics`), and ``fed_personal_val_acc/weighted`` compares FedAvg with Ditto in one
column. A personalised method in a fit without federated evaluation (``eval_clients_per_round`` ``None``) warns at
fit start, naming ``eval_clients_per_round`` and ``eval_fraction``.

With ``eval_csv`` every federated evaluation appends one row per client (``round, client_id, samples`` then the
metrics, ``personalized_m`` for personalised ones, ``personal_m`` for personal models) to that CSV file. The path is checked at fit / validate start (a
missing folder is created; a directory or an unwritable path is a ``ValueError`` naming ``eval_csv``). A fresh
``fit`` starts the file afresh; a resumed ``fit(ckpt_path=...)`` keeps the rows of the rounds before the resumed
round, removes those of later rounds (written by the interrupted run after its checkpoint) and appends, so each
round appears once.

Each client's evaluation (and personalisation) is treated like a client's local work in training: it runs under the
trainer's ``client_timeout_s``; a client that raises or runs past the limit is dropped from that evaluation with a
warning and counted in ``fed_clients_dropped`` (``on_client_failure="raise"``: the run stops); the others' values
are unchanged. SIGTERM and SIGINT stop federated evaluation at once, even with a hung client (the global model is
restored, no ``fed_*`` values or CSV rows for that round): under ``fit`` the run then stops at the round's end with
its checkpoint (exit status 1), under ``trainer.validate()`` with ``SIGTERMException`` (exit status 1); SIGINT is
Lightning's ``KeyboardInterrupt``. Personalisation steps clip gradients as Lightning's training does
(``configure_gradient_clipping`` with ``gradient_clip_val`` / ``gradient_clip_algorithm``). Refused at fit (and
validate) start: ``limit_val_batches`` as a fraction other than 1.0, ``eval_local_steps`` without automatic
optimization with one optimizer. ``trainer.validate(ckpt_path=...)`` evaluates the clients of the checkpoint's round
(the round whose server update produced its model) and labels its rows with that round.

Every round's per-client training losses (each client's mean local loss, as in ``round_train_loss``) go to a
TensorBoard histogram ``round_client_train_loss``.
"""

from __future__ import annotations

import copy
import csv
import io
import logging
import math
import signal
from typing import Any, Optional, Sequence

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning_fed import _lightning
from lightning_fed.evaluation_results import (  # noqa: F401  (re-exported: lightning_fed.evaluation's API)
    FED_STATISTICS,
    LOWER_IS_BETTER,
    ClientEvaluation,
    _read_csv_rows_before,
    check_eval_csv,
    federated_statistics,
    lower_is_better,
)
from lightning_fed.interrupts import RoundInterrupted

log = logging.getLogger(__name__)

#: TensorBoard histogram tag of the per-client training losses of a round.
TRAIN_LOSS_HISTOGRAM = "round_client_train_loss"


# ---------------------------------------------------------------------------------------------------------------
# Lightning internals used here (private API of lightning.pytorch 2.x), kept together.
# ---------------------------------------------------------------------------------------------------------------
def _new_results(training: bool) -> Any:
    return _lightning.new_result_collection(training)


def _epoch_values(results: Any) -> dict[str, float]:
    """The epoch-level value of every metric logged into ``results`` (as Lightning's ``metrics(on_step=False)``)."""
    return {
        name: float(value.detach().to(torch.float64).cpu())
        for name, value in _lightning.result_epoch_values(results).items()
        if isinstance(value, torch.Tensor)
    }


_SwappedResults = _lightning.evaluation_results


def _metric_states(module: torch.nn.Module) -> list[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """A copy of every ``torchmetrics.Metric``'s accumulated state in ``module`` (:func:`_state_copy`, as
    ``copy.deepcopy``), with the state objects themselves (:func:`_restore_metric_states` leaves a state that is still
    that object with equal values as it is)."""
    try:
        from torchmetrics import Metric
    except ImportError:  # pragma: no cover - torchmetrics ships with lightning
        return []
    saved = []
    for m in _modules(module):
        if isinstance(m, Metric):
            keys = list(m._defaults) + ["_update_count", "_computed", "_forward_cache", "_is_synced", "_cache"]
            now = {k: getattr(m, k) for k in keys if hasattr(m, k)}
            saved.append((m, {k: _state_copy(v) for k, v in now.items()}, now))
    return saved


def _modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    """``list(module.modules())`` (the same modules in the same order), deduplicated by identity rather than by hash:
    ``torchmetrics.Metric.__hash__`` hashes the metric's states (its ``id`` in it keeps it unique), and that made
    each walk cost more than the personal step it guards (issue #55)."""
    out: list[torch.nn.Module] = []
    seen: set[int] = set()

    def walk(m: torch.nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        out.append(m)
        for child in m._modules.values():
            if child is not None:
                walk(child)

    walk(module)
    return out


def _clonable(value: Any) -> bool:
    """A plain dense contiguous tensor, a graph leaf not requiring grad, with no Python attributes: its clone is
    what ``Tensor.__deepcopy__`` makes of it (same values, dtype, device, shape and strides)."""
    return (type(value) is torch.Tensor and value.layout == torch.strided and value.grad_fn is None
            and not value.requires_grad and value.is_contiguous() and not value.is_conj() and not value.is_neg()
            and not value.__dict__)


def _state_copy(value: Any) -> Any:
    """``copy.deepcopy(value)`` for one metric state, with a fast path for what torchmetrics keeps (issue #55: the
    deep copies were most of a personal step's cost): a plain contiguous tensor (:func:`_clonable`) is its
    ``clone()``, a list or tuple of distinct such tensors a new one of clones, ``None``, bools, ints and floats
    themselves (as ``deepcopy`` returns them); anything else ``copy.deepcopy(value)``.

    >>> t = torch.tensor([1, 2])
    >>> c = _state_copy([t, t + 1])
    >>> torch.equal(c[0], t), c[0] is t, _state_copy(3), _state_copy({"a": [1]})
    (True, False, 3, {'a': [1]})
    """
    if value is None or type(value) in (bool, int, float):
        return value
    if _clonable(value):
        return value.clone()
    if type(value) in (list, tuple) and all(_clonable(v) for v in value) and len({id(v) for v in value}) == len(value):
        return type(value)(v.clone() for v in value)  # distinct tensors: deepcopy's memo would keep a repeat one
    return copy.deepcopy(value)


def _unchanged(now: Any, before: Any, copied: Any) -> bool:
    """Whether a metric state ``now`` is still the object ``before`` with the values it had (``copied``, its
    :func:`_state_copy`): an immutable value (``None``, a bool, int or float) or a tensor equal to its copy."""
    if now is not before:
        return False
    if before is None or type(before) in (bool, int, float):
        return True
    return (_clonable(before) and type(copied) is torch.Tensor and before.dtype == copied.dtype
            and before.shape == copied.shape and bool(torch.equal(before, copied)))


def _restore_metric_states(saved: list[tuple[Any, dict[str, Any], dict[str, Any]]]) -> None:
    """Put back the states :func:`_metric_states` saved: a state still the same object with the same values stays
    (a ``setattr`` on a Metric costs more than a personal step's arithmetic: issue #55), every other gets its copy."""
    missing = object()
    for m, state, before in saved:
        for k, v in state.items():
            if not _unchanged(getattr(m, k, missing), before[k], v):
                setattr(m, k, v)


# ---------------------------------------------------------------------------------------------------------------
def _to_device(trainer: Any, batch: Any) -> Any:
    module = trainer.lightning_module
    batch = trainer.precision_plugin.convert_input(batch)
    batch = _lightning.before_batch_transfer(module, batch)
    return _lightning.call_strategy_hook(trainer, "batch_to_device", batch, dataloader_idx=0)


def _reset_metrics(module: torch.nn.Module) -> None:
    """Reset every ``torchmetrics.Metric`` in ``module`` (a client's value must not include what the central
    validation or the previous client accumulated; :func:`_restore_metric_states` puts the states back)."""
    try:
        from torchmetrics import Metric
    except ImportError:  # pragma: no cover - torchmetrics ships with lightning
        return
    for m in module.modules():
        if isinstance(m, Metric):
            m.reset()


def _validate_client(trainer: Any, batches: Any, limit: Any = None) -> dict[str, float]:
    """Run ``validation_step`` over ``batches`` into a fresh results collection (the module's ``torchmetrics``
    reset first); the per-client epoch values. ``limit`` (a :class:`~lightning_fed.interrupts.ClientTimeLimit`)
    is checked after every batch (where ``SIGALRM`` cannot interrupt)."""
    _reset_metrics(trainer.lightning_module)
    results = _new_results(training=False)
    with _SwappedResults(trainer, results), torch.no_grad():
        for i, batch in enumerate(batches):
            batch = _to_device(trainer, batch)
            results.batch, results.batch_size = batch, None
            _lightning.call_strategy_hook(trainer, "validation_step", batch, i)
            if limit is not None:
                limit.check()
        values = _epoch_values(results)
        results.reset()
    return values


def _check_personalization(num_optimizers: int, automatic_optimization: bool) -> None:
    """Raises ``ValueError`` (naming ``eval_local_steps``) unless automatic optimization with one optimizer."""
    if num_optimizers != 1 or not automatic_optimization:
        raise ValueError(
            "`eval_local_steps` (personalised evaluation) needs automatic optimization with exactly one optimizer; "
            f"got {num_optimizers} optimizer(s), automatic_optimization={automatic_optimization}."
        )


def _personalize(trainer: Any, datamodule: Any, cid: int, round_idx: int, steps: int, limit: Any = None,
                 module: Any = None) -> None:
    """k local steps of the module's own optimizer (fresh) with its ``training_step`` on client ``cid`` (``limit``
    checked after every step); ``module``: the model to fine-tune (default the trainer's; a personal model's copy)."""
    module = trainer.lightning_module if module is None else module
    optimizers = _lightning.init_optimizers(module)
    _check_personalization(len(optimizers), module.automatic_optimization)
    optimizer = optimizers[0]
    batches = datamodule.client_personalization_batches(cid, round_idx, steps)
    dataset = datamodule.train_dataset
    from lightning_fed.datamodules.federated import TensorBatches
    from torch.utils.data import DataLoader

    if datamodule.num_workers == 0 and TensorBatches.supports(dataset):
        loader: Any = TensorBatches(dataset, batches)
    else:
        collate = getattr(datamodule, "collate_fn", lambda dataset: None)(dataset)  # batch_columns: tuples
        loader = DataLoader(dataset, batch_sampler=[b.tolist() for b in batches], num_workers=datamodule.num_workers,
                            collate_fn=collate)
    module.train()
    results = _new_results(training=True)
    with _SwappedResults(trainer, results), torch.enable_grad(), _lightning.hook_name(module, "training_step"):
        try:
            for i, batch in enumerate(loader):
                batch = _to_device(trainer, batch)
                results.batch, results.batch_size = batch, None
                out = module.training_step(batch, i)
                loss = out["loss"] if isinstance(out, dict) else out
                if loss is None:
                    continue
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                # as Lightning's automatic optimization: the module's configure_gradient_clipping with the
                # trainer's gradient_clip_val / gradient_clip_algorithm, between backward and the step
                _lightning.call_module_hook(
                    trainer, "configure_gradient_clipping", optimizer,
                    gradient_clip_val=trainer.gradient_clip_val, gradient_clip_algorithm=trainer.gradient_clip_algorithm,
                )
                optimizer.step()
                if limit is not None:
                    limit.check()
        finally:
            results.reset()
    module.eval()


def _eval_batch_limit(limit: Any) -> Optional[int]:
    """``limit_val_batches`` for federated evaluation: an int k evaluates each client's first k batches, 1.0 all.

    Raises:
        ValueError: a fraction other than 1.0 (naming ``limit_val_batches``).
    """
    if isinstance(limit, float):
        if limit == 1.0:
            return None
        raise ValueError(
            f"Trainer argument `limit_val_batches={limit!r}`: federated evaluation takes an int k (each client's "
            "first k evaluation batches) or 1.0 (all); evaluate fewer clients with `eval_clients_per_round`."
        )
    return int(limit)


def evaluate_clients(
    trainer: Any,
    datamodule: Any,
    client_ids: Sequence[int],
    round_idx: int,
    local_steps: int = 0,
    client_timeout_s: Optional[float] = None,
    on_client_failure: str = "raise",
    stop_signals: bool = False,
    personal: Optional[Any] = None,
) -> ClientEvaluation:
    """Evaluate the trainer's module (the global model) on each client's own evaluation data.

    Must run while the trainer validates (inside the validation loop: ``on_validation_epoch_end``). The global
    model, its gradients, train/eval mode, the module's ``torchmetrics`` states and torch's random state are the
    same afterwards, bit for bit (also when a client fails or the evaluation is stopped).

    Each client's evaluation (its evaluation batches, then with ``local_steps`` its personalisation and second
    evaluation) is one unit of work, treated as a client's local work in training: with ``client_timeout_s`` it is
    interrupted past that many seconds (:class:`~lightning_fed.interrupts.ClientTimeLimit`); a client that raises
    or times out is dropped from the evaluation with a warning and listed in :attr:`ClientEvaluation.dropped`
    (``on_client_failure="skip"``), or the error is raised (``"raise"``: the exception itself, a ``RuntimeError``
    for a time-out).

    Args:
        trainer: The trainer, validating.
        datamodule: A :class:`~lightning_fed.datamodules.FederatedDataModule` with per-client evaluation data.
        client_ids: The clients to evaluate.
        round_idx: The round (seeds personalisation batches and random draws).
        local_steps: k > 0 adds personalised evaluation after k local steps (default 0: off).
        client_timeout_s: Wall-clock limit of one client's evaluation, seconds (default ``None``: none).
        on_client_failure: ``"skip"`` or ``"raise"`` (default, for direct calls).
        stop_signals: While clients are evaluated, SIGTERM and SIGINT raise
            :class:`~lightning_fed.interrupts.RoundInterrupted` at once (:class:`~lightning_fed.interrupts.StopSignals`,
            the previous SIGTERM handler runs first); default ``False``.
        personal: ``personal(module, client_id)`` turns the module (holding the global model) into that client's
            personal model in place (:func:`personal_models`); each client is then evaluated with it too, into
            :attr:`ClientEvaluation.personal`, and the global model restored; a client for which it returns
            ``False`` is left out of the personal table (:attr:`ClientEvaluation.personal_ids`). Default ``None``:
            off.

    Returns:
        :class:`ClientEvaluation` (metrics of the clients that reported, in ``client_ids`` order).

    Raises:
        RoundInterrupted: with ``stop_signals``, on SIGTERM or SIGINT.
        RuntimeError: a failing client under ``on_client_failure="raise"`` (or its own exception).
    """
    import contextlib

    from lightning_fed.executor import client_seed
    from lightning_fed.interrupts import ClientTimeLimit, ClientTimeout, StopSignals

    if on_client_failure not in ("skip", "raise"):
        raise ValueError(f"`on_client_failure` must be one of ('skip', 'raise'), got {on_client_failure!r}.")
    module = trainer.lightning_module
    metric_states = _metric_states(module)
    ids = np.asarray(client_ids, dtype=np.int64)
    rows: list[dict[str, float]] = []
    prows: list[dict[str, float]] = []
    orows: list[dict[str, float]] = []
    kept: list[int] = []
    personal_kept: list[int] = []  # the clients with a personal row (a personal(...) returning False is left out)
    dropped: list[tuple[int, str]] = []
    devices = [module.device] if module.device.type == "cuda" else []
    params: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    saved_p: list[torch.Tensor] = []
    saved_b: list[torch.Tensor] = []
    saved_g: list[Any] = []
    was_training = module.training

    def restore_model() -> None:
        with torch.no_grad():
            for p, s in zip(params, saved_p):
                p.copy_(s)
            for b, s in zip(buffers, saved_b):
                b.copy_(s)
        module.train(was_training)

    def fail(cid: int, reason: str, error: BaseException) -> None:
        message = f"Client {cid} failed in the federated evaluation of round {round_idx}: {reason}"
        if on_client_failure == "raise":
            if isinstance(error, Exception):
                raise error
            raise RuntimeError(message + " (on_client_failure='raise').") from error
        _lightning_warn(message + "; dropped from the evaluation.")
        dropped.append((int(cid), reason))

    with contextlib.ExitStack() as stack:
        stack.callback(_restore_metric_states, metric_states)
        if local_steps or personal is not None:
            stack.enter_context(torch.inference_mode(False))
            params, buffers = list(module.parameters()), list(module.buffers())
            with torch.no_grad():
                saved_p = [p.detach().clone() for p in params]
                saved_b = [b.detach().clone() for b in buffers]
            saved_g = [p.grad for p in params]

            def restore_grads() -> None:
                restore_model()
                for p, g in zip(params, saved_g):
                    p.grad = g

            stack.callback(restore_grads)
        stack.enter_context(StopSignals(enabled=stop_signals))
        for cid in ids.tolist():
            limit = None if client_timeout_s is None else ClientTimeLimit(client_timeout_s, cid, round_idx)
            try:
                with limit if limit is not None else contextlib.nullcontext():
                    row = _validate_client(trainer, datamodule.client_eval_dataloader(cid), limit)
                    orow = None
                    if personal is not None:
                        try:
                            if personal(module, cid) is not False:
                                orow = _validate_client(trainer, datamodule.client_eval_dataloader(cid), limit)
                        finally:
                            restore_model()
                    prow = None
                    if local_steps:
                        with torch.random.fork_rng(devices=devices):
                            torch.manual_seed(client_seed(datamodule.seed, round_idx, cid))
                            _personalize(trainer, datamodule, cid, round_idx, local_steps, limit)
                            prow = _validate_client(trainer, datamodule.client_eval_dataloader(cid), limit)
            except ClientTimeout as timeout:
                fail(cid, f"timed out (client_timeout_s={timeout.limit_s:g} s)", timeout)
                continue
            except Exception as error:  # noqa: BLE001 - one failing client must not end the evaluation
                fail(cid, f"{type(error).__name__}: {error}", error)
                continue
            finally:
                if local_steps:
                    restore_model()
            rows.append(row)
            if prow is not None:
                prows.append(prow)
            if orow is not None:
                orows.append(orow)
                personal_kept.append(cid)
            kept.append(cid)

    def table(dicts: list[dict[str, float]]) -> dict[str, np.ndarray]:
        if not dicts:
            return {}
        names = sorted(set().union(*dicts))
        missing = [n for n in names if any(n not in d for d in dicts)]
        if missing:
            raise RuntimeError(f"validation_step logged {missing} for some clients only: every client must log them.")
        return {n: np.array([d[n] for d in dicts], dtype=np.float64) for n in names}

    kept_ids = np.asarray(kept, dtype=np.int64)
    samples = np.array([sum(len(b) for b in datamodule.client_eval_batches(c)) for c in kept], dtype=np.int64)
    personal_ids = None if personal is None or len(personal_kept) == len(kept) else np.asarray(personal_kept, np.int64)
    return ClientEvaluation(int(round_idx), kept_ids, samples, table(rows), table(prows), dropped, table(orows),
                            personal_ids)


def personal_halves(trainer: Any) -> list[Any]:
    """The run's client halves that give each client a personal model — those that keep parts of the model local
    (:class:`~lightning_fed.client.personal.LocalParts`: FedBN, FedPer, FedRep) or train a personal model (Ditto),
    i.e. that define ``personal_model(module, row)`` — from the server optimizer's halves and
    ``FederatedTrainer(client_algorithms=...)``, each once; ``[]`` without a server optimizer or such a half."""
    server = next((cb for cb in trainer.callbacks if hasattr(cb, "client_algorithm_states")), None)
    if server is None:
        return []
    halves = [a for a in [*server.client_algorithms, *(getattr(trainer, "client_algorithms", None) or [])]
              if callable(getattr(a, "personal_model", None))]
    return list({id(a): a for a in halves}.values())


def personal_models(trainer: Any, untrained: Optional[str] = None) -> Optional[Any]:
    """``personal(module, client_id)`` for :func:`evaluate_clients` when the run has client halves that keep parts
    of the model local (:class:`~lightning_fed.client.personal.LocalParts`: FedBN, FedPer, FedRep) or train a
    personal model (Ditto), i.e. that define ``personal_model(module, row)`` (:func:`personal_halves`), else
    ``None``: each such half loads the client's row of its table (stored with the server optimizer) into the kept
    parts; a client without a row keeps the global model's values (its personal model is the global model), or,
    with ``untrained="exclude"`` (default ``None``: the data module's ``eval_personal_untrained``), is left out
    (``personal`` returns ``False``). A half whose personal model is fitted on the client's data at evaluation
    (``personal_needs_client = True``: FedBABU's fine-tuning, IFCA's choice of cluster) is called
    ``personal_model(module, row, trainer=trainer, client_id=client_id)``."""
    halves = personal_halves(trainer)
    if not halves:
        return None
    server = next(cb for cb in trainer.callbacks if hasattr(cb, "client_algorithm_states"))
    if untrained is None:
        untrained = getattr(getattr(trainer, "datamodule", None), "eval_personal_untrained", "global")
    exclude = untrained == "exclude"

    def personal(module: Any, client_id: int) -> bool:
        tables = [server.client_algorithm_states.get(h.state_key) for h in halves]
        if exclude and any(t is not None and client_id not in t for t in tables):
            return False
        for half in halves:
            if getattr(half, "selected", True) is False:  # a LocalParts not set up by a fit (trainer.validate)
                half.setup(module)
            table = server.client_algorithm_states.get(half.state_key)
            row = table.get(client_id) if table is not None and client_id in table else None
            # a personal model fitted on the client's data at evaluation (FedBABU) also takes the trainer and client
            data = {"trainer": trainer, "client_id": client_id} if getattr(half, "personal_needs_client", False) else {}
            half.personal_model(module, row, **data)
        return True

    return personal


def _lightning_warn(message: str) -> None:
    from lightning.pytorch.utilities.rank_zero import rank_zero_warn

    rank_zero_warn(message)


class FederatedEvaluation(Callback):
    """Runs federated evaluation (see the module doc) whenever the global model is validated; also writes the
    per-client training-loss histogram of every round. Added by :class:`~lightning_fed.FederatedTrainer`; does
    nothing while the data module's ``eval_clients_per_round`` is ``None`` (besides the histogram).

    Attributes:
        last: The :class:`ClientEvaluation` of the latest federated evaluation (``None`` before any).

    Example (4 clients of 3 samples; ``eval_fraction=0.25`` holds out one sample of each)::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Reg(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(1, 1)
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return torch.nn.functional.mse_loss(self.lin(x).squeeze(1), y.float())
        ...     def validation_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         self.log("val_loss", torch.nn.functional.mse_loss(self.lin(x).squeeze(1), y.float()))
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.01)
        >>> ds = TensorDataset(torch.arange(12.0).reshape(12, 1), torch.arange(12) % 3)
        >>> dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
        ...                          batch_size=2, eval_clients_per_round="all", eval_fraction=0.25)
        >>> trainer = FederatedTrainer(max_epochs=1, logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False)
        >>> trainer.fit(Reg(), datamodule=dm)
        >>> sorted(k for k in trainer.callback_metrics if k.startswith("fed_val_loss"))
        ['fed_val_loss/mean', 'fed_val_loss/p10', 'fed_val_loss/p50', 'fed_val_loss/p90', 'fed_val_loss/weighted', 'fed_val_loss/worst10']
        >>> evaluation = next(c for c in trainer.callbacks if isinstance(c, FederatedEvaluation))
        >>> evaluation.last.client_ids.tolist(), evaluation.last.samples.tolist()
        ([0, 1, 2, 3], [1, 1, 1, 1])
    """

    def __init__(self) -> None:
        self.last: Optional[ClientEvaluation] = None
        self._csv_started: set[str] = set()
        self._train_losses: list[float] = []
        #: The round of the checkpoint a ``trainer.validate(ckpt_path=...)`` loaded (``None``: none loaded).
        self._checkpoint_round: Optional[int] = None
        self._resuming = False

    # ------------------------------------------------------------------ checks at fit / validate start
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._checkpoint_round = None
        self._resuming = False

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Remember the checkpoint's round: the round whose server update produced its global model (the fit loop's
        processed rounds minus one), the round its federated evaluation was labelled with during ``fit``."""
        try:
            processed = int(checkpoint["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"])
        except (KeyError, TypeError, ValueError):
            processed = int(checkpoint.get("epoch", 0)) + 1
        self._checkpoint_round = max(processed - 1, 0)

    def _check_settings(self, trainer: Any, pl_module: Any) -> None:
        """The refusals that need only the configuration, at fit / validate start (before any round trains)."""
        datamodule = trainer.datamodule
        if getattr(datamodule, "eval_clients_per_round", None) is None:
            return
        if trainer.limit_val_batches != 0:  # 0 / 0.0: no validation at all, as in Lightning
            _eval_batch_limit(trainer.limit_val_batches)
        if datamodule.eval_local_steps:
            automatic = pl_module.automatic_optimization
            optimizers = trainer.optimizers if trainer.state.fn == TrainerFn.FITTING and automatic else (
                _lightning.init_optimizers(pl_module) if automatic else []
            )
            _check_personalization(len(optimizers), automatic)
        if datamodule.eval_csv is not None:
            datamodule.eval_csv = check_eval_csv(datamodule.eval_csv)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._check_settings(trainer, pl_module)
        self._warn_unevaluated_personal_models(trainer)
        from lightning_fed.personal import warn_untrained_global_parts  # personal.py imports this module

        warn_untrained_global_parts(trainer, pl_module)
        self._resuming = trainer.ckpt_path is not None

    @staticmethod
    def _warn_unevaluated_personal_models(trainer: Any) -> None:
        """At fit start: a personalised method (:func:`personal_halves`: FedBN, FedPer, FedRep, Ditto, ``LocalParts``)
        without federated evaluation trains personal models that nothing measures (``val_*`` is the global model's,
        which for FedPer / FedRep holds the initial head): warn, naming the setting to add."""
        halves = personal_halves(trainer)
        if not halves or getattr(trainer.datamodule, "eval_clients_per_round", None) is not None:
            return
        names = ", ".join(type(h).__name__ for h in halves)
        _lightning_warn(
            f"The client half(s) {names} give each client a personal model, but federated evaluation is off (the data "
            "module's `eval_clients_per_round` is None): no `fed_personal_*` metric will be logged, and `val_*` "
            "measures the global model only. Set `eval_clients_per_round` (e.g. 'all'; CLI "
            "`--data.eval_clients_per_round all`) and, on a task without a per-client test split, `eval_fraction` "
            "(e.g. 0.2: each client's held-out share; `--data.eval_fraction 0.2`)."
        )

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """On a resumed fit (loops restored), keep ``eval_csv``'s rows of the rounds before the resumed round and
        append from there: the rows the interrupted run wrote after its checkpoint are removed (their rounds run
        again), so each round appears once."""
        datamodule = trainer.datamodule
        path = getattr(datamodule, "eval_csv", None)
        if not self._resuming or path is None or getattr(datamodule, "eval_clients_per_round", None) is None:
            return
        self._csv_started.add(path)
        if not trainer.is_global_zero:
            return
        kept = _read_csv_rows_before(path, trainer.current_epoch)
        if kept is None:
            return
        from lightning_fed.atomic_io import atomic_write

        header, rows = kept
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow(header)
        writer.writerows(rows)
        with atomic_write(path) as f:  # a kill while rewriting leaves the old file, never a truncated one
            f.write(text.getvalue().encode())

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:
            self._check_settings(trainer, pl_module)

    # ------------------------------------------------------------------ evaluation
    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        datamodule = trainer.datamodule
        if getattr(datamodule, "eval_clients_per_round", None) is None:
            return
        if trainer.world_size > 1:
            raise ValueError(
                "Federated evaluation (`eval_clients_per_round`) runs in a single process; it is not supported "
                f"with {trainer.world_size} processes."
            )
        datamodule.eval_batch_limit = _eval_batch_limit(trainer.limit_val_batches)
        round_idx = trainer.current_epoch
        if trainer.state.fn == TrainerFn.VALIDATING and self._checkpoint_round is not None:
            round_idx = self._checkpoint_round  # validate(ckpt_path=...): that checkpoint's round and clients
        clients = datamodule.select_eval_clients(round_idx)
        runner = getattr(trainer.fit_loop, "client_runner", None)
        validating = trainer.state.fn == TrainerFn.VALIDATING
        if validating and trainer.received_sigterm and trainer.world_size == 1:  # during the last central batch
            raise SIGTERMException(f"Federated evaluation (trainer.validate) of round {round_idx} stopped by SIGTERM.")
        try:
            result = evaluate_clients(
                trainer, datamodule, clients, round_idx, datamodule.eval_local_steps,
                client_timeout_s=getattr(runner, "client_timeout_s", None),
                on_client_failure="raise" if getattr(runner, "raises_on_failure", False) else "skip",
                stop_signals=trainer.world_size == 1, personal=personal_models(trainer),
            )
        except RoundInterrupted as interrupt:
            self._stopped(trainer, round_idx, interrupt.signum, validating)
            return
        if result.client_ids.size and not result.metrics:
            raise RuntimeError(
                "Federated evaluation is on (`eval_clients_per_round`) but validation_step logged no metric "
                "with on_epoch=True."
            )
        self.last = result
        if not result.client_ids.size:
            _lightning_warn(
                f"Federated evaluation of round {round_idx}: all {len(clients)} evaluation client(s) failed (see the "
                "warnings above); no fed_* statistics for this round."
            )
        with _lightning.hook_name(pl_module, "on_validation_epoch_end"):
            if result.client_ids.size:
                for name, value in result.logged_statistics().items():
                    pl_module.log(name, value, on_step=False, on_epoch=True, batch_size=1)
            pl_module.log("fed_eval_clients", float(result.client_ids.size), on_step=False, on_epoch=True,
                          batch_size=1)
            pl_module.log("fed_clients_dropped", float(len(result.dropped)), on_step=False, on_epoch=True,
                          batch_size=1)
        step = _lightning.batches_that_stepped(trainer.fit_loop.epoch_loop)
        for prefix, table in result.tables():
            for name, values in table.items():
                _histogram(trainer, f"{prefix}{name}", values, step)
        path = datamodule.eval_csv
        if path is not None and result.client_ids.size:
            result.write_csv(path, append=path in self._csv_started)
            self._csv_started.add(path)
        if validating and trainer.received_sigterm and trainer.world_size == 1:
            # under trainer.validate() nothing after this hook looks at the flag: the run would end with status 0
            raise SIGTERMException(f"Federated evaluation (trainer.validate) of round {round_idx} stopped by SIGTERM.")

    def _stopped(self, trainer: Any, round_idx: int, signum: int, validating: bool) -> None:
        """A stop signal during federated evaluation: the clients' evaluation was abandoned at once (the global model
        restored). SIGINT is Lightning's ``KeyboardInterrupt``; SIGTERM under ``trainer.validate()`` ends it with
        ``SIGTERMException``; under ``fit`` the loop has held the SIGTERM back (``DeferSigterm``) and stops the run at
        the round's end, with its checkpoint."""
        name = signal.Signals(signum).name
        message = (
            f"Federated evaluation of round {round_idx} stopped by {name}: no fed_* statistics or eval_csv rows "
            "for it."
        )
        log.warning(message)
        if signum == getattr(signal, "SIGINT", None):
            raise KeyboardInterrupt(message) from None
        if validating:
            raise SIGTERMException(message) from None

    # ------------------------------------------------------------------ training-loss histogram
    def on_client_end(self, trainer: Any, pl_module: Any, update: Any, position: int) -> None:
        if update.loss_steps > 0:
            self._train_losses.append(float(update.loss))

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._train_losses = []

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        losses = np.array([v for v in self._train_losses if math.isfinite(v)], dtype=np.float64)
        if losses.size:
            _histogram(trainer, TRAIN_LOSS_HISTOGRAM, losses, trainer.current_epoch)
        self._train_losses = []


def _histogram(trainer: Any, tag: str, values: np.ndarray, step: int) -> None:
    from lightning_fed.tensorboard import _tensorboard_loggers

    if not trainer.is_global_zero:
        return
    for logger in _tensorboard_loggers(trainer):
        logger.experiment.add_histogram(tag, np.asarray(values, dtype=np.float64), global_step=int(step))
