"""Checkpoints of federated runs: atomic writes, readable errors, a record of the run's configuration.

* :class:`AtomicCheckpointIO` — the checkpoint IO plugin :class:`~lightning_fed.FederatedTrainer` installs by
  default: writes to a temporary file next to the target, fsyncs it, renames it over the target and fsyncs the
  directory, so a checkpoint file is always either the previous complete one or the new complete one, on every
  local filesystem; removes partial files that killed runs left behind; names the file and the damage when a
  checkpoint cannot be read.
* :func:`run_config` — the settings that define a federated run (partition, data seed, cohort size, local work,
  data order, server optimizer and its hyper-parameters), stored in every checkpoint under
  ``checkpoint["lightning_fed"]["run_config"]`` and compared on resume.
* :class:`FederatedCheckpointConnector` — Lightning's checkpoint connector plus that record: refuses a resume whose
  configuration differs (unless allowed) and loads the server optimizer's state even when its ``state_key``
  (which contains hyper-parameters) changed.
* :class:`RoundCheckpointGuard` — a callback checking at fit start that every checkpoint callback saves once per
  round, after the round's metrics are logged, and never inside a round.
"""

from __future__ import annotations

import numbers
import os
import re
import socket
import zipfile
from typing import Any, Callable, Optional, Union

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

import torch

from lightning_fed._lightning import (
    PATH,
    CheckpointConnector,
    is_local_file_protocol,
    model_checkpoint_saves_on_train_epoch_end,
    model_checkpoint_step_triggers,
    set_model_checkpoint_saves_on_train_epoch_end,
)
from lightning_fed.atomic_io import atomic_write
from lightning_fed.guards import describe_nonfinite, nonfinite_values
from lightning_fed.migrations import CHECKPOINT_FORMAT, RECORD_KEY, migrate_checkpoint, required_state
from lightning_fed.migrations import select_federated
from lightning_fed.migrations import state_items
from lightning_fed.run_record import (  # noqa: F401  (re-exported: lightning_fed.checkpoint's API)
    config_differences,
    normalize_allowed_changes,
    object_settings,
    privacy_history,
    run_config,
    RUN_CONFIG_NAMES,
    _ABSENT,
    _class_name,
    _client_halves_merged,
    _is_allowed,
    _LATER_SETTINGS,
    _LATER_DEVICE_SETTINGS,
    _moved_module_paths,
    _privacy_segment,
    _RECORD_DEFAULTS,
    _run_client_halves,
    _segment_from_state,
    _server_optimizer,
)
from lightning_fed.server.client_state import (
    checkpoint_removed,
    checkpoint_saved,
    checkpoint_saving,
    pin_checkpoint,
    resolve_manifest_directories,
)

#: The run record's list of the federated parameters' names (``module.named_parameters()`` order), written only when
#: some parameters are frozen (a record without it: every parameter is federated).
FEDERATED_KEY = "federated_parameters"

