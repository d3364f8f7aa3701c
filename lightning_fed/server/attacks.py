"""Simulated attackers for robustness experiments and tests.

* :class:`MaliciousClients` — a client transform (aggregator stage of kind ``"transform"``, placed first in a chain)
  that replaces the updates of ⌊fraction·K⌋ clients of each round by an attack: sign flip, scaled update or
  Gaussian noise. The malicious clients of a round are a pure function of ``(seed, round_idx)`` and the cohort.
* :class:`LabelFlip` — data poisoning: a dataset wrapper that flips the labels y → C − 1 − y of the samples of fixed
  malicious clients (chosen once, e.g. by :func:`choose_malicious_clients`); :func:`flip_client_labels` installs
  it in a set-up :class:`~lightning_fed.datamodules.FederatedDataModule`.

Example: 20 % sign-flipping attackers in front of the coordinate-wise median::

    >>> from lightning_fed.callbacks import FedAvg
    >>> from lightning_fed.server.aggregators import CoordinateMedian
    >>> FedAvg(aggregators=[MaliciousClients(0.2, attack="sign_flip", seed=0), CoordinateMedian()]).aggregators
    [MaliciousClients(fraction=0.2, attack='sign_flip', scale=None, seed=0), CoordinateMedian()]
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from lightning_fed.checks import check_int
from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage

__all__ = ["ATTACKS", "LabelFlip", "MaliciousClients", "choose_malicious_clients", "flip_client_labels"]

#: The update attacks of :class:`MaliciousClients`.
ATTACKS = ("sign_flip", "scale", "gaussian")

# Stream tags, so that the attack draws never share a random stream with the data module's draws.
_SELECT_TAG = 0xA77AC
_NOISE_TAG = 0x6A055


def _check_fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
        raise ValueError(f"`fraction` must be a number in [0, 1], got {value!r}.")
    return float(value)


def num_malicious(fraction: float, num_clients: int) -> int:
    """⌊fraction·K⌋ for K = ``num_clients``; fraction·K is rounded to 9 decimals first, so that e.g.
    0.29·100 (28.999999999999996 in floating point) counts 29."""
    return int(math.floor(round(fraction * num_clients, 9)))


def choose_malicious_clients(num_clients: int, fraction: float, seed: int = 0) -> np.ndarray:
    """A fixed set of ⌊fraction·N⌋ malicious clients out of ``num_clients`` = N, uniform without replacement, a pure
    function of ``seed``; sorted int64 ids ``[⌊fraction·N⌋]``. For data poisoning (:class:`LabelFlip`), where the
    malicious clients are the same every round.

    A ``fraction`` > 0 that gives 0 clients is warned about (the attack would do nothing).

    Raises:
        ValueError: ``fraction`` outside [0, 1], ``num_clients`` not an integer >= 0, or a negative ``seed``.

    Example::

        >>> choose_malicious_clients(10, 0.3, seed=0).size
        3
    """
    fraction = _check_fraction(fraction)
    seed = check_int("seed", seed, 0)
    size = num_malicious(fraction, check_int("num_clients", num_clients, 0))
    if fraction > 0 and size == 0:
        rank_zero_warn(
            f"choose_malicious_clients: `fraction`={fraction:g} of {int(num_clients)} clients is ⌊fraction·N⌋ = 0 "
            "malicious clients: the attack does nothing."
        )
    rng = np.random.default_rng([seed, _SELECT_TAG])
    chosen = rng.choice(int(num_clients), size=size, replace=False)
    return np.sort(chosen).astype(np.int64)


class MaliciousClients(Stage):
    """Simulated Byzantine clients: in every round, ⌊fraction·K⌋ of the K clients that report an update are
    malicious and send an attacked update in place of their honest Δ_i.

    Attacks (``attack``):

    * ``"sign_flip"`` — Δ_i → −Δ_i (the sign-flipping attack, e.g. Damaskinos et al. 2018; Fang et al. 2020);
      ``scale`` must be left ``None``.
    * ``"scale"`` — Δ_i → ``scale``·Δ_i (a scaled / boosted update, e.g. ``scale=-10`` or ``100``; Bhagoji et al.
      2019 "explicit boosting", Bagdasaryan et al. 2020 "model replacement").
    * ``"gaussian"`` — Δ_i → N(0, ``scale``²·I), independent of Δ_i (the Gaussian Byzantine workers of
      Blanchard et al. 2017, Sec. 5).

    Which clients: the sorted client ids of the round are sampled uniformly without replacement by
    ``numpy.random.default_rng([seed, tag, round_idx])`` — deterministic by ``(seed, round_idx)`` and the cohort,
    independent of the order the updates arrive in, and fresh every round (a different malicious subset per round,
    as "a fraction of clients per round"). The Gaussian noise of client i in round t is drawn from a generator seeded
    by ``(seed, t, i)``. ``info.round_idx`` is the round t given by the server optimizer.

    Place it first in the chain (it is a ``"transform"``), before the reducer it is meant to test. It keeps no state.
    A ``fraction`` > 0 that gives no attacker in any round (⌊fraction·C⌋ = 0 for ``clients_per_round`` C) is warned
    about once at fit start (:meth:`check_cohort`).
    The counts (sample weights) of malicious clients are left as reported.

    Args:
        fraction: In [0, 1]; ⌊fraction·K⌋ clients per round are malicious (:func:`num_malicious`).
        attack: ``"sign_flip"`` (default), ``"scale"`` or ``"gaussian"``.
        scale: ``"scale"``: the finite factor (required); ``"gaussian"``: the noise standard deviation σ > 0
            (required, in the parameters' units); ``"sign_flip"``: must be ``None``.
        seed: Integer >= 0 (default 0).

    Raises:
        ValueError: naming the argument: ``fraction`` outside [0, 1], an unknown ``attack``, a missing / invalid /
            superfluous ``scale``, a negative ``seed``.

    Example: 2 of 4 clients flip their sign (which ones is fixed by the seed and the round)::

        >>> import torch
        >>> from lightning_fed.server.aggregators import ClientDeltas, EmptyState, RoundInfo
        >>> stage = MaliciousClients(0.5, attack="sign_flip", seed=0)
        >>> x = ClientDeltas([10, 11, 12, 13], [[torch.tensor([1.0])] for _ in range(4)], torch.ones(4, dtype=torch.float64))
        >>> bad = stage.malicious_ids([10, 11, 12, 13], round_idx=0)
        >>> len(bad)
        2
        >>> y, _ = stage.apply(x, EmptyState(), RoundInfo(0, 0, 4, 4))
        >>> [d[0].item() for d in y.deltas] == [-1.0 if c in bad else 1.0 for c in [10, 11, 12, 13]]
        True
        >>> MaliciousClients(0.2, attack="scale")
        Traceback (most recent call last):
        ...
        ValueError: `scale` is required for attack='scale' (a finite factor, e.g. -10 or 100).
    """

    kind = "transform"

    def __init__(self, fraction: float, attack: str = "sign_flip", scale: Optional[float] = None, seed: int = 0) -> None:
        self.fraction = _check_fraction(fraction)
        if attack not in ATTACKS:
            raise ValueError(f"`attack` must be one of {ATTACKS}, got {attack!r}.")
        self.attack = attack
        if attack == "sign_flip":
            if scale is not None:
                raise ValueError("`scale` must be None for attack='sign_flip' (it sends −Δ); use attack='scale'.")
        else:
            if scale is None:
                hint = "a finite factor, e.g. -10 or 100" if attack == "scale" else "the noise standard deviation > 0"
                raise ValueError(f"`scale` is required for attack={attack!r} ({hint}).")
            if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
                raise ValueError(f"`scale` must be a finite number, got {scale!r}.")
            if attack == "gaussian" and scale <= 0:
                raise ValueError(f"`scale` (the noise standard deviation) must be > 0 for attack='gaussian', got {scale!r}.")
            scale = float(scale)
        self.scale = scale
        self.seed = check_int("seed", seed, 0)

    def check_cohort(self, clients_per_round: int) -> None:
        """Warn (once, at fit start) when ``fraction`` > 0 gives ⌊fraction·C⌋ = 0 malicious clients for C =
        ``clients_per_round`` (so in every round, K ≤ C): the simulated attack would do nothing."""
        super().check_cohort(clients_per_round)
        c = int(clients_per_round)
        if self.fraction > 0 and num_malicious(self.fraction, c) == 0:
            rank_zero_warn(
                f"MaliciousClients with `fraction`={self.fraction:g} and `clients_per_round`={c} makes "
                f"⌊{self.fraction:g}·K⌋ = 0 malicious clients in every round (K ≤ {c}): the attack does nothing. "
                f"One attacker per round needs `fraction` >= 1/{c}."
            )

    def malicious_ids(self, client_ids: Sequence[int], round_idx: int) -> list[int]:
        """The malicious clients among ``client_ids`` in round ``round_idx``: ⌊fraction·K⌋ ids, sorted."""
        ids = sorted(int(c) for c in client_ids)
        rng = np.random.default_rng([self.seed, _SELECT_TAG, int(round_idx)])
        chosen = rng.choice(len(ids), size=num_malicious(self.fraction, len(ids)), replace=False)
        return sorted(ids[i] for i in chosen)

    def _attack(self, delta: list[Tensor], client_id: int, round_idx: int) -> list[Tensor]:
        if self.attack == "sign_flip":
            return [-d for d in delta]
        if self.attack == "scale":
            return [d * self.scale for d in delta]
        g = torch.Generator().manual_seed(
            int(np.random.default_rng([self.seed, _NOISE_TAG, int(round_idx), int(client_id)]).integers(2**63 - 1))
        )
        return [
            (torch.randn(d.shape, generator=g, dtype=torch.float64) * self.scale).to(dtype=d.dtype, device=d.device)
            for d in delta
        ]

    def apply(self, x: ClientDeltas, state: NamedTuple, info: RoundInfo) -> tuple[ClientDeltas, NamedTuple]:
        bad = set(self.malicious_ids(x.client_ids, info.round_idx))
        deltas = [
            self._attack(delta, cid, info.round_idx) if cid in bad else delta
            for cid, delta in zip(x.client_ids, x.deltas)
        ]
        return x._replace(client_ids=list(x.client_ids), deltas=deltas), state


def _readable_labels(dataset: Any) -> Optional[Tensor]:
    """Every label of ``dataset`` without reading its samples (its ``targets``, or a ``TensorDataset``'s second
    tensor), as a tensor whose first dimension is ``len(dataset)``; ``None`` when not available or not integer."""
    if hasattr(dataset, "targets"):
        labels = dataset.targets
    elif isinstance(dataset, TensorDataset) and len(dataset.tensors) >= 2:
        labels = dataset.tensors[1]
    else:
        return None
    if not isinstance(labels, Tensor):
        array = np.asarray(labels)
        if array.dtype.kind not in "iub":
            return None
        labels = torch.from_numpy(array.astype(np.int64))
    if labels.is_floating_point() or labels.is_complex() or labels.ndim == 0 or len(labels) != len(dataset):
        return None
    return labels


class LabelFlip(Dataset):
    """A dataset whose samples at ``indices`` have their label flipped y → C − 1 − y (the label-flipping data
    poisoning attack, e.g. Fang et al. 2020, Sec. 5; Tolpegin et al. 2020); the others are returned unchanged.

    The wrapped dataset yields ``(x, y)`` pairs with integer class labels y in [0, C). Slicing is kept: for a
    ``TensorDataset`` or a dataset with ``get_batch(index)``, :meth:`get_batch` returns the flipped batch, so the
    federated loop's fast path (``TensorBatches``) still applies. ``targets`` (if the wrapped dataset has it) stays
    the *true* labels, so label-based partitioners and evaluation see the clean data.

    ``num_classes`` is checked against the labels when the wrapper is built (before any training): the labels of
    the samples to flip must lie in [0, C), and where all labels are known without reading the samples (the
    dataset's ``targets``, or a ``TensorDataset``'s second tensor) C must be their number of classes: ``len(classes)``
    when the dataset has a ``classes`` attribute, else the largest label + 1. Other datasets have the samples to
    flip read once here (``dataset[i][1]``).

    Args:
        dataset: The map-style dataset of ``(x, y)`` pairs.
        indices: Indices into ``dataset`` whose labels are flipped (e.g. all samples of the malicious clients;
            :func:`flip_client_labels`).
        num_classes: C >= 2, the number of classes of the labels.

    Raises:
        ValueError: naming ``num_classes``: not an integer >= 2, a label to flip outside [0, C), or (labels known)
            C other than the labels' number of classes; an index outside [0, len(dataset)).

    Example::

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> ds = LabelFlip(TensorDataset(torch.zeros(4, 1), torch.tensor([0, 1, 2, 3])), indices=[1, 3], num_classes=4)
        >>> [int(ds[i][1]) for i in range(4)]
        [0, 2, 2, 0]
        >>> ds.get_batch(torch.tensor([0, 1, 3]))[1]
        tensor([0, 2, 0])
    """

    def __init__(self, dataset: Any, indices: Sequence[int], num_classes: int) -> None:
        self.num_classes = check_int("num_classes", num_classes, 2)
        self.dataset = dataset
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(dataset)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"`indices` must lie in [0, {n}) (indices into `dataset`), got {int(idx.min())}..{int(idx.max())}.")
        self.flipped = torch.zeros(n, dtype=torch.bool)
        self.flipped[torch.from_numpy(idx)] = True
        self._check_num_classes(np.unique(idx))
        if hasattr(dataset, "targets"):
            self.targets = dataset.targets

    def _check_num_classes(self, idx: np.ndarray) -> None:
        """Refuse a ``num_classes`` that does not fit the labels, now rather than in the poisoned clients' training
        (where the error, or the model's on a flipped label it has no class for, would drop them from every
        round)."""
        c = self.num_classes
        labels = _readable_labels(self.dataset)
        if labels is not None:
            flipped = [(int(i), labels[int(i)]) for i in idx]
        else:  # labels known only when read: read the samples that will be flipped
            flipped = [(int(i), torch.as_tensor(self.dataset[int(i)][1])) for i in idx]
        for i, y in flipped:
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= c):
                bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
                raise ValueError(
                    f"LabelFlip: a label outside [0, {c}) (`num_classes`): `num_classes`={c} but sample {i}, to be "
                    f"flipped, has label {bad}; give the number of classes C of the labels."
                )
        if labels is not None and labels.numel():
            declared = getattr(self.dataset, "classes", None)
            classes = len(declared) if declared is not None else int(labels.max()) + 1
            if c != classes:
                source = "the dataset's `classes`" if declared is not None else f"largest label {int(labels.max())}"
                raise ValueError(
                    f"`num_classes`={c} but the labels hold {classes} classes ({source}): the flip y -> C - 1 - y "
                    f"needs C = {classes} (a larger C sends labels to classes that do not exist, and the poisoned "
                    "clients fail in training; a smaller one flips within the wrong range). A data set missing its "
                    "top classes declares them all in a `classes` attribute."
                )

    def __len__(self) -> int:
        return len(self.dataset)

    def _flip(self, y: Any) -> Any:
        t = torch.as_tensor(y)
        if ((t < 0) | (t >= self.num_classes)).any():
            raise ValueError(f"LabelFlip: a label outside [0, {self.num_classes}) (`num_classes`): {t.tolist()}.")
        flipped = self.num_classes - 1 - t
        return flipped if isinstance(y, Tensor) else type(y)(flipped.item())

    def __getitem__(self, i: int) -> Any:
        x, y = self.dataset[i]
        return (x, self._flip(y)) if bool(self.flipped[int(i)]) else (x, y)

    def get_batch(self, index: Tensor) -> tuple:
        """``(x, y)`` of the samples ``index`` (LongTensor ``[B]``), labels flipped where marked; the wrapped dataset
        must be a ``TensorDataset`` or have ``get_batch``.

        Raises:
            TypeError: the wrapped dataset cannot be sliced.
        """
        base = getattr(self.dataset, "get_batch", None)
        if base is not None:
            x, y = base(index)
        elif isinstance(self.dataset, TensorDataset):
            x, y = (t[index] for t in self.dataset.tensors)
        else:
            raise TypeError(f"LabelFlip.get_batch needs a TensorDataset or a dataset with get_batch, got {type(self.dataset).__name__}.")
        mask = self.flipped[index.cpu()].to(y.device)
        if mask.any():
            y = y.clone()
            y[mask] = self._flip(y[mask])
        return x, y


def flip_client_labels(datamodule: Any, malicious_clients: Sequence[int], num_classes: int) -> LabelFlip:
    """Poison the data of ``malicious_clients``: wrap ``datamodule.train_dataset`` in a :class:`LabelFlip` over all
    their samples (``datamodule.client_indices``) and install it. Call after ``datamodule.setup()`` (the partition
    is computed on the clean labels) and before training; returns the wrapper.

    With ``eval_fraction`` the clients' held-out evaluation samples are not flipped and stay the central and
    federated evaluation data (``client_eval_dataset`` keeps the clean dataset).

    Raises:
        RuntimeError: the data module is not set up.
        ValueError: a client id outside [0, num_clients), or as :class:`LabelFlip` (e.g. a ``num_classes`` that does
            not fit the labels); nothing is installed then.
    """
    n = datamodule.num_clients  # raises RuntimeError before setup
    ids = [int(c) for c in malicious_clients]
    bad = [c for c in ids if not 0 <= c < n]
    if bad:
        raise ValueError(f"`malicious_clients` must be client ids in [0, {n}), got {bad}.")
    if not ids:
        rank_zero_warn("flip_client_labels with no malicious clients flips no label: the attack does nothing.")
    indices = np.concatenate([datamodule.client_indices(c) for c in ids]) if ids else np.zeros(0, dtype=np.int64)
    wrapper = LabelFlip(datamodule.train_dataset, indices, num_classes)
    datamodule.train_dataset = wrapper
    return wrapper
