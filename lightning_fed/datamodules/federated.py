"""The federated data module: a dataset split into clients, a cohort per round, each client's local work."""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence, Union

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from lightning_fed.asynchronous.simulation import AsyncConfig
from lightning_fed.checks import check_int, check_positive_int as _check_positive_int
from lightning_fed.datamodules.huggingface import HFTensorColumns, ragged_column  # noqa: F401  (re-exported)
from lightning_fed.datamodules.client_eval import (  # noqa: F401  (check_eval_clients_per_round, split_client_eval: re-exported)
    ClientEvaluation,
    check_eval_clients_per_round,
    split_client_eval,
)
from lightning_fed.datamodules.cohorts import (  # noqa: F401  (re-exported)
    COHORT_SAMPLINGS,
    CohortSampler,
    CohortSelection,
)
from lightning_fed.datamodules.local_work import ClientWork, FixedLocalWork, LocalWork, batch_schedule
from lightning_fed.datamodules.partition import Partition, Partitioner
from lightning_fed.datamodules.devices.base import DeviceModel
from lightning_fed.datamodules.simulated_time import SimulatedTime
from lightning_fed.datamodules.source import DataSource

_DATA_ORDERS = ("reshuffle", "once", "none")
class TensorBatches:
    """A client's mini-batches fetched by slicing: ``dataset.get_batch(index)`` or, for a ``TensorDataset``,
    ``tuple(t[index] for t in dataset.tensors)`` — the same tensors a ``DataLoader`` would collate, without
    per-sample ``__getitem__`` calls or worker processes.

    Args:
        dataset: A dataset with ``get_batch(index: LongTensor)`` or a ``torch.utils.data.TensorDataset``.
        batches: The index arrays of the batches, in order.

    Example::

        >>> import numpy as np, torch
        >>> from torch.utils.data import TensorDataset
        >>> ds = TensorDataset(torch.arange(12.0).reshape(12, 1), torch.arange(12) % 3)
        >>> [x.squeeze(1).tolist() for x, y in TensorBatches(ds, [np.array([0, 5]), np.array([7])])]
        [[0.0, 5.0], [7.0]]
    """

    def __init__(self, dataset: Any, batches: list[np.ndarray]) -> None:
        self.dataset = dataset
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        get_batch = getattr(self.dataset, "get_batch", None)
        decode_ahead = getattr(self.dataset, "decode_ahead", None)  # HFTensorColumns: its images, a client's at once
        if decode_ahead is not None:
            decode_ahead(self.batches)
        for idx in self.batches:
            index = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
            yield get_batch(index) if get_batch is not None else tuple(t[index] for t in self.dataset.tensors)

    @staticmethod
    def supports(dataset: Any) -> bool:
        """Whether ``dataset`` can be sliced directly."""
        return callable(getattr(dataset, "get_batch", None)) or isinstance(dataset, TensorDataset)