#: Key of the lightning_fed record in a checkpoint dict.
CHECKPOINT_KEY = RECORD_KEY
class MidRoundCheckpointError(RuntimeError):
    """:meth:`FederatedTrainer.save_checkpoint` called inside a round (the module holds a client's local model). The
    executors re-raise it whatever ``on_client_failure`` says: it is a usage error, not a failing client.

    Example: a callback that saves after every local step is stopped at the first one::

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
        >>> data = TensorDataset(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64))
        >>> dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=2), clients_per_round=2)
        >>> class SaveEveryStep(L.Callback):
        ...     def on_train_batch_end(self, trainer, *args):
        ...         trainer.save_checkpoint(trainer.default_root_dir + "/step.ckpt")
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     trainer = FederatedTrainer(max_epochs=1, callbacks=[SaveEveryStep()], default_root_dir=tmp, logger=False,
        ...                                enable_progress_bar=False, enable_model_summary=False,
        ...                                enable_checkpointing=False, accelerator="cpu")
        ...     trainer.fit(Line(), datamodule=dm)
        Traceback (most recent call last):
        ...
        lightning_fed.checkpoint.MidRoundCheckpointError: save_checkpoint('.../step.ckpt') was called inside round 0, while the module holds a client's local model, not the global model; save at the end of a round instead (ModelCheckpoint(every_n_epochs=...), or from on_train_epoch_end).
        >>> issubclass(MidRoundCheckpointError, RuntimeError)
        True
    """


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be read: empty, truncated, damaged or not a PyTorch checkpoint.

    Example: an empty file (a save killed before it wrote anything)::

        >>> import os, tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     open(os.path.join(tmp, "last.ckpt"), "wb").close()
        ...     AtomicCheckpointIO().load_checkpoint(os.path.join(tmp, "last.ckpt"))
        Traceback (most recent call last):
        ...
        lightning_fed.checkpoint.CorruptCheckpointError: Cannot read checkpoint '.../last.ckpt': the file is empty (0 bytes; a save that was interrupted before writing anything). Underlying error: ...
    """


# ---------------------------------------------------------------------------------------------- atomic IO
_PARTIAL = re.compile(r"^\.(?P<name>.+)\.partial-(?P<host>.+)-(?P<pid>\d+)-(?P<token>[0-9a-f]{8})$")


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_") or "localhost"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return True
    return True


def remove_orphaned_partials(directory: PATH) -> list[str]:
    """Delete the partial checkpoint files that :class:`AtomicCheckpointIO` processes on this host left in
    ``directory`` when they were killed mid-save (``.<name>.partial-<host>-<pid>-<token>`` of a pid that no longer
    runs). Files of live processes and of other hosts are kept. Returns the removed paths."""
    removed = []
    host = _host()
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        match = _PARTIAL.match(name)
        if match is None or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        path = os.path.join(directory, name)
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


#: The first bytes of torch's legacy (pre-1.6, non-zip) format: the pickled magic number 0x1950A86A20F9469CFC6C.
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


def _diagnose(path: str, error: BaseException) -> Optional[str]:
    """What is wrong with the checkpoint file at ``path`` given the ``error`` loading it raised, or ``None`` if
    the file looks intact (the error is then about its content, e.g. a weights-only refusal, and is re-raised)."""
    size = os.path.getsize(path)
    if size == 0:
        return "the file is empty (0 bytes; a save that was interrupted before writing anything)"
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            head = f.read(len(_LEGACY_MAGIC))
        if head == _LEGACY_MAGIC:  # torch's legacy format: a truncation shows as EOFError
            if isinstance(error, EOFError) or "EOF" in str(error) or "corrupt" in str(error).lower():
                return f"the legacy-format (non-zip) torch file is truncated ({size} bytes)"
            return None
        if head.startswith(b"PK"):
            return f"the file is truncated ({size} bytes: a PyTorch zip archive without its end record)"
        return f"the file is not a PyTorch checkpoint ({size} bytes, no zip archive: truncated or another format)"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        return f"the zip archive is damaged ({type(err).__name__}: {err})"
    if bad is not None:
        return f"archive member {bad!r} is damaged (CRC mismatch)"
    if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        return "the zip archive holds no `data.pkl` record (not a torch.save file)"
    return None


class AtomicCheckpointIO(TorchCheckpointIO):
    """:class:`lightning.pytorch.plugins.TorchCheckpointIO` with crash-safe writes on every local filesystem.

    Lightning's own writer (``fsspec`` transaction) writes the new checkpoint to a temporary file in ``$TMPDIR``
    and moves it over the target; when ``$TMPDIR`` is on another filesystem the move is a copy, and a process
    killed during the copy leaves a truncated (often 0-byte) ``last.ckpt`` and an orphaned temporary file. Here
    a local checkpoint is

    1. serialised with :func:`torch.save` into ``.<name>.partial-<host>-<pid>-<token>`` in the target directory,
    2. flushed and ``fsync``-ed,
    3. renamed over the target with :func:`os.replace` (atomic on POSIX and Windows within a filesystem),
    4. made durable by ``fsync`` of the directory.

    A failure or kill at any point leaves the previous checkpoint intact; a failing save removes its partial
    file, and partial files of killed processes on this host are removed at the next save into the same
    directory (:func:`remove_orphaned_partials`). Remote paths (``s3://``, ``gs://``, ... any non-``file``
    ``fsspec`` protocol) keep Lightning's behaviour.

    Loading names the file and the damage: an empty, truncated or damaged file raises
    :class:`CorruptCheckpointError` instead of a bare ``EOFError``/``KeyError``/``RuntimeError``.

    Example: a round trip leaves only the target file; a truncated copy names the damage::

        >>> import os, tempfile, torch
        >>> io = AtomicCheckpointIO()
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = os.path.join(tmp.name, "last.ckpt")
        >>> io.save_checkpoint({"epoch": 3, "w": torch.tensor([1.5])}, path)
        >>> os.listdir(tmp.name), io.load_checkpoint(path)  # no partial file left behind
        (['last.ckpt'], {'epoch': 3, 'w': tensor([1.5000])})
        >>> data = open(path, "rb").read()
        >>> with open(path, "wb") as f:
        ...     _ = f.write(data[: len(data) // 2])  # a copy cut in the middle
        >>> io.load_checkpoint(path)
        Traceback (most recent call last):
        ...
        lightning_fed.checkpoint.CorruptCheckpointError: Cannot read checkpoint '.../last.ckpt': the file is truncated (... bytes: a PyTorch zip archive without its end record). Underlying error: ...
        >>> tmp.cleanup()
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: PATH, storage_options: Optional[Any] = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically (see the class docstring).

        Raises:
            TypeError: ``storage_options`` given (as :class:`TorchCheckpointIO`).
        """
        if storage_options is not None or not is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        target = os.path.abspath(_local_path(path))
        directory = os.path.dirname(target)
        os.makedirs(directory, exist_ok=True)
        remove_orphaned_partials(directory)
        prefix = f".{os.path.basename(target)}.partial-{_host()}-{os.getpid()}-"
        referenced = checkpoint_saving(checkpoint, target)  # on-disk client-state rows: refs first (module doc)
        with atomic_write(target, prefix=prefix, suffix="") as f:
            torch.save(checkpoint, f)
        checkpoint_saved(checkpoint, target, referenced)

    def remove_checkpoint(self, path: PATH) -> None:
        """Delete the checkpoint at ``path`` (as :class:`TorchCheckpointIO`), then the on-disk client-state row
        versions only it referenced (:func:`~lightning_fed.server.client_state.checkpoint_removed`)."""
        super().remove_checkpoint(path)
        if is_local_file_protocol(path):
            checkpoint_removed(os.path.abspath(_local_path(path)))

    def load_checkpoint(
        self,
        path: PATH,
        map_location: Optional[Callable] = lambda storage, loc: storage,
        weights_only: Optional[bool] = None,
    ) -> dict[str, Any]:
        """Load the checkpoint at ``path`` (as :class:`TorchCheckpointIO`); the store directories of its on-disk
        client-state tables resolved from where the file is now
        (:func:`~lightning_fed.server.client_state.resolve_manifest_directories`).

        Raises:
            FileNotFoundError: no file at ``path``.
            CorruptCheckpointError: the file is empty, truncated, damaged or not a PyTorch checkpoint; the message
                names the file and the damage.
        """
        try:
            checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
            if is_local_file_protocol(path):  # on-disk client-state rows: the store next to the file (a copied run)
                resolve_manifest_directories(checkpoint, _local_path(path))
            return checkpoint
        except FileNotFoundError:
            raise
        except Exception as err:
            if not is_local_file_protocol(path):
                raise
            local = _local_path(path)
            try:
                problem = _diagnose(local, err)
            except OSError:
                raise err
            if problem is None:
                raise
            raise CorruptCheckpointError(
                f"Cannot read checkpoint {os.path.abspath(local)!r}: {problem}. Underlying error: "
                f"{type(err).__name__}: {err!s}. Resume from an earlier checkpoint (e.g. a `epoch=*.ckpt` kept by "
                "ModelCheckpoint(save_top_k=...)) or start afresh."
            ) from err


def _local_path(path: PATH) -> str:
    return get_filesystem(path)._strip_protocol(str(path))


class FederatedCheckpointConnector(CheckpointConnector):
    """Lightning's checkpoint connector, plus the run's configuration in every checkpoint and its check on resume.

    Saving adds ``checkpoint["lightning_fed"] = {"run_config": run_config(trainer), "server_optimizer_state_key":
    ...}``. Resuming ``fit`` from a checkpoint compares its ``run_config`` with the current one and raises
    :class:`ValueError` listing every differing setting (old → new) that ``allowed`` does not allow, then files the
    server optimizer's saved state under the current optimizer's ``state_key`` — Lightning matches callback states
    by ``state_key``, which contains hyper-parameters such as ``lr``, so a changed learning rate would otherwise
    drop FedAdam's m, v and step count without a word. An allowed change of the server optimizer's class cannot
    carry the state over: it starts afresh, with a warning — except the privacy accountant's history: the record's
    ``"privacy"`` entry keeps the rounds of every earlier server optimizer (with their σ, N, C and sampling, or as
    non-private rounds), handed to the new one through :func:`privacy_history`, so ε covers the whole run.

    Before any client trains (and before the loggers write), a resume is also refused (``ValueError`` naming the
    file) when the record is malformed (:func:`~lightning_fed.migrations.check_record`), when the checkpoint lacks
    the server optimizer's state or a part of it the run needs (:func:`~lightning_fed.migrations.required_state`),
    or when the loaded global model or server-optimizer state holds a NaN or ±inf (:meth:`check_loaded_state`, naming the tensors).

    Args:
        trainer: The trainer.
        allowed: ``True`` (every change allowed), ``False``/``()`` (none), or setting names (see
            :func:`run_config`); a name allows its sub-settings (``"server_optimizer"`` allows
            ``"server_optimizer.lr"``), any ``partitioner`` name also allows ``partition``.

    Example: every checkpoint records the run's configuration; resuming with another cohort size is refused::

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
        >>> data = TensorDataset(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64))
        >>> import os, tempfile
        >>> def fit(clients_per_round, tmp, ckpt_path=None):
        ...     dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=2), clients_per_round=clients_per_round)
        ...     trainer = FederatedTrainer(max_epochs=2 if ckpt_path else 1, default_root_dir=tmp, logger=False,
        ...                                enable_progress_bar=False, enable_model_summary=False,
        ...                                enable_checkpointing=False, accelerator="cpu")
        ...     trainer.fit(Line(), datamodule=dm, ckpt_path=ckpt_path)
        ...     return trainer
        >>> tmp = tempfile.TemporaryDirectory()
        >>> trainer = fit(2, tmp.name)
        >>> type(trainer._checkpoint_connector).__name__
        'FederatedCheckpointConnector'
        >>> path = os.path.join(tmp.name, "round0.ckpt")
        >>> trainer.save_checkpoint(path)
        >>> config = torch.load(path, weights_only=True)["lightning_fed"]["run_config"]
        >>> config["clients_per_round"], config["server_optimizer"], config["server_optimizer.lr"]
        (2, 'lightning_fed.callbacks.fedavg.FedAvg', 1.0)
        >>> fit(1, tmp.name, ckpt_path=path)
        Traceback (most recent call last):
        ...
        ValueError: Cannot resume from .../round0.ckpt: the run's configuration differs from the checkpoint's (checkpoint -> now):
          clients_per_round: 2 -> 1
        Resuming with other settings changes the experiment. ...
        >>> tmp.cleanup()
    """

    def __init__(self, trainer: Any, allowed: Union[bool, tuple[str, ...]] = ()) -> None:
        super().__init__(trainer)
        self.allowed = allowed
        #: History segments of the rounds run under earlier server optimizers (see :func:`privacy_history`).
        self.privacy_history: list[dict[str, Any]] = []
        #: The federated parameters' names of the checkpoint resumed in this fit (``True``: every parameter, a record
        #: without :data:`FEDERATED_KEY`), until :meth:`resolve_federated` reads it at fit start; ``None``: no resume.
        self.resumed_federated: Any = None
        #: The checkpoint being resumed (:meth:`resume_start`), named in the errors.
        self._resume_path: Optional[str] = None

    def dump_checkpoint(self, weights_only: Optional[bool] = None) -> dict:
        checkpoint = super().dump_checkpoint(weights_only)
        server = _server_optimizer(self.trainer)
        checkpoint[CHECKPOINT_KEY] = {
            "format": CHECKPOINT_FORMAT,  # older formats are upgraded on load (lightning_fed/migrations.py)
            "run_config": run_config(self.trainer),
            "server_optimizer_state_key": None if server is None else server.state_key,
            # the privacy accountant's history: earlier server optimizers' rounds, then the current one's
            "privacy": {"previous": [dict(s) for s in self.privacy_history], "current": _privacy_segment(server)},
        }
        runner = getattr(getattr(self.trainer, "fit_loop", None), "client_runner", None)
        if runner is not None and getattr(runner, "frozen_params", None):  # only with frozen parameters: else as before
            checkpoint[CHECKPOINT_KEY][FEDERATED_KEY] = list(runner.param_names)
        pin_checkpoint(checkpoint)  # its on-disk client-state rows are kept until it is saved (or for good)
        return checkpoint

    def resolve_federated(self, server: Any, names: list[str], all_names: list[str], sizes: list[int]) -> None:
        """At fit start (the client runner's ``setup``, once the federated parameters F are known): compare the F of
        the checkpoint resumed in this fit with this run's ``names``.

        * the same: nothing;
        * a checkpoint whose record lists other names: refused (the server optimizer's state, Δ's shape and the
          per-client tables belong to that set);
        * a checkpoint without the list (every parameter was federated: an older version, or a run without frozen
          parameters) resumed with frozen parameters: its server-optimizer state is cut down to F's entries
          (:func:`~lightning_fed.migrations.select_federated`, exact),
          with a warning naming the parameters left out.

        Args:
            server: The run's server optimizer.
            names: F's names; ``all_names``: every parameter's; ``sizes``: every parameter's ``numel``.

        Raises:
            ValueError: a different recorded F, naming the parameters added and removed; a state that cannot be cut
                exactly.
        """
        old, self.resumed_federated = self.resumed_federated, None
        if old is None:
            return
        recorded = old is not True
        old = list(old) if recorded else list(all_names)
        if old == list(names):
            return
        if recorded:
            added = [n for n in names if n not in old]
            removed = [n for n in old if n not in names]
            parts = ([f"now federated but frozen in the checkpoint: {', '.join(added)}"] if added else []) + \
                    ([f"federated in the checkpoint but frozen now: {', '.join(removed)}"] if removed else [])
            raise ValueError(
                "Cannot resume: the federated parameters (requires_grad and in a client optimizer at fit start) differ "
                f"from the checkpoint's ({'; '.join(parts) or 'another order'}); the server optimizer's state and the "
                "per-client state cover the checkpoint's set. Freeze and unfreeze the same parameters as the run that "
                "wrote it, or start a new run."
            )
        if server is None:
            return
        positions = [all_names.index(n) for n in names]
        cut = select_federated(server, positions, sizes)
        frozen = [n for n in all_names if n not in set(names)]
        if cut:
            rank_zero_warn(
                f"The checkpoint's server-optimizer state covers every parameter (saved before only the federated "
                f"parameters were); this run federates {len(names)} of {len(all_names)} parameter tensors, so the "
                f"saved entries of the frozen ones ({', '.join(frozen)}) are dropped from {', '.join(cut)}."
            )

    def resume_start(self, checkpoint_path: Optional[PATH] = None, weights_only: Optional[bool] = None) -> None:
        if self.trainer.state.fn == TrainerFn.FITTING:
            self.privacy_history = []
            self.resumed_federated = None
        self._resume_path = None if checkpoint_path is None else str(checkpoint_path)
        super().resume_start(checkpoint_path, weights_only=weights_only)
        if self._loaded_checkpoint:  # one table upgrades every older format, before the callbacks are restored
            migrate_checkpoint(self._loaded_checkpoint, None if checkpoint_path is None else str(checkpoint_path),
                               client_halves=[a.state_key for a in _run_client_halves(self.trainer)])
        if self._loaded_checkpoint and self.trainer.state.fn == TrainerFn.FITTING:
            self._check_resume(str(checkpoint_path))

    def restore_optimizers(self) -> None:
        """Lightning's restore of the client optimizers' state, after :meth:`check_optimizer_layout` (our message,
        naming the parameter groups of the checkpoint and of ``configure_optimizers``, before torch's)."""
        if self._loaded_checkpoint:
            self.check_optimizer_layout(self._resume_path)
        super().restore_optimizers()

    def check_optimizer_layout(self, path: Optional[str]) -> None:
        """Refuse a resume whose saved optimizer state does not fit the optimizers the module's
        ``configure_optimizers`` returns now: another number of optimizers (Lightning would pair them up to the
        shorter list and drop the rest silently), or another number of parameter groups or of parameters in a group
        (torch's ``load_state_dict`` raises "loaded state dict has a different number of parameter groups", naming
        neither side). Optimizer states without ``param_groups`` (sharded strategies' own formats) are not checked.

        Raises:
            ValueError: naming the checkpoint, the optimizer and the parameter groups' sizes (parameter tensors per
                group) on both sides, e.g. ``optimizer 0 (SGD): the checkpoint has 1 parameter group(s) of [4]
                parameter tensor(s), configure_optimizers now gives 2 of [2, 2]``.
        """
        saved = (self._loaded_checkpoint or {}).get("optimizer_states")
        optimizers = list(getattr(self.trainer.strategy, "optimizers", None) or [])
        if not isinstance(saved, (list, tuple)):
            return
        where = f"from {path}" if path else "from the checkpoint"
        fix = ("The client optimizers' state belongs to the parameter groups of the run that wrote the checkpoint: "
               "give configure_optimizers the same groups (the same parameters in each, in the same order), or "
               "start a new run.")
        if len(saved) != len(optimizers):
            raise ValueError(
                f"Cannot resume {where}: the checkpoint holds the state of {len(saved)} optimizer(s), the module's "
                f"configure_optimizers now gives {len(optimizers)}. {fix}"
            )
        problems = []
        for i, (optimizer, state) in enumerate(zip(optimizers, saved)):
            groups = state.get("param_groups") if isinstance(state, dict) else None
            if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) and "params" in g for g in groups):
                continue
            old = [len(g["params"]) for g in groups]
            new = [len(g["params"]) for g in optimizer.param_groups]
            if old != new:
                problems.append(
                    f"optimizer {i} ({type(optimizer).__name__}): the checkpoint has {len(old)} parameter group(s) of "
                    f"{old} parameter tensor(s), configure_optimizers now gives {len(new)} of {new}"
                )
        if problems:
            raise ValueError(f"Cannot resume {where}: the optimizers' parameter groups differ: "
                             f"{'; '.join(problems)}. {fix}")

    def _restore_modules_and_callbacks(self, checkpoint_path: Optional[PATH] = None,
                                       weights_only: Optional[bool] = None) -> None:
        """Lightning's restore of the module and the callbacks, then (when fitting) the check of what was loaded
        (:meth:`check_loaded_state`), before any client trains and before the loggers write."""
        super()._restore_modules_and_callbacks(checkpoint_path, weights_only)
        if self._loaded_checkpoint and self.trainer.state.fn == TrainerFn.FITTING:
            self.check_loaded_state(str(checkpoint_path))

    def check_loaded_state(self, path: str) -> None:
        """Refuse a resume whose global model (parameters, floating buffers) or server-optimizer state
        (:func:`~lightning_fed.migrations.state_items` with ``saved=True``, per-client tables
        included) holds a NaN or ±inf: every client would start from it, and every update would be dropped as
        non-finite, or the first server step would spread it into the model.

        Raises:
            ValueError: naming the checkpoint and the tensors (e.g. ``FedAdam state 'state.exp_avg_sq' for parameter
                'net.0.weight' has 1 non-finite value(s) (of 40)``).
        """
        module = self.trainer.lightning_module
        if module is None:
            return
        names = [name for name, _ in module.named_parameters()]
        record = (self._loaded_checkpoint or {}).get(CHECKPOINT_KEY)
        if isinstance(record, dict) and isinstance(record.get(FEDERATED_KEY), (list, tuple)):
            names = list(record[FEDERATED_KEY])  # the server state covers the federated parameters only
        items: list[tuple[str, Any]] = [(f"global model parameter {n!r}", p) for n, p in module.named_parameters()]
        items += [(f"global model buffer {n!r}", b) for n, b in module.named_buffers() if b.is_floating_point()]
        server = _server_optimizer(self.trainer)
        if server is not None:
            items += state_items(server, names, saved=True)
        bad = nonfinite_values(items)
        if bad:
            raise ValueError(
                f"Cannot resume from {path}: {describe_nonfinite(bad)}; every later round would start from it. Resume "
                "from an earlier checkpoint (e.g. an `epoch=*.ckpt` kept by ModelCheckpoint(save_top_k=...))."
            )

    def _check_resume(self, path: str) -> None:
        checkpoint = self._loaded_checkpoint
        record = checkpoint.get(CHECKPOINT_KEY)
        server = _server_optimizer(self.trainer)
        recorded = record.get(FEDERATED_KEY) if isinstance(record, dict) else None
        self.resumed_federated = list(recorded) if isinstance(recorded, (list, tuple)) else True
        if record is None:
            rank_zero_warn(
                f"Checkpoint {path} has no lightning_fed run record (written by an older version or a plain "
                "Trainer): the partition, seed, cohort size, local work and server optimizer cannot be checked."
            )
            old_key = None
            if server is not None:
                prefix = type(server).__qualname__ + "{"
                keys = [k for k in checkpoint.get("callbacks", {}) if isinstance(k, str) and k.startswith(prefix)]
                old_key = keys[0] if len(keys) == 1 else None
            self._move_server_state(old_key, server, path)
            return
        old, new = _moved_module_paths(record.get("run_config", {})), run_config(self.trainer)
        diffs = config_differences(_client_halves_merged(old), _client_halves_merged(new))
        same_server = "server_optimizer" not in {d[0] for d in diffs}
        same_devices = "device_model" not in {d[0] for d in diffs}
        unrecorded = [d for d in diffs if same_server and d[1] == _ABSENT and d[0].startswith("server_optimizer.")
                      and d[0].rsplit(".", 1)[1] in _LATER_SETTINGS
                      or same_devices and d[1] == _ABSENT and d[0] in _LATER_DEVICE_SETTINGS]
        if unrecorded:
            rank_zero_warn(
                f"Checkpoint {path} was written before these settings were recorded, so they cannot be checked: "
                + ", ".join(f"{key} (now {b!r})" for key, _, b in unrecorded)
            )
            diffs = [d for d in diffs if d not in unrecorded]
        refused = [d for d in diffs if not _is_allowed(d[0], self.allowed) and not (  # the halves, as before
            d[0] == "client_algorithms" and _is_allowed("server_optimizer.client", self.allowed))]
        if refused:
            lines = "\n".join(f"  {key}: {a!r} -> {b!r}" for key, a, b in refused)
            raise ValueError(
                f"Cannot resume from {path}: the run's configuration differs from the checkpoint's "
                f"(checkpoint -> now):\n{lines}\nResuming with other settings changes the experiment. To change "
                "them deliberately pass FederatedTrainer(allow_resume_changes=[...]) with these names (or True "
                "for all)."
            )
        if diffs:
            rank_zero_warn(
                f"Resuming from {path} with allowed changes: "
                + "; ".join(f"{key}: {a!r} -> {b!r}" for key, a, b in diffs)
            )
        if server is None:
            return
        privacy = record.get("privacy") if isinstance(record.get("privacy"), dict) else {}
        self.privacy_history = [dict(s) for s in privacy.get("previous", [])]
        if old.get("server_optimizer", _class_name(server)) != _class_name(server):
            old_key = record.get("server_optimizer_state_key")
            # the old server optimizer's rounds join the history: they stay in ε (or make it ∞ if not private)
            current = privacy["current"] if "current" in privacy else _segment_from_state(
                checkpoint.get("callbacks", {}).get(old_key))
            if current is not None and int(current.get("rounds", 0)) > 0:
                self.privacy_history.append(dict(current))
            if old_key is not None and old_key in checkpoint.get("callbacks", {}):
                del checkpoint["callbacks"][old_key]
            rank_zero_warn(
                f"The server optimizer changed from {old.get('server_optimizer')} to {_class_name(server)} (allowed): "
                "its saved state (step count, moments) is not carried over; the new one starts afresh."
            )
            return
        self._move_server_state(record.get("server_optimizer_state_key"), server, path)
        self._check_server_state_present(record, server, path)

    def _check_server_state_present(self, record: dict[str, Any], server: Any, path: str) -> None:
        """Refuse a checkpoint whose record names a server optimizer but that holds no state for it, or a state
        without an entry the server optimizer needs after a server step
        (:func:`~lightning_fed.migrations.required_state`): Lightning would skip the missing state silently and the run go on from a fresh one (step count 0, FedAdam's
        moments at their start, SCAFFOLD's c_i at zero)."""
        if record.get("server_optimizer_state_key") is None:
            return
        name = type(server).__name__
        states = self._loaded_checkpoint.get("callbacks")
        state = states.get(server.state_key) if isinstance(states, dict) else None
        if not isinstance(state, dict):
            raise ValueError(
                f"Cannot resume from {path}: its run record names the server optimizer {name} but the checkpoint "
                f"holds no state for it (checkpoint['callbacks'][{server.state_key!r}]); refusing to resume with a "
                "fresh server optimizer (step count 0) silently."
            )
        module = self.trainer.lightning_module
        num_params = sum(p.numel() for p in module.parameters()) if module is not None else 0
        server.bind_client_algorithms(_run_client_halves(self.trainer))  # the trainer's halves' state is needed too
        steps = state.get("num_steps")
        missing = [key for key in required_state(server, num_params) if not _has_path(state, key)]
        if "num_steps" not in missing and not (isinstance(steps, numbers.Integral) and int(steps) > 0):
            return  # saved before the first server step: nothing else exists yet
        if missing:
            after = f" (after {steps} server step(s))" if "num_steps" not in missing else ""
            raise ValueError(
                f"Cannot resume from {path}: the saved state of the server optimizer {name} lacks "
                f"{', '.join(repr(k) for k in missing)}{after}; refusing to resume with that part started afresh "
                "silently."
            )

    def _move_server_state(self, old_key: Optional[str], server: Any, path: str) -> None:
        states = self._loaded_checkpoint.get("callbacks")
        if server is None or not states or old_key is None or old_key == server.state_key:
            return
        if old_key not in states:
            raise ValueError(
                f"Checkpoint {path} names the server optimizer state {old_key!r} but holds no such state; "
                "refusing to resume with a fresh server optimizer silently."
            )
        states[server.state_key] = states.pop(old_key)


