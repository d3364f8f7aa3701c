"""The results of a federated evaluation (issue #52: moved out of ``evaluation.py``): the statistics over clients
(``fed_<m>/<stat>``: :func:`federated_statistics`), the per-client table of one evaluation
(:class:`ClientEvaluation`) and its ``eval_csv`` file (:func:`check_eval_csv`; a resumed run keeps the rows of the
rounds before its own). Every name stays importable from :mod:`lightning_fed.evaluation`.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

#: The statistics logged per metric, ``fed_<metric>/<stat>``.
FED_STATISTICS = ("weighted", "mean", "p10", "p50", "p90", "worst10")
#: Name fragments of metrics that fall as the model improves (their worst clients are the highest values).
LOWER_IS_BETTER = ("loss", "err", "perplexity", "ppl", "mse", "mae", "rmse", "nll")


def lower_is_better(name: str) -> bool:
    """Whether metric ``name`` falls as the model improves (contains one of :data:`LOWER_IS_BETTER`,
    case-insensitively)."""
    lowered = name.lower()
    return any(fragment in lowered for fragment in LOWER_IS_BETTER)


def federated_statistics(values: Sequence[float], samples: Sequence[float], lower_better: bool) -> dict[str, float]:
    """The statistics of :data:`FED_STATISTICS` of one metric over K clients.

    Args:
        values: The metric of each client, ``[K]``.
        samples: Each client's number of evaluation samples n_i, ``[K]`` (the weights of ``weighted``).
        lower_better: The worst clients are the highest values (a loss) rather than the lowest (an accuracy).

    Returns:
        ``{"weighted": Σn_i m_i/Σn_i, "mean", "p10", "p50", "p90" (np.percentile, method "linear"),
        "worst10": mean of the worst ⌈0.1·K⌉ values}``, as Python floats (float64 arithmetic).

    Raises:
        ValueError: no clients, or ``values`` and ``samples`` of different lengths.
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(samples, dtype=np.float64)
    if v.size == 0 or v.shape != w.shape:
        raise ValueError(f"`values` and `samples` must be non-empty and of equal length, got {v.shape} and {w.shape}.")
    p10, p50, p90 = np.percentile(v, [10, 50, 90])
    worst = math.ceil(0.1 * v.size)
    ordered = np.sort(v)
    tail = ordered[-worst:] if lower_better else ordered[:worst]
    return {
        "weighted": float((w * v).sum() / w.sum()),
        "mean": float(v.mean()),
        "p10": float(p10),
        "p50": float(p50),
        "p90": float(p90),
        "worst10": float(tail.mean()),
    }