class FederatedDataModule(L.LightningDataModule):
    """A training dataset partitioned into clients, with per-round cohorts and per-client local work.

    One Lightning epoch of :class:`~lightning_fed.FederatedTrainer` is one communication round. In round ``t``
    the loop asks :meth:`sample_clients` for the cohort S_t (``clients_per_round`` distinct clients, uniformly
    without replacement within the round and independently across rounds, Reddi et al. 2021, Alg. 1, l. 3) and
    trains each client on :meth:`client_dataloader`. Everything random is a pure function of ``seed``, the round
    and the client id, so runs repeat exactly, on any machine, whatever the order clients are trained in.

    With a plain :class:`lightning.Trainer` the same module trains centrally: :meth:`train_dataloader` covers all
    clients' data (a centralised baseline with no code change).

    The module composes parts, each with its own checks and settings: the data source (:attr:`data_source`, a
    :class:`~lightning_fed.datamodules.source.DataSource`: the datasets, labels, ids, batch format), the
    ``partitioner``, the cohort sampler (:attr:`cohorts`, a :class:`~lightning_fed.datamodules.cohorts.CohortSampler`),
    the local work (:attr:`local_work`) and federated evaluation (:attr:`client_evaluation`, a
    :class:`~lightning_fed.datamodules.client_eval.ClientEvaluation`); the options below build them, and stay
    readable and settable as attributes (``dm.clients_per_round`` is ``dm.cohorts.clients_per_round``,
    ``dm.train_dataset`` is ``dm.data_source.train_dataset``).
    :meth:`settings` and :meth:`run_config` collect the parts' reports for TensorBoard and the checkpoints. A task
    is a subclass that loads its data (:meth:`load_datasets`) and passes every other option on through
    ``**kwargs`` (the docs' "Write your own task").

    Args:
        train_dataset: The training data: a map-style torch ``Dataset`` or a Hugging Face ``datasets.Dataset``
            (given the ``"torch"`` format if it has none; a ragged column, rows of different lengths, is refused
            at fit start unless ``batch_size=1``: :meth:`check_local_work`). Subclasses may leave it ``None`` and implement
            :meth:`load_datasets`.
        val_dataset: Centralized evaluation data for ``validation_step`` (default: none).
        test_dataset: Data for ``trainer.test`` (default: ``val_dataset``).
        partitioner: How to split ``train_dataset`` into clients (e.g. :class:`DirichletPartitioner`).
        clients_per_round: Cohort size C per round (default 10); must not exceed the number of clients.
        batch_size: Client mini-batch size B (default 20), used when ``local_work`` is not given.
        local_epochs: Local epochs E per round (default 1), used when ``local_work`` is not given.
        local_work: A :class:`LocalWork` policy giving each (client, round) its epochs / steps and batch size;
            overrides ``batch_size``/``local_epochs``.
        data_order: Order of a client's samples: ``"reshuffle"`` (random reshuffling every local epoch, default),
            ``"once"`` (shuffle-once: one fixed permutation per client for the whole run; Malinovsky et al.,
            Nastya) or ``"none"`` (dataset order).
        seed: Seeds cohort sampling, local-work sampling and data order (default 0).
        label_column: Column holding labels in a Hugging Face dataset (default ``"label"``).
        labels: Explicit per-sample labels, shape ``[len(train_dataset)]``; else read from ``targets``
            (torchvision's convention) or ``label_column`` — never by decoding every sample.
        eval_batch_size: Batch size of the validation/test loaders (default 256).
        num_workers: DataLoader workers for every loader (default 0: in-process, fastest for small clients).
        drop_last: Drop a client's last incomplete batch each local epoch (default ``False``).
        client_dropout: Probability p in [0, 1) that a sampled client drops out of the round (device
            unavailability, stragglers), independently per (round, client), seeded (default 0).
        over_selection: Sample ⌈C·(1 + over_selection)⌉ candidates and keep the first C that do not drop out
            (Bonawitz et al. 2019's over-selection), ``>= 0`` (default 0).
        eval_clients_per_round: Federated evaluation (see :mod:`lightning_fed.evaluation`): each time the global
            model is validated, evaluate it on this many clients' own evaluation data (an int >= 1, sampled
            uniformly without replacement, seeded by ``(seed, round)``) or on every client with evaluation data
            (``"all"``). Default ``None``: off (no ``fed_*`` metrics; runs unchanged).
        eval_fraction: Hold out this fraction (in (0, 1)) of every client's share as its evaluation data,
            seeded and stratified by label where labels are known (:func:`split_client_eval`); the clients then
            train on the rest. Default ``None``: the data module's natural per-client split (Shakespeare: each
            role's last 20 % of speeches; :meth:`natural_eval_split`) where it has one, else none. This split is
            the default way to give clients evaluation data because it is drawn from each client's own
            distribution (what federated and personalised evaluation measure, Wang et al. 2019). Given on a task
            with a natural split, it replaces that split for federated evaluation (the clients then train on the
            rest of their training share; the centralized validation and test sets are unchanged).
        eval_local_steps: Personalised evaluation (Wang et al. 2019): before evaluating, fine-tune each
            evaluation client for this many local steps of the module's own optimizer from the global model
            (logged as ``fed_personalized_*``; the global model is restored afterwards). Default 0: off.
        eval_csv: Path of a CSV file receiving one row per (validation, evaluation client): round, client id,
            evaluation samples and every metric (default ``None``: no file). Overwritten by the first
            federated evaluation of a run, appended to afterwards; a resumed ``fit(ckpt_path=...)`` keeps the rows of
            the rounds before the resumed round and appends. Checked at fit / validate start: a missing folder is
            created, a directory or an unwritable path is refused (``ValueError`` naming ``eval_csv``).
        eval_personal_untrained: With a personalised method (FedBN, FedPer, FedRep, Ditto, ...), how an evaluation
            client that has no personal state yet (never trained) enters ``fed_personal_*``: ``"global"``
            (default) with the global model (its personal model until it trains: FedBN / FedPer / FedRep's initial
            personal parts, Ditto's w^t), ``"exclude"`` left out of the ``fed_personal_*`` statistics (and its
            ``personal_*`` CSV cells empty); ``fed_*`` and ``fed_personalized_*`` keep every client. Without a
            personalised method (FedAvg) ``fed_personal_*`` equals ``fed_*`` either way.
        cohort_sampling: How each round's cohort is drawn. ``"fixed_size"`` (default): ``clients_per_round``
            distinct clients, uniformly without replacement. ``"poisson"``: every client joins independently with
            probability q = C/N (C = ``clients_per_round``, N clients; McMahan et al. 2018, Alg. 1, the sampling
            of the add/remove-one privacy analysis of TFF and Opacus), so the cohort size is Binomial(N, q) with
            mean C: it varies by round and may be 0 — such a round is a round where nobody reports (the global
            model is unchanged, with a warning; a DP server optimizer with ``sampling="poisson"`` still steps
            with the noise alone and composes the round, as the Poisson analysis requires). Seeded by
            ``(seed, round)`` like the fixed-size cohorts; recorded in checkpoints. Not combinable with
            ``over_selection``; DP server optimizers must be given the same ``sampling``.
            ``"sweep_then_uniform"``: the first ⌈N/C⌉ rounds visit every client exactly once, C at a time, in a
            random order fixed by ``seed`` (the last sweep round takes the N mod C left over, if any); from then on
            as ``"fixed_size"``. This is the start-up of FedAWARE's public code (github.com/dunzeng/FedAWARE,
            ``FeedbackSampler``, read, not copied: its first ⌈N/C⌉ rounds sweep all clients, then it samples
            uniformly; there the sweep after the first round happens to go in increasing client id, an artefact of
            Python's set order). Each sweep round's cohort is listed in the permutation's order. Not combinable
            with ``over_selection``; refused by DP server optimizers (no privacy analysis for it); recorded in
            checkpoints.
        batch_columns: For a Hugging Face ``train_dataset``, whose batches are dicts keyed by column
            (``{"image": tensor [B, ...], "label": tensor [B]}``): the columns to give as a tuple instead, in this
            order, e.g. ``("image", "label")`` for ``x, y = batch`` in a ``training_step`` written for a
            ``TensorDataset``. Applies to every batch of the module (clients, federated evaluation, the
            centralized, validation and test loaders over Hugging Face datasets); the other columns are left out.
            Default ``None``: dict batches. Without it, a client failing as if it had read a dict batch as a tuple
            (``TypeError: … must be Tensor, not str`` from ``x, y = batch``) is reported with a hint naming the
            columns (:meth:`batch_hint`); a ``validation_step`` (the sanity check included) or ``test_step``
            failing so gets it as a note on its error.
        poisson_draws: How a ``cohort_sampling="poisson"`` cohort is drawn: ``"per_client"`` (default; N uniforms
            a round) or ``"binomial"`` (K ~ Binomial(N, q), then K distinct clients uniformly: the same law, so the
            same privacy analysis, in O(K) a round for populations of millions; other cohorts than
            ``"per_client"``, recorded in checkpoints). See :class:`~lightning_fed.datamodules.cohorts.CohortSampler`.
        device_model: Simulated time (issue #53): a :class:`~lightning_fed.datamodules.devices.DeviceModel` giving
            each client's compute speed, bandwidths, latency (and availability); each round is then planned on a
            simulated clock (:mod:`lightning_fed.clock`), logged as ``clock/*`` round metrics, and over-selection
            keeps the first ``clients_per_round`` clients to finish. Default ``None``: off, runs unchanged. See
            :class:`~lightning_fed.datamodules.simulated_time.SimulatedTime`.
        round_deadline: Deadline of every round in simulated seconds (> 0), or ``None`` (default); needs
            ``device_model``.
        deadline_policy: What a client that would finish after ``round_deadline`` does: ``"drop"`` (default; it is
            left out and does not train) or ``"partial"`` (it runs the local steps that fit; its update is the one
            after them).
        asynchronous: Asynchronous training (issue #54: FedBuff, FedAsync), an
            :class:`~lightning_fed.asynchronous.AsyncConfig`, or ``None`` (default: rounds); needs ``device_model``.
            One epoch is then one server step (:mod:`lightning_fed.asynchronous.loop_mode`).

    Raises:
        ValueError: a non-positive ``clients_per_round``/``batch_size``/``local_epochs``/``eval_batch_size``,
            an unknown ``data_order``, a negative ``num_workers``, ``client_dropout`` outside [0, 1), a negative
            ``over_selection``, an unknown ``cohort_sampling`` or ``"poisson"`` with ``over_selection`` > 0, an
            ``eval_clients_per_round`` that is not ``None``, an int >= 1 or ``"all"``, an
            ``eval_fraction`` outside (0, 1), a negative ``eval_local_steps``, ``eval_local_steps`` or ``eval_csv``
            without ``eval_clients_per_round``; at :meth:`setup`, federated evaluation with no per-client
            evaluation data, more evaluation clients than clients with evaluation data; ``batch_columns`` that is not a sequence of distinct names, or (at
            :meth:`setup`) with a ``train_dataset`` that is not a Hugging Face dataset or a column its batches lack;
            ``clients_per_round`` larger
            than the number of clients, clients with zero samples, or labels/ids the partitioner needs but
            cannot be found.
        TypeError: ``partitioner`` or ``local_work`` of the wrong type.
        ArgumentError: a ``device_model`` that is not a DeviceModel, a ``round_deadline`` <= 0, an unknown
            ``deadline_policy``, a deadline without a device model, ``"partial"`` without a deadline, an
            ``asynchronous`` without a device model or with a deadline
            (:class:`~lightning_fed.datamodules.simulated_time.SimulatedTime`).

    Example (12 samples, 4 IID clients of 3, batch size 2: client 0's round-0 batches)::

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed.datamodules import IIDPartitioner
        >>> ds = TensorDataset(torch.arange(12.0).reshape(12, 1), torch.arange(12) % 3)
        >>> dm = FederatedDataModule(ds, partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
        ...                          batch_size=2)
        >>> dm.setup()
        >>> dm.num_clients, [dm.client_num_samples(c) for c in range(4)], dm.sample_clients(0).tolist()
        (4, [3, 3, 3, 3], [2, 0])
        >>> [b.tolist() for b in dm.client_batches(0, 0)]
        [[2, 7], [9]]
    """

    def __init__(
        self,
        train_dataset: Optional[Any] = None,
        val_dataset: Optional[Any] = None,
        test_dataset: Optional[Any] = None,
        partitioner: Optional[Partitioner] = None,
        clients_per_round: int = 10,
        batch_size: int = 20,
        local_epochs: int = 1,
        local_work: Optional[LocalWork] = None,
        data_order: str = "reshuffle",
        seed: int = 0,
        label_column: str = "label",
        labels: Optional[Sequence[int]] = None,
        eval_batch_size: int = 256,
        num_workers: int = 0,
        drop_last: bool = False,
        client_dropout: float = 0.0,
        over_selection: float = 0.0,
        eval_clients_per_round: Optional[Union[int, str]] = None,
        eval_fraction: Optional[float] = None,
        eval_local_steps: int = 0,
        eval_csv: Optional[str] = None,
        cohort_sampling: str = "fixed_size",
        batch_columns: Optional[Sequence[str]] = None,
        poisson_draws: str = "per_client",
        eval_personal_untrained: str = "global",
        device_model: Optional[DeviceModel] = None,
        round_deadline: Optional[float] = None,
        deadline_policy: str = "drop",
        asynchronous: Optional[AsyncConfig] = None,
    ) -> None:
        super().__init__()
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            raise TypeError(f"`partitioner` must be a Partitioner (e.g. IIDPartitioner), got {type(partitioner).__name__}.")
        if local_work is not None and not isinstance(local_work, LocalWork):
            raise TypeError(f"`local_work` must be a LocalWork policy, got {type(local_work).__name__}.")
        if data_order not in _DATA_ORDERS:
            raise ValueError(f"`data_order` must be one of {_DATA_ORDERS}, got {data_order!r}.")
        check_int("num_workers", num_workers, 0)
        check_int("seed", seed, 0)
        #: The cohort of each round (:class:`~lightning_fed.datamodules.cohorts.CohortSampler`).
        self.cohorts = CohortSampler(clients_per_round, cohort_sampling, client_dropout, over_selection, int(seed),
                                     poisson_draws)
        #: The datasets and how they are read (:class:`~lightning_fed.datamodules.source.DataSource`).
        self.data_source = DataSource(train_dataset, val_dataset, test_dataset, label_column, labels, batch_columns)
        #: Federated evaluation's settings (:class:`~lightning_fed.datamodules.client_eval.ClientEvaluation`).
        self.client_evaluation = ClientEvaluation(eval_clients_per_round, eval_fraction, eval_local_steps, eval_csv,
                                                  eval_personal_untrained)
        #: The device model, round deadline and clock (:class:`~lightning_fed.datamodules.simulated_time.SimulatedTime`).
        self.simulated_time = SimulatedTime(device_model, round_deadline, deadline_policy, asynchronous)
        self.batch_size = _check_positive_int("batch_size", batch_size)
        self.local_epochs = _check_positive_int("local_epochs", local_epochs)
        self.eval_batch_size = _check_positive_int("eval_batch_size", eval_batch_size)
        self.local_work = local_work if local_work is not None else FixedLocalWork(self.local_epochs, self.batch_size)
        self.partitioner = partitioner
        self.data_order = data_order
        self._seed = int(seed)
        self.num_workers = int(num_workers)
        self.drop_last = bool(drop_last)
        self._partition: Optional[Partition] = None
        #: The dataset the clients' evaluation indices point into, and client c's indices (after :meth:`setup`).
        self.client_eval_dataset: Optional[Any] = None
        self._client_eval: Optional[Partition] = None  # client c's evaluation indices, CSR
        self._eval_client_ids: Optional[np.ndarray] = None
        #: The most local batches a client takes per round (``None``: its whole local work). Set at fit start by
        #: :class:`~lightning_fed.FederatedTrainer` from ``limit_train_batches`` / ``fast_dev_run``.
        self.local_batch_limit: Optional[int] = None
        #: The most evaluation batches a client evaluates (``None``: all). Set by federated evaluation from the
        #: trainer's ``limit_val_batches`` (an int k: the first k batches of every client).
        self.eval_batch_limit: Optional[int] = None

    # ------------------------------------------------------------------ hooks for subclasses
    def load_datasets(self) -> tuple[Any, Optional[Any], Optional[Any]]:
        """Return ``(train, val, test)``; called once in :meth:`setup` when ``train_dataset`` was not given.

        Raises:
            ValueError: always, in the base class: give ``train_dataset`` or use a task subclass.
        """
        raise ValueError(
            "`train_dataset` is required: pass a torch or Hugging Face dataset, or use a task data module "
            "(e.g. ShakespeareDataModule) that loads one."
        )

    # ------------------------------------------------------------------ setup
    def setup(self, stage: Optional[str] = None) -> None:
        """Load the datasets (once) and compute the partition (once; deterministic by the partitioner's seed)."""
        if self._partition is not None:
            return
        self.data_source.setup(self.load_datasets)
        if self.partitioner is None:
            raise ValueError("`partitioner` is required: e.g. IIDPartitioner(num_clients=100).")
        n = len(self.train_dataset)
        needs = self.partitioner.requires
        labels = self.data_source.read_labels(type(self.partitioner).__name__ if needs == "labels" else None)
        partition = self.cached_partition(labels)
        if partition is None:
            ids = self.data_source.read_column(self.partitioner.id_column) if needs == "ids" else None
            partition = self.partitioner.partition(n, labels=labels, ids=ids)
        sizes = partition.sizes()
        if (sizes == 0).any():
            empty = np.flatnonzero(sizes == 0)
            raise ValueError(
                f"The partition has {empty.size} client(s) with zero samples (e.g. client {int(empty[0])}); "
                f"lower `num_clients` or raise the partitioner's minimum size."
            )
        self.cohorts.check_population(partition.num_clients)
        if self.device_model is not None:
            self.device_model.setup(partition.num_clients)
        self._partition = partition
        self._setup_client_eval()

    def teardown(self, stage: Optional[str] = None) -> None:
        """At the end of ``fit`` (Lightning's hook): keep the images of a Hugging Face ``train_dataset`` that client
        batches decoded in ``datasets``' cache for later runs (:meth:`DataSource.save_decoded_images
        <lightning_fed.datamodules.source.DataSource.save_decoded_images>`)."""
        self.data_source.save_decoded_images()

    def cached_partition(self, labels: Optional[np.ndarray]) -> Optional[Partition]:
        """A partition stored with the data, equal to what ``partitioner`` computes, or ``None`` (the default: the
        partitioner runs at :meth:`setup`). Task data modules that cache their data may cache its partition too
        (Stack Overflow: the train split grouped by user). ``labels``: the labels :meth:`setup` read, or ``None``."""
        return None

    # ------------------------------------------------------------------ federated evaluation data
    def natural_eval_split(self) -> Optional[tuple[Any, np.ndarray]]:
        """A natural per-client evaluation split: ``(dataset, ids)`` with ``ids[j]`` the natural client id (as in
        ``partition.client_names``) of ``dataset[j]``, or ``None`` (the default: none). Task data modules with
        per-client test data override it (Shakespeare: each role's last 20 % of speeches)."""
        return None

    def natural_eval_indices(self) -> Optional[tuple[Any, list[np.ndarray]]]:
        """The natural split grouped per client: ``(dataset, [int64 indices into dataset of client c, c = 0..N-1])``
        or ``None``. The default groups :meth:`natural_eval_split`'s ids by ``partition.client_names`` (each
        client's samples in dataset order; ids naming no client are dropped); data modules that keep the grouping
        precomputed (Stack Overflow's cache) override :meth:`natural_eval_partition` with the same result.

        Raises:
            ValueError: a natural split but a partition without ``client_names``.
        """
        natural = self.natural_eval_partition()
        if natural is None:
            return None
        dataset, groups = natural
        return dataset, np.split(groups.indices, groups.offsets[1:-1])

    def natural_eval_partition(self) -> Optional[tuple[Any, Partition]]:
        """:meth:`natural_eval_indices` as ``(dataset, Partition)`` (CSR: client c's indices are
        ``indices[offsets[c]:offsets[c + 1]]``), without one array per client; what :meth:`setup` reads. A data
        module that overrides :meth:`natural_eval_indices` is read through it.

        Raises:
            ValueError: a natural split but a partition without ``client_names``.
        """
        if type(self).natural_eval_indices is not FederatedDataModule.natural_eval_indices:
            natural = self.natural_eval_indices()
            if natural is None or not len(natural[1]):
                return None
            return natural[0], Partition.from_client_lists(natural[1])
        natural = self.natural_eval_split()
        if natural is None:
            return None
        partition = self._partition
        dataset, ids = natural
        ids = np.asarray(ids)
        names = partition.client_names
        if names is None:
            raise ValueError("A natural evaluation split needs a partition with `client_names` (natural ids).")
        names = np.asarray(names)
        sorter = np.argsort(names, kind="stable")
        at = np.clip(np.searchsorted(names, ids, sorter=sorter), 0, max(names.size - 1, 0))
        position = sorter[at]
        known = names[position] == ids
        rows = np.flatnonzero(known)
        order = rows[np.argsort(position[rows], kind="stable")]
        offsets = np.zeros(partition.num_clients + 1, dtype=np.int64)
        np.cumsum(np.bincount(position[rows], minlength=partition.num_clients), out=offsets[1:])
        return dataset, Partition(order.astype(np.int64), offsets)

    def _setup_client_eval(self) -> None:
        held = self.client_evaluation.held_out(self._partition, self.seed)
        if held is not None:  # replaces a natural per-client split, if the task has one
            self._partition, self._client_eval = held
            self.client_eval_dataset = self.train_dataset
        elif (natural := self.natural_eval_partition()) is not None:
            self.client_eval_dataset, self._client_eval = natural
        self._eval_client_ids = self.client_evaluation.eligible_clients(self._client_eval, type(self).__name__)

    def client_eval_indices(self, cid: int) -> np.ndarray:
        """Indices into :attr:`client_eval_dataset` of client ``cid``'s evaluation samples, int64 ``[m_cid]``.

        Raises:
            RuntimeError: before :meth:`setup`, or when the data module has no per-client evaluation data.
        """
        if self._client_eval is None:
            raise RuntimeError(
                "No per-client evaluation data: call `setup()`; it needs `eval_fraction` or a natural split."
            )
        return self._client_eval.client_indices(int(cid))

    def eval_client_ids(self) -> np.ndarray:
        """The clients with at least one evaluation sample, sorted, int64 (computed once, at :meth:`setup`)."""
        if self._eval_client_ids is None:
            return np.zeros(0, dtype=np.int64)
        return self._eval_client_ids

    def select_eval_clients(self, round_idx: int) -> np.ndarray:
        """The evaluation clients of round ``round_idx``: all clients with evaluation data (``"all"``), or
        ``eval_clients_per_round`` of them uniformly without replacement, a pure function of ``(seed, round_idx)``
        (independent of the training cohort's draw); sorted int64.

        Raises:
            RuntimeError: federated evaluation is off (``eval_clients_per_round=None``).
        """
        if self.eval_clients_per_round is None:
            raise RuntimeError("Federated evaluation is off: set `eval_clients_per_round`.")
        return self.client_evaluation.select(self.eval_client_ids(), round_idx, self.seed)

    def client_eval_batches(self, cid: int) -> list[np.ndarray]:
        """Client ``cid``'s evaluation mini-batches: its evaluation indices in order, cut into batches of
        ``eval_batch_size`` (the last one smaller); the first ``eval_batch_limit`` of them when that is set (from the
        trainer's ``limit_val_batches``)."""
        idx = self.client_eval_indices(cid)
        batches = [idx[i : i + self.eval_batch_size] for i in range(0, len(idx), self.eval_batch_size)]
        return batches if self.eval_batch_limit is None else batches[: self.eval_batch_limit]

    def client_eval_dataloader(self, cid: int) -> Any:
        """An iterable over client ``cid``'s evaluation batches, sliced directly (:class:`TensorBatches`) like the
        training batches where the dataset allows it, else a ``DataLoader``."""
        batches = self.client_eval_batches(cid)
        dataset = self.client_eval_dataset
        if self.num_workers == 0 and TensorBatches.supports(dataset):
            return TensorBatches(dataset, batches)
        return DataLoader(dataset, batch_sampler=[b.tolist() for b in batches], num_workers=self.num_workers,
                          collate_fn=self.collate_fn(dataset))

    def client_personalization_batches(self, cid: int, round_idx: int, steps: int) -> list[np.ndarray]:
        """``steps`` mini-batches of client ``cid``'s *training* data for personalised evaluation: its round's
        batch size and data order, passes continued until exactly ``steps`` batches (:func:`batch_schedule`)."""
        work = self.client_work(cid, round_idx)
        return batch_schedule(
            self.client_indices(cid), ClientWork(1, work.batch_size, steps=int(steps)), int(round_idx), int(cid),
            self.seed, self.data_order, False,
        )

    # ------------------------------------------------------------------ clients
    @property
    def partition(self) -> Partition:
        """The computed :class:`Partition` (after :meth:`setup`).

        Raises:
            RuntimeError: before :meth:`setup`.
        """
        if self._partition is None:
            raise RuntimeError("The partition is computed in `setup()`; call `datamodule.setup()` first.")
        return self._partition

    @property
    def num_clients(self) -> int:
        """Number of clients N in the partition."""
        return self.partition.num_clients

    def client_indices(self, cid: int) -> np.ndarray:
        """Indices into ``train_dataset`` of client ``cid``'s samples, shape ``[n_cid]``."""
        return self.partition.client_indices(cid)

    def client_dataset(self, cid: int) -> Dataset:
        """Client ``cid``'s local dataset, an index view (``Subset``) of ``train_dataset``."""
        return Subset(self.train_dataset, self.client_indices(cid).tolist())

    def client_num_samples(self, cid: int) -> int:
        """|D_cid|, the number of training samples client ``cid`` holds."""
        return len(self.client_indices(cid))

    def sample_clients(self, round_idx: int) -> np.ndarray:
        """The cohort of round ``round_idx``: ``clients_per_round`` distinct client ids, shape ``[C]``, int64
        (fewer when ``client_dropout`` removes more candidates than ``over_selection`` replaces).

        Uniform without replacement within the round, independent across rounds; a pure function of
        ``(seed, round_idx)`` (Reddi et al. 2021, Alg. 1, l. 3). With ``cohort_sampling="poisson"``: each client
        independently with probability C/N (any size from 0 to N, mean C), in increasing id order. See
        :meth:`select_cohort`.
        """
        return self.select_cohort(round_idx).cohort

    def select_cohort(self, round_idx: int, time: Optional[float] = None) -> CohortSelection:
        """Sample the round's candidates, apply simulated dropout, keep the first ``clients_per_round`` (Poisson
        cohorts: keep all): :meth:`CohortSampler.select <lightning_fed.datamodules.cohorts.CohortSampler.select>`.
        With a ``device_model`` that has availability (FedScale's behaviour trace) only the clients online at the
        round's start are sampled: at simulated ``time`` (seconds), by default the clock's (the round about to run).

        Raises:
            RuntimeError: with availability, no client of the population online at that time (the sampler asked every
                client; the message says when the first comes online).
        """
        model = self.device_model
        if model is None or not model.has_availability:
            return self.cohorts.select(int(round_idx), self.num_clients)
        t = self.simulated_time.clock.elapsed_seconds if time is None else float(time)
        selection = self.cohorts.select(int(round_idx), self.num_clients, lambda ids: model.is_online(ids, t))
        if selection.offline >= self.num_clients:
            back = float(model.next_online(selection.offline_ids, t).min())  # every client was asked already
            raise RuntimeError(
                f"Round {round_idx}: none of the {self.num_clients} clients is online at simulated time {t:g} s "
                f"({type(model).__name__}'s availability); the first is back at {back:g} s. Use more clients, "
                "another device seed, or a trace with clients online then."
            )
        return selection

    @property
    def sweep_rounds(self) -> int:
        """⌈N/C⌉: the rounds of the sweep of ``cohort_sampling="sweep_then_uniform"`` (0 under the other samplings)."""
        return self.cohorts.sweep_rounds(self.num_clients)

    # ------------------------------------------------------------------ settings, reported by the parts
    #: The data module's own settings that define a training run (its parts report theirs).
    run_settings: tuple[str, ...] = ("seed", "data_order", "drop_last")

    @classmethod
    def run_setting_names(cls) -> tuple[str, ...]:
        """The names of :meth:`run_config`: the module's own :attr:`run_settings`, then its parts'
        (:class:`CohortSampler`, :class:`ClientEvaluation`)."""
        return ("seed", *CohortSampler.run_settings[:1], *cls.run_settings[1:], *CohortSampler.run_settings[1:],
                *ClientEvaluation.run_settings)

    @classmethod
    def record_defaults(cls) -> dict[str, Any]:
        """The run settings recorded later than the first checkpoints, with the value a checkpoint that lacks them
        was run with (the parts' ``record_defaults``): what a resume compares a new setting against."""
        return {**CohortSampler.record_defaults, **ClientEvaluation.record_defaults}

    def run_config(self) -> dict[str, Any]:
        """The settings that define the training run (recorded in checkpoints and compared on resume), flat
        ``{name: value}`` in :meth:`run_setting_names` order, from the parts' own reports."""
        every = self.settings()
        return {**{name: every[name] for name in self.run_setting_names()}, **self.simulated_time.run_config()}

    def settings(self) -> dict[str, Any]:
        """Every setting of the module and of its parts, flat ``{name: value}`` (TensorBoard's HParams): ``seed``,
        ``data_order``, ``drop_last``, then the cohort sampler's and federated evaluation's own reports."""
        out = {"seed": self.seed, "data_order": self.data_order, "drop_last": self.drop_last}
        out.update(self.cohorts.settings())
        out.update(self.client_evaluation.settings())
        out.update(self.simulated_time.settings())  # nothing without a device model
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of the data module: the simulated clock when a ``device_model`` is set, else
        ``{}`` (Lightning then saves nothing)."""
        return self.simulated_time.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a resumed run goes on at the saved simulated time)."""
        self.simulated_time.load_state_dict(state_dict)

    @property
    def seed(self) -> int:
        """Seeds cohort sampling, local-work sampling and data order."""
        return self._seed

    @seed.setter
    def seed(self, value: int) -> None:
        self._seed = int(value)
        self.cohorts.seed = int(value)

    def check_local_work(self) -> None:
        """Refuse local work that trains nothing (called at fit start by the federated loop): with
        ``drop_last=True`` and a fixed batch size, a client with fewer samples than a batch takes no local step;
        a Hugging Face ``train_dataset`` with a ragged column (rows of different lengths, :func:`ragged_column`)
        cannot be collated into batches of more than one row, so the clients holding its short rows would fail in
        every round (refused unless ``batch_size=1``, or a subclass's own ``client_dataloader`` collates them); nor
        can an ``Image`` column holding ``None`` images (refused whatever the batch size) or PNG images of different
        shapes (unless ``batch_size=1``), read from the PNG headers without decoding
        (:meth:`DataSource.check_image_columns <lightning_fed.datamodules.source.DataSource.check_image_columns>`).

        Raises:
            ValueError: naming ``drop_last``, ``batch_size`` and how many clients are too small; naming the ragged
                column, the shortest and longest lengths found and a row of each; naming the Image column and its
                ``None`` rows or two rows of different shapes.
        """
        self.simulated_time.check_data_module(self)  # "partial" deadlines cut the work through client_batches
        batch_size = getattr(self.local_work, "batch_size", None)
        default_loader = type(self).client_dataloader is FederatedDataModule.client_dataloader
        if default_loader and batch_size != 1:
            self.data_source.check_collatable()
        if default_loader:  # None images fail whatever the batch size; images of different shapes in batches of 2+
            self.data_source.check_image_columns(shapes=batch_size != 1)
        if not self.drop_last or not isinstance(batch_size, numbers.Integral):
            return
        sizes = self.partition.sizes()
        small = int((sizes < batch_size).sum())
        if small:
            raise ValueError(
                f"With `drop_last=True` and `batch_size={batch_size}`, {small} of {len(sizes)} clients (the smallest "
                f"holds {int(sizes.min())} samples) cannot form one batch and would take no local step; use "
                "`drop_last=False` or a smaller `batch_size`."
            )

    def client_work(self, cid: int, round_idx: int) -> ClientWork:
        """Local epochs/steps and batch size of client ``cid`` in round ``round_idx`` (from ``local_work``)."""
        return self.local_work.plan(int(cid), int(round_idx), self.client_num_samples(cid))

    def client_batches(self, cid: int, round_idx: int) -> list[np.ndarray]:
        """The round's mini-batches of client ``cid``: a list of int64 index arrays into ``train_dataset`` (the
        first ``local_batch_limit`` of them when that is set; under ``deadline_policy="partial"``, the first k_i
        that fit before the round deadline, :meth:`SimulatedTime.step_limit
        <lightning_fed.datamodules.simulated_time.SimulatedTime.step_limit>`)."""
        work = self.client_work(cid, round_idx)
        batches = batch_schedule(
            self.client_indices(cid), work, int(round_idx), int(cid), self.seed, self.data_order, self.drop_last
        )
        if self.local_batch_limit is not None:
            batches = batches[: self.local_batch_limit]
        steps = self.simulated_time.step_limit(cid, round_idx)  # the steps that fit before the round deadline
        return batches if steps is None else batches[:steps]

    def client_dataloader(self, cid: int, round_idx: int) -> Any:
        """An iterable over client ``cid``'s mini-batches for round ``round_idx`` (its whole local work: all local
        epochs, or its step budget, in order).

        Tensor-backed datasets (a ``TensorDataset``, or any dataset with ``get_batch(index)``) are sliced
        directly (:class:`TensorBatches`) when ``num_workers == 0``; others go through a ``DataLoader`` with the
        batches as its ``batch_sampler``. Both yield the same batches.
        """
        return self.train_batches_loader(self.client_batches(cid, round_idx))

    def train_batches_loader(self, batches: list[np.ndarray]) -> Any:
        """An iterable over the given mini-batches of ``train_dataset`` (int64 index arrays), made as
        :meth:`client_dataloader` makes a round's (a client half drawing batches of its own: FedALA's subset)."""
        if self.num_workers == 0 and TensorBatches.supports(self.train_dataset):
            return TensorBatches(self.train_dataset, batches)
        columns = self.data_source.tensor_columns() if self.num_workers == 0 else None  # a Hugging Face train_dataset
        if columns is not None:
            return TensorBatches(columns, batches)
        return DataLoader(self.train_dataset, batch_sampler=[b.tolist() for b in batches], num_workers=self.num_workers,
                          collate_fn=self.collate_fn(self.train_dataset))

    def collate_fn(self, dataset: Any) -> Any:
        """The ``collate_fn`` of a ``DataLoader`` over ``dataset`` (:meth:`DataSource.collate_fn
        <lightning_fed.datamodules.source.DataSource.collate_fn>`: with ``batch_columns``, tuples of those columns
        for a Hugging Face dataset; else ``None``)."""
        return self.data_source.collate_fn(dataset)

    def batch_hint(self, error: BaseException, step: str = "training_step") -> Optional[str]:
        """A hint for a ``step`` of the module (default ``training_step``, a client's local work;
        ``validation_step``, ``test_step``) that raised ``error`` by reading this module's dict batches as tuples,
        naming the columns (:meth:`DataSource.batch_hint <lightning_fed.datamodules.source.DataSource.batch_hint>`);
        ``None`` otherwise. The client runner adds it to the client's failure, the trainer to an error of
        validation (the sanity check included) or testing."""
        return self.data_source.batch_hint(error, step)

    # ------------------------------------------------------------------ Lightning loaders
    def train_dataloader(self) -> DataLoader:
        """All training data in one shuffled loader: the centralized baseline for a plain ``lightning.Trainer``."""
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_dataset, batch_size=self.batch_size, shuffle=True, generator=generator,
            num_workers=self.num_workers, collate_fn=self.collate_fn(self.train_dataset),
        )

    def val_dataloader(self) -> Any:
        """The centralized validation loader over ``val_dataset``; without one, over the union of the clients'
        evaluation data (from ``eval_fraction`` or the natural per-client split) when there is any, else ``[]``
        (Lightning skips validation, federated evaluation included, when there is no validation batch)."""
        if self.val_dataset is None:
            # any per-client evaluation data (eval_fraction or a natural split), over the clean dataset set up
            # before any wrapper (flip_client_labels replaces train_dataset after setup)
            if self._client_eval is not None and self.client_eval_dataset is not None:
                union = self._client_eval.indices.tolist()
                return DataLoader(Subset(self.client_eval_dataset, union), batch_size=self.eval_batch_size,
                                  num_workers=self.num_workers, collate_fn=self.collate_fn(self.client_eval_dataset))
            return []
        return DataLoader(self.val_dataset, batch_size=self.eval_batch_size, num_workers=self.num_workers,
                          collate_fn=self.collate_fn(self.val_dataset))

    def test_dataloader(self) -> Any:
        """The test loader over ``test_dataset`` (or ``val_dataset``)."""
        dataset = self.test_dataset if self.test_dataset is not None else self.val_dataset
        if dataset is None:
            return []
        return DataLoader(dataset, batch_size=self.eval_batch_size, num_workers=self.num_workers,
                          collate_fn=self.collate_fn(dataset))