def _has_path(state: Any, dotted: str) -> bool:
    """Whether ``state`` holds the (non-``None``) entry at ``dotted`` (``"state.exp_avg"`` is
    ``state["state"]["exp_avg"]``)."""
    for key in dotted.split("."):
        if isinstance(state, (list, tuple)) and key.isdigit():  # "aggregators.0.table": a stage's state in the chain
            if int(key) >= len(state):
                return False
            state = state[int(key)]
            continue
        if not isinstance(state, dict):
            return False
        if key not in state:
            key = int(key) if key.isdigit() and int(key) in state else key
        if key not in state:
            return False
        state = state[key]
    return state is not None


# ---------------------------------------------------------------------------------------------- checkpoint callbacks
class RoundCheckpointGuard(Callback):
    """Installed by :class:`~lightning_fed.FederatedTrainer`: at ``fit`` start, makes every checkpoint callback
    save once per round, with the round's global model and metrics.

    * :class:`ModelCheckpoint` with ``save_on_train_epoch_end=None`` (the default) is set to save on train epoch
      end: the loop runs ``on_train_epoch_end`` after the round's validation and after logging the round metrics,
      so ``every_n_epochs`` counts rounds whatever ``check_val_every_n_epoch`` is (with or without validation data),
      and a monitored ``round_*`` metric is the current round's.

    Raises (``ValueError``, naming the argument), because these save inside a round, where the module holds a
    client's half-trained local model rather than the global model, or before the round's metrics exist:

    * ``ModelCheckpoint(every_n_train_steps=n)`` with n > 0, ``ModelCheckpoint(train_time_interval=...)``;
    * ``ModelCheckpoint(save_on_train_epoch_end=False)``;
    * ``ModelCheckpoint(save_on_exception=True)`` and :class:`OnExceptionCheckpoint`.

    Example: step-based saving is refused when ``fit`` starts (before anything is trained or written)::

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
        >>> data = TensorDataset(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64))
        >>> from lightning.pytorch.callbacks import ModelCheckpoint
        >>> dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=2), clients_per_round=2)
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[ModelCheckpoint(every_n_train_steps=5)], logger=False,
        ...                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        >>> any(isinstance(cb, RoundCheckpointGuard) for cb in trainer.callbacks)
        True
        >>> trainer.fit(Line(), datamodule=dm)
        Traceback (most recent call last):
        ...
        ValueError: ModelCheckpoint(every_n_train_steps=5) saves inside a round, where the module holds a client's half-trained local model, not the global model; federated checkpoints are per round: use `every_n_epochs` (1 epoch = 1 round).
    """

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        for callback in trainer.callbacks:
            if isinstance(callback, OnExceptionCheckpoint):
                raise ValueError(
                    "OnExceptionCheckpoint saves the module when an exception is raised, usually inside a round, "
                    "where it holds a client's local model, not the global model; federated checkpoints are taken "
                    "at the end of rounds (ModelCheckpoint(every_n_epochs=...), 1 epoch = 1 round)."
                )
            if not isinstance(callback, ModelCheckpoint):
                continue
            inside = "saves inside a round, where the module holds a client's half-trained local model, not the " \
                "global model; federated checkpoints are per round: use `every_n_epochs` (1 epoch = 1 round)."
            every_n_train_steps, train_time_interval = model_checkpoint_step_triggers(callback)
            if every_n_train_steps:
                raise ValueError(f"ModelCheckpoint(every_n_train_steps={every_n_train_steps}) {inside}")
            if train_time_interval is not None:
                raise ValueError(f"ModelCheckpoint(train_time_interval={train_time_interval}) {inside}")
            if getattr(callback, "save_on_exception", False):
                raise ValueError(f"ModelCheckpoint(save_on_exception=True) {inside}")
            if model_checkpoint_saves_on_train_epoch_end(callback) is False:
                raise ValueError(
                    "ModelCheckpoint(save_on_train_epoch_end=False) saves at the end of validation, which runs only "
                    "every `check_val_every_n_epoch` rounds and before the round's metrics are logged; leave "
                    "`save_on_train_epoch_end` at None (or True): federated checkpoints are saved at the end of "
                    "every `every_n_epochs`-th round."
                )
            set_model_checkpoint_saves_on_train_epoch_end(callback, True)