@dataclass
class ClientEvaluation:
    """Per-client results of one federated evaluation.

    Attributes:
        round: The round (``trainer.current_epoch``) the global model was evaluated at.
        client_ids: int64 ``[K]``; samples: int64 ``[K]`` evaluation samples per client.
        metrics: ``{name: float64 [K]}``, what ``validation_step`` logged, per client.
        personalized: the same after ``eval_local_steps`` local steps (empty when off).
        dropped: ``(client id, reason)`` of the clients dropped from the evaluation (they raised or ran past
            ``client_timeout_s``); not in ``client_ids``.
        personal: the same for each client's personal model — the global model with the client's own state in the
            parts a personalised method keeps local (:class:`~lightning_fed.client.personal.LocalParts`: FedBN,
            FedPer, FedRep); empty without such a method. Logged as ``fed_personal_<m>/<stat>``.
        personal_ids: The clients :attr:`personal` covers, int64 ``[K']`` (``None``: all of ``client_ids``; fewer
            when the data module's ``eval_personal_untrained="exclude"`` left never-trained clients out).

    Example (sample-weighted mean, unweighted mean, NumPy's linear percentiles, mean of the worst ⌈10 %⌉)::

        >>> import numpy as np
        >>> ev = ClientEvaluation(round=0, client_ids=np.array([0, 1, 2]), samples=np.array([10, 30, 60]),
        ...                       metrics={"val_acc": np.array([0.5, 0.7, 0.9])})
        >>> stats = ev.statistics()
        >>> round(stats["fed_val_acc/weighted"], 4)  # (10·0.5 + 30·0.7 + 60·0.9) / 100
        0.8
        >>> [round(stats[f"fed_val_acc/{s}"], 4) for s in ("mean", "p10", "p50", "p90", "worst10")]
        [0.7, 0.54, 0.7, 0.86, 0.5]
    """

    round: int
    client_ids: np.ndarray
    samples: np.ndarray
    metrics: dict[str, np.ndarray]
    personalized: dict[str, np.ndarray] = field(default_factory=dict)
    dropped: list[tuple[int, str]] = field(default_factory=list)
    personal: dict[str, np.ndarray] = field(default_factory=dict)
    personal_ids: Optional[np.ndarray] = None

    def _covered(self, prefix: str) -> np.ndarray:
        """Positions in :attr:`client_ids` of the clients the table ``prefix`` covers."""
        if prefix != "fed_personal_" or self.personal_ids is None:
            return np.arange(len(self.client_ids))
        return np.flatnonzero(np.isin(self.client_ids, self.personal_ids))

    def statistics(self) -> dict[str, float]:
        """``{"fed_<m>/<stat>": value}``, ``{"fed_personalized_<m>/<stat>": value}`` and
        ``{"fed_personal_<m>/<stat>": value}`` for every metric."""
        out: dict[str, float] = {}
        for prefix, table in self.tables():
            samples = self.samples[self._covered(prefix)]
            for name, values in table.items():
                for stat, value in federated_statistics(values, samples, lower_is_better(name)).items():
                    out[f"{prefix}{name}/{stat}"] = value
        return out

    def logged_statistics(self) -> dict[str, float]:
        """What :class:`FederatedEvaluation` logs: :meth:`statistics` and, when no personalised method gave the
        clients personal models (:attr:`personal` empty), ``fed_personal_<m>/<stat>`` equal to ``fed_<m>/<stat>``:
        without one, each client's personal model *is* the global model. So every method with federated evaluation
        logs the ``fed_personal_`` family, and one tag (``fed_personal_val_acc/weighted``) compares FedAvg, FedAdam,
        ... with FedBN, FedPer, FedRep and Ditto in TensorBoard's HParams table. Only the scalars are shared: the
        histograms and ``eval_csv``'s ``personal_<m>`` columns stay those of personalised methods.

        >>> ev = ClientEvaluation(round=0, client_ids=np.array([0, 1]), samples=np.array([1, 3]),
        ...                       metrics={"val_acc": np.array([0.2, 0.6])})
        >>> stats = ev.logged_statistics()
        >>> round(stats["fed_personal_val_acc/weighted"], 4), round(stats["fed_val_acc/weighted"], 4)  # (0.2 + 1.8) / 4
        (0.5, 0.5)
        """
        out = self.statistics()
        if not self.personal and self.personal_ids is None:
            for name in self.metrics:
                for stat in FED_STATISTICS:
                    out[f"fed_personal_{name}/{stat}"] = out[f"fed_{name}/{stat}"]
        return out

    def tables(self) -> list[tuple[str, dict[str, np.ndarray]]]:
        """``(prefix, table)`` of the global model's, the fine-tuned (``fed_personalized_``) and the personal models'
        (``fed_personal_``) metrics."""
        return [("fed_", self.metrics), ("fed_personalized_", self.personalized), ("fed_personal_", self.personal)]

    def write_csv(self, path: str, append: bool = False) -> None:
        """Rows ``round, client_id, samples, <metrics...>, personalized_<metrics...>, personal_<metrics...>`` (header
        unless appending to an existing file; ``personal_`` columns only with a personalised method)."""
        names = sorted(self.metrics)
        pnames = sorted(self.personalized)
        onames = sorted(self.personal)
        exists = append and os.path.exists(path)
        with open(path, "a" if append else "w", newline="") as f:
            writer = csv.writer(f)
            if not exists:
                writer.writerow(["round", "client_id", "samples", *names, *(f"personalized_{n}" for n in pnames),
                                 *(f"personal_{n}" for n in onames)])
            personal_at = {int(i): j for j, i in enumerate(self._covered("fed_personal_"))}
            for i, cid in enumerate(self.client_ids.tolist()):
                row = [self.round, cid, int(self.samples[i])]
                row += [repr(float(self.metrics[n][i])) for n in names]
                row += [repr(float(self.personalized[n][i])) for n in pnames]
                row += [repr(float(self.personal[n][personal_at[i]])) if i in personal_at else "" for n in onames]
                writer.writerow(row)


def check_eval_csv(path: Any) -> str:
    """Check ``eval_csv`` before anything trains: create its missing parent folder (as Lightning's loggers do for
    their ``save_dir``) and make sure the file can be written; its content is left as it is.

    Args:
        path: The ``eval_csv`` path (``str`` or ``os.PathLike``).

    Returns:
        ``path`` as a ``str``.

    Raises:
        ValueError: naming ``eval_csv``, when the path is a directory, its folder cannot be created (e.g. a file
            stands where a folder is needed) or the file cannot be opened for writing.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ValueError(f"`eval_csv={path!r}` is a directory; give the path of a CSV file, e.g. {path!r} + '/clients.csv'.")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        existed = os.path.exists(path)
        with open(path, "a", newline=""):
            pass
        if not existed:
            os.remove(path)
    except OSError as error:
        raise ValueError(f"`eval_csv={path!r}` cannot be written: {type(error).__name__}: {error}.") from error
    return path


def _read_csv_rows_before(path: str, round_idx: int) -> Optional[tuple[list[str], list[list[str]]]]:
    """``(header, rows)`` of an ``eval_csv`` file, keeping only the rows of rounds before ``round_idx``; ``None``
    when the file is absent or empty."""
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return None
    header, body = rows[0], rows[1:]
    try:
        return header, [r for r in body if r and int(r[0]) < round_idx]
    except ValueError as error:
        raise ValueError(
            f"`eval_csv={path!r}` exists but is not a federated-evaluation table (a row whose first column is not a "
            f"round: {error}); give another path or remove the file."
        ) from error