def refuse_options(task: str, options: dict[str, Any], **fixed: str) -> None:
    """Refuse, by name, the :class:`FederatedDataModule` options a task sets itself (e.g. the ``partitioner`` of a
    task whose clients are natural: its users).

    Args:
        task: The task's name, for the message.
        options: The options the task was given (its ``**kwargs``); ``None`` counts as not given.
        fixed: ``option=why`` for each option the task fixes.

    Raises:
        ValueError: naming the option, the task and why.

    Example::

        >>> refuse_options("MyTask", {"partitioner": 1}, partitioner="its clients are its users")
        Traceback (most recent call last):
        ...
        ValueError: MyTask does not take `partitioner`: its clients are its users.
    """
    for name, why in fixed.items():
        if options.get(name) is not None:  # a parser may pass the default None
            raise ValueError(f"{task} does not take `{name}`: {why}.")


def _delegate(part: str, name: str) -> property:
    def get(self: Any) -> Any:
        return getattr(getattr(self, part), name)

    def set_(self: Any, value: Any) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, set_, doc=f"``{part}.{name}`` (see :class:`FederatedDataModule`).")


for _name in CohortSampler.setting_names:
    setattr(FederatedDataModule, _name, _delegate("cohorts", _name))
for _name in ClientEvaluation.setting_names:
    setattr(FederatedDataModule, _name, _delegate("client_evaluation", _name))
for _name in SimulatedTime.setting_names:
    setattr(FederatedDataModule, _name, _delegate("simulated_time", _name))
for _name in DataSource.attributes:
    setattr(FederatedDataModule, _name, _delegate("data_source", _name))
del _name
