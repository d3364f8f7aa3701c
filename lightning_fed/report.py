"""``lightning-fed report RUNS...``: the results of finished runs out of their logs, without a hand-written script.

A *run* is a folder holding TensorBoard event files (``events.out.tfevents.*``), e.g.
``runs/lightning_logs/version_3``; each ``RUNS`` argument is such a folder or one above it (every folder below it with
event files is a run). The scalars are read with TensorBoard's own ``EventAccumulator``; the TensorBoard step is the
round (counted from 0, as the fit logs it); a value logged twice at one round (a resumed run) counts once, the
last one written.

For every chosen metric (``--metrics``; default: every validation metric logged, ``val_*`` and the federated
evaluation's ``fed_val_*`` / ``fed_personal*_val_*``) and every run it gives the **final** value (at the run's last
round with a value) and the **best** value with the first round it was reached. Best is the minimum for a metric
whose name contains ``loss`` and the maximum for every other one (``--minimize`` / ``--maximize NAME...`` override it).

Runs are **grouped** when their settings are equal except their seeds, and each group gets the mean ± standard
deviation over its runs (sample standard deviation, ``ddof=1``; none for a group of one; ``n`` is shown). A run's
settings are its ``config.yaml`` (saved by ``lightning-fed fit`` next to the event files), else the run's TensorBoard
HParams session (written at fit start by :func:`lightning_fed.tensorboard.log_federated_hparams`), else its
``hparams.yaml``. A seed is a setting whose last name part (``a.b.seed``, ``partitioner/seed``) is ``seed``, starts
with ``seed_`` or ends with ``_seed``: ``seed_everything``, ``data.init_args.seed`` (cohorts, local work, data
order), the partitioner's and local work's ``seed``, a model's ``init_seed``; in the HParams session ``seed``,
``global_seed``, ``partitioner/seed``, ``local_work/seed``. ``--ignore KEY...`` leaves more settings (and the
settings below them, e.g. ``trainer.logger``) out of the comparison.

``--csv PATH`` writes one row per run and one per group; ``--plot PATH`` draws each metric against the round (one
panel per metric; ``--plot_by group``, the default: each group's mean over its runs with a ± one standard deviation
band at the rounds all its runs logged, a group of one as its run's line; ``--plot_by run``: a line per run),
with matplotlib's Agg canvas (no display needed).

Example::

    lightning-fed report runs/lightning_logs --metrics val_acc fed_val_acc/weighted --csv results.csv --plot curves.png
"""

from __future__ import annotations

import csv
import difflib
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import numpy as np

__all__ = [
    "Group",
    "Report",
    "ReportError",
    "Run",
    "find_runs",
    "format_report",
    "group_runs",
    "is_minimized",
    "is_seed_key",
    "load_run",
    "plot_report",
    "report",
    "report_command",
    "validation_metrics",
    "write_csv",
]

#: Exit status of ``lightning-fed report`` for a bad argument (a folder without event files, an unknown metric).
EXIT_BAD_ARGUMENT = 2

_VALIDATION_RE = re.compile(r"^(fed_(personalized_|personal_)?)?val_")
_SEED_RE = re.compile(r"(^seed$)|(^seed_)|(_seed$)")
_EVENT_FILE = "tfevents"


class ReportError(ValueError):
    """A bad argument of :func:`report` (a folder without event files, an unknown metric); its message names the
    argument and what is allowed. ``lightning-fed report`` prints it as ``error: ...`` (exit status 2).

    >>> try:
    ...     report(["no/such/folder"])
    ... except ReportError as err:
    ...     print(err)
    RUNS no/such/folder: no such folder
    """


def is_seed_key(key: str) -> bool:
    """Whether the setting ``key`` is a seed: its last part (split at ``.`` and ``/``) is ``seed``, starts with
    ``seed_`` or ends with ``_seed``.

    Example::

        >>> [k for k in ("seed_everything", "data.init_args.seed", "partitioner/seed", "global_seed",
        ...              "model.init_args.init_seed", "model.init_args.lr", "seeds") if is_seed_key(k)]
        ['seed_everything', 'data.init_args.seed', 'partitioner/seed', 'global_seed', 'model.init_args.init_seed']
    """
    return bool(_SEED_RE.search(re.split(r"[./]", key)[-1]))


def is_minimized(metric: str, minimize: Iterable[str] = (), maximize: Iterable[str] = ()) -> bool:
    """Whether the best value of ``metric`` is its minimum: named in ``minimize``, or its name contains ``loss``
    and it is not named in ``maximize``.

    >>> is_minimized("fed_val_loss/worst10"), is_minimized("val_acc"), is_minimized("val_ppl", minimize=["val_ppl"])
    (True, False, True)
    """
    if metric in set(minimize):
        return True
    if metric in set(maximize):
        return False
    return "loss" in metric


def validation_metrics(tags: Iterable[str]) -> list[str]:
    """The validation metrics among scalar ``tags`` (``val_*``, ``fed_val_*``, ``fed_personalized_val_*``,
    ``fed_personal_val_*``): the global model's ``val_*`` first, then the federated evaluation's, each by name.

    >>> validation_metrics(["round_train_loss", "fed_val_acc/weighted", "val_loss", "val_acc", "fed_eval_clients"])
    ['val_acc', 'val_loss', 'fed_val_acc/weighted']
    """
    found = {t for t in tags if _VALIDATION_RE.match(t)}
    return sorted(found, key=lambda t: (t.startswith("fed_"), t))


@dataclass
class Run:
    """One run's logged scalars and settings.

    Attributes:
        path: the folder with the event files.
        name: the name shown (the path below the folder common to all runs of the report).
        curves: ``{tag: (rounds, values)}``, int64 and float64 arrays of equal length, rounds increasing.
        settings: the run's settings, flat (``{"model.init_args.lr": 0.1, ...}``), from ``settings_source``.
        settings_source: ``"config.yaml"``, ``"hparams session"``, ``"hparams.yaml"`` or ``"none"``.

    >>> run = Run(path="runs/version_0", name="version_0", settings={"seed": 1, "model/lr": 0.1},
    ...           curves={"val_loss": (np.array([0, 1, 2]), np.array([0.9, 0.5, 0.6]))},
    ...           settings_source="hparams session")
    >>> run.seeds
    {'seed': 1}
    >>> run.summary("val_loss", minimize=True)
    {'final': 0.6, 'final_round': 2, 'best': 0.5, 'best_round': 1}
    """

    path: str
    name: str
    curves: dict[str, tuple[np.ndarray, np.ndarray]]
    settings: dict[str, Any]
    settings_source: str

    @property
    def seeds(self) -> dict[str, Any]:
        """The run's seed settings (:func:`is_seed_key`)."""
        return {k: v for k, v in self.settings.items() if is_seed_key(k)}

    def summary(self, metric: str, minimize: bool) -> Optional[dict[str, Any]]:
        """``{"final", "final_round", "best", "best_round"}`` of ``metric`` (the first round reaching the best; NaN
        values are skipped for the best), or ``None`` when this run did not log it."""
        if metric not in self.curves:
            return None
        rounds, values = self.curves[metric]
        if not len(values):
            return None
        finite = ~np.isnan(values)
        if finite.any():
            masked = np.where(finite, values, np.inf if minimize else -np.inf)
            i = int(np.argmin(masked) if minimize else np.argmax(masked))
            best, best_round = float(values[i]), int(rounds[i])
        else:
            best, best_round = math.nan, None
        return {"final": float(values[-1]), "final_round": int(rounds[-1]), "best": best, "best_round": best_round}


@dataclass
class Group:
    """Runs with equal settings except their seeds.

    Attributes:
        name: ``"group 1"``, ``"group 2"``, ... in the order of their first runs.
        runs: the runs, in the report's order.
        label: the settings that tell this group from the others (``"key=value, ..."``; ``""`` for a single group).

    >>> runs = [Run(f"v{i}", f"v{i}", {"val_acc": (np.array([0, 1]), np.array(acc))}, {"seed": i}, "config.yaml")
    ...         for i, acc in enumerate(([0.5, 0.7], [0.6, 0.9]))]
    >>> summary = Group("group 1", runs).summary("val_acc", minimize=False)
    >>> {k: round(v, 4) for k, v in summary.items()}  # mean and std (ddof=1) of 0.7 and 0.9
    {'n': 2, 'final': 0.8, 'final_std': 0.1414, 'final_round': 1, 'best': 0.8, 'best_std': 0.1414}
    """

    name: str
    runs: list[Run]
    label: str = ""

    def summary(self, metric: str, minimize: bool) -> Optional[dict[str, Any]]:
        """Mean and sample standard deviation (``ddof=1``; NaN for one run) of the runs' final and best values of
        ``metric`` over the ``n`` runs that logged it; ``final_round`` is their common last round (``None`` when
        they differ). ``None`` when no run of the group logged it."""
        rows = [s for s in (r.summary(metric, minimize) for r in self.runs) if s is not None]
        if not rows:
            return None
        final = np.array([s["final"] for s in rows], dtype=np.float64)
        best = np.array([s["best"] for s in rows], dtype=np.float64)
        n = len(rows)
        rounds = {s["final_round"] for s in rows}
        return {
            "n": n,
            "final": float(final.mean()),
            "final_std": float(final.std(ddof=1)) if n > 1 else math.nan,
            "final_round": rounds.pop() if len(rounds) == 1 else None,
            "best": float(best.mean()),
            "best_std": float(best.std(ddof=1)) if n > 1 else math.nan,
        }


@dataclass
class Report:
    """What :func:`report` read: the runs, their groups, the metrics and which of them are minimised, and
    ``text``, the table ``lightning-fed report`` prints (:func:`report` builds one).

    >>> run = Run("v0", "v0", {"val_acc": (np.array([0, 1]), np.array([0.5, 0.7]))}, {"seed": 0}, "config.yaml")
    >>> print(format_report(Report(runs=[run], groups=group_runs([run]), metrics=["val_acc"],
    ...                            minimized={"val_acc": False})))
    1 run(s) in 1 group(s): runs with equal settings except their seeds are a group; mean ± std over a group's runs (std with ddof=1, n runs).
    group 1 (n=1)
      v0  [seed=0; settings from config.yaml]
    <BLANKLINE>
    val_acc (best = max)
      run / group  final  round  best  round
      v0             0.7      1   0.7      1
    """

    runs: list[Run]
    groups: list[Group]
    metrics: list[str]
    minimized: dict[str, bool]
    text: str = field(default="", repr=False)


# ------------------------------------------------------------------------------------------------ reading
def find_runs(paths: Sequence[str | os.PathLike]) -> list[str]:
    """The run folders (folders with a TensorBoard event file) at or below each of ``paths``, in order (sorted
    below each path; a folder found twice counts once).

    Raises:
        ReportError: a path that does not exist, is not a folder, or has no event file in it or below it.
    """
    found: list[str] = []
    seen: set[str] = set()
    for path in paths:
        path = os.fspath(path)
        if not os.path.exists(path):
            raise ReportError(f"RUNS {path}: no such folder")
        if not os.path.isdir(path):
            raise ReportError(f"RUNS {path}: not a folder (give a run's log folder, e.g. runs/lightning_logs/"
                              "version_0, or a folder above it)")
        here = []
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            if any(_EVENT_FILE in f for f in files):
                here.append(folder)
        if not here:
            raise ReportError(f"RUNS {path}: no TensorBoard event files (events.out.tfevents.*) in it or below it "
                              "(give a run's log folder, e.g. runs/lightning_logs/version_0, or a folder above it)")
        for folder in sorted(here):
            key = os.path.realpath(folder)
            if key not in seen:
                seen.add(key)
                found.append(folder)
    return found


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out if out or not prefix else {prefix: {}}
    return {prefix: value}


def _session_settings(accumulator: Any) -> Optional[dict[str, Any]]:
    """The run's HParams session (TensorBoard's ``session_start_info``), or ``None`` without one."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    try:
        content = accumulator.PluginTagToContent("hparams")
    except KeyError:
        return None
    for raw in content.values():
        data = plugin_data_pb2.HParamsPluginData.FromString(raw)
        if data.WhichOneof("data") != "session_start_info":
            continue
        out: dict[str, Any] = {}
        for name, value in sorted(data.session_start_info.hparams.items()):  # a protobuf map: no order of its own
            kind = value.WhichOneof("kind")
            v = getattr(value, kind) if kind else None
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            out[name] = v
        return out
    return None


def _read_settings(path: str, accumulator: Any) -> tuple[dict[str, Any], str]:
    import yaml

    config = os.path.join(path, "config.yaml")
    if os.path.isfile(config):
        with open(config) as f:
            return _flatten(yaml.safe_load(f) or {}), "config.yaml"
    session = _session_settings(accumulator)
    if session is not None:
        return session, "hparams session"
    hparams = os.path.join(path, "hparams.yaml")
    if os.path.isfile(hparams):
        with open(hparams) as f:
            return _flatten(yaml.safe_load(f) or {}), "hparams.yaml"
    return {}, "none"


def load_run(path: str | os.PathLike, name: Optional[str] = None) -> Run:
    """Read one run folder: every scalar curve (TensorBoard's ``EventAccumulator``, all values kept) and its
    settings (``config.yaml``, else the HParams session, else ``hparams.yaml``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = os.fspath(path)
    accumulator = EventAccumulator(path, size_guidance={"scalars": 0, "images": 1, "histograms": 1,
                                                        "compressedHistograms": 1, "audio": 1, "tensors": 1})
    accumulator.Reload()
    curves = {}
    for tag in accumulator.Tags().get("scalars", []):
        by_round: dict[int, float] = {}
        for event in accumulator.Scalars(tag):
            by_round[int(event.step)] = float(event.value)  # a round logged twice (a resume): the last one
        rounds = np.array(sorted(by_round), dtype=np.int64)
        curves[tag] = (rounds, np.array([by_round[int(r)] for r in rounds], dtype=np.float64))
    settings, source = _read_settings(path, accumulator)
    return Run(path=path, name=name if name is not None else path, curves=curves, settings=settings,
               settings_source=source)


def _run_names(paths: list[str]) -> list[str]:
    if len(paths) == 1:
        return [os.path.basename(os.path.normpath(paths[0])) or paths[0]]
    absolute = [os.path.abspath(p) for p in paths]
    common = os.path.commonpath(absolute)
    names = [os.path.relpath(p, common) for p in absolute]
    return [n if n != "." else p for n, p in zip(names, paths)]


def _comparable(settings: dict[str, Any], ignore: Sequence[str]) -> dict[str, str]:
    def ignored(key: str) -> bool:
        return is_seed_key(key) or any(key == i or key.startswith(i + ".") or key.startswith(i + "/") for i in ignore)

    return {k: repr(v) for k, v in settings.items() if not ignored(k)}


def group_runs(runs: Sequence[Run], ignore: Sequence[str] = ()) -> list[Group]:
    """Group ``runs`` whose settings are equal except the seeds (:func:`is_seed_key`) and the keys in ``ignore``
    (with the keys below them); groups are in the order of their first runs, named ``group 1``, ``group 2``, ...

    Each group's ``label`` lists the settings that differ between the groups, with this group's values (a
    setting a group lacks shows as ``-``).
    """
    keys: list[tuple] = []
    members: dict[tuple, list[Run]] = {}
    comparable, shown = {}, {}
    for run in runs:
        settings = _comparable(run.settings, ignore)
        key = (run.settings_source, tuple(sorted(settings.items())))
        comparable[key] = settings
        shown[key] = run.settings
        if key not in members:
            keys.append(key)
            members[key] = []
        members[key].append(run)
    differing = []
    if len(keys) > 1:
        every = sorted({k for key in keys for k in comparable[key]})
        differing = [k for k in every if len({comparable[key].get(k, "-") for key in keys}) > 1]
    groups = []
    for i, key in enumerate(keys):
        label = ", ".join(f"{k}={shown[key][k] if k in shown[key] else '-'}" for k in differing)
        if len({k[0] for k in keys}) > 1:
            label = f"settings from {key[0]}" + (f": {label}" if label else "")
        groups.append(Group(name=f"group {i + 1}", runs=members[key], label=label))
    return groups


# ------------------------------------------------------------------------------------------------ the report
def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return "nan" if math.isnan(value) else f"{value:.4g}"


def _mean_std(mean: float, std: float) -> str:
    return _fmt(mean) if math.isnan(std) else f"{_fmt(mean)} ± {_fmt(std)}"


def _seeds_text(run: Run) -> str:
    return ", ".join(f"{k}={v}" for k, v in run.seeds.items()) or "no seed setting"


def _table(rows: list[list[str]], right: Sequence[bool]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  " + "  ".join(cell.rjust(w) if right[c] else cell.ljust(w) for c, (cell, w) in
                             enumerate(zip(row, widths))).rstrip() for row in rows]


def format_report(result: Report) -> str:
    """The text ``lightning-fed report`` prints: the runs by group with their seeds, then a table per metric (each
    run's final and best value with their rounds, each group's mean ± std over its runs)."""
    groups = result.groups
    lines = [f"{len(result.runs)} run(s) in {len(groups)} group(s): runs with equal settings except their seeds "
             "are a group; mean ± std over a group's runs (std with ddof=1, n runs)."]
    for group in groups:
        lines.append(f"{group.name} (n={len(group.runs)})" + (f": {group.label}" if group.label else ""))
        for run in group.runs:
            lines.append(f"  {run.name}  [{_seeds_text(run)}; settings from {run.settings_source}]")
    for metric in result.metrics:
        rule = "min" if result.minimized[metric] else "max"
        lines += ["", f"{metric} (best = {rule})"]
        rows = [["run / group", "final", "round", "best", "round"]]
        for group in groups:
            for run in group.runs:
                s = run.summary(metric, result.minimized[metric])
                if s is None:
                    rows.append([run.name, "-", "", "-", ""])
                    continue
                rows.append([run.name, _fmt(s["final"]), str(s["final_round"]), _fmt(s["best"]),
                             "" if s["best_round"] is None else str(s["best_round"])])
            if len(groups) > 1 or len(group.runs) > 1:
                g = group.summary(metric, result.minimized[metric])
                if g is None:
                    rows.append([f"{group.name} (n=0)", "-", "", "-", ""])
                else:
                    rows.append([f"{group.name} (n={g['n']})", _mean_std(g["final"], g["final_std"]),
                                 "" if g["final_round"] is None else str(g["final_round"]),
                                 _mean_std(g["best"], g["best_std"]), ""])
        lines += _table(rows, right=[False, True, True, True, True])
    return "\n".join(lines)


def report(runs: Sequence[str | os.PathLike], metrics: Optional[Sequence[str]] = None,
           minimize: Sequence[str] = (), maximize: Sequence[str] = (), ignore: Sequence[str] = ()) -> Report:
    """Read run folders and summarise their metrics (the module's docstring has the rules).

    Args:
        runs: run folders, or folders above them (:func:`find_runs`).
        metrics: the scalar tags to report; default: every validation metric any run logged
            (:func:`validation_metrics`).
        minimize, maximize: metrics whose best is their minimum / maximum, overriding the rule (a name with
            ``loss`` is minimised, every other maximised).
        ignore: settings left out when runs are grouped (besides the seeds), with the settings below them.

    Returns:
        A :class:`Report`; ``.text`` is the printed table.

    Raises:
        ReportError: a folder without event files (:func:`find_runs`); a metric no run logged (naming the scalars
            the runs logged); no ``metrics`` given and no validation metric logged; a metric in both ``minimize``
            and ``maximize``.

    Example (two seeds of one setting, written with TensorBoard's ``SummaryWriter`` and a ``config.yaml`` each)::

        >>> import os, tempfile
        >>> from torch.utils.tensorboard import SummaryWriter
        >>> root = tempfile.mkdtemp()
        >>> for seed, accs in ((0, [0.5, 0.7, 0.6]), (1, [0.4, 0.6, 0.8])):
        ...     folder = os.path.join(root, f"version_{seed}")
        ...     with SummaryWriter(folder) as writer:
        ...         for step, acc in enumerate(accs):
        ...             writer.add_scalar("val_acc", acc, step)
        ...     with open(os.path.join(folder, "config.yaml"), "w") as f:
        ...         _ = f.write(f"seed_everything: {seed}\\nmodel:\\n  init_args: {{lr: 0.1}}\\n")
        >>> print(report([root]).text)
        2 run(s) in 1 group(s): runs with equal settings except their seeds are a group; mean ± std over a group's runs (std with ddof=1, n runs).
        group 1 (n=2)
          version_0  [seed_everything=0; settings from config.yaml]
          version_1  [seed_everything=1; settings from config.yaml]
        <BLANKLINE>
        val_acc (best = max)
          run / group            final  round             best  round
          version_0                0.6      2              0.7      1
          version_1                0.8      2              0.8      2
          group 1 (n=2)   0.7 ± 0.1414      2  0.75 ± 0.07071
    """
    both = sorted(set(minimize) & set(maximize))
    if both:
        raise ReportError(f"--minimize and --maximize both name {', '.join(both)}; name each metric in one")
    paths = find_runs(runs)
    loaded = [load_run(p, n) for p, n in zip(paths, _run_names(paths))]
    logged = sorted({t for r in loaded for t in r.curves})
    if metrics:
        metrics = list(dict.fromkeys(metrics))
        for metric in metrics:
            if metric not in logged:
                close = difflib.get_close_matches(metric, logged, n=3)
                hint = f" Did you mean {' or '.join(close)}?" if close else ""
                raise ReportError(f"--metrics {metric}: no run logged it.{hint} The runs logged: {', '.join(logged)}")
    else:
        metrics = validation_metrics(logged)
        if not metrics:
            raise ReportError("the runs logged no validation metric (val_*, fed_val_*); choose with --metrics from: "
                              + ", ".join(logged))
    for name, option in ((minimize, "--minimize"), (maximize, "--maximize")):
        unknown = [m for m in name if m not in metrics]
        if unknown:
            raise ReportError(f"{option} {' '.join(unknown)}: not a reported metric ({', '.join(metrics)})")
    minimized = {m: is_minimized(m, minimize, maximize) for m in metrics}
    result = Report(runs=loaded, groups=group_runs(loaded, ignore), metrics=list(metrics), minimized=minimized)
    result.text = format_report(result)
    return result


def write_csv(result: Report, path: str | os.PathLike) -> None:
    """Write ``result`` as CSV: one row per run (``kind`` ``run``) and one per group (``kind`` ``group``).

    Columns: ``kind``, ``name`` (the run's name or ``group N``), ``group``, ``n`` (runs; for a group the most runs
    that logged one of the metrics), ``settings`` (the group's label), ``seeds``, ``path`` (the run's folder), then
    for each metric ``M``: ``M/final``, ``M/final_round``, ``M/best``, ``M/best_round``, ``M/final_std``,
    ``M/best_std``. A group's ``M/final`` and ``M/best`` are the means over its runs, ``M/*_std`` their standard
    deviation (ddof=1; empty for one run), ``M/final_round`` the runs' common last round (empty if they differ),
    ``M/best_round`` empty. A metric a run did not log leaves its cells empty. Numbers are written with ``repr``
    (every digit).
    """
    columns = ["kind", "name", "group", "n", "settings", "seeds", "path"]
    for m in result.metrics:
        columns += [f"{m}/final", f"{m}/final_round", f"{m}/best", f"{m}/best_round", f"{m}/final_std", f"{m}/best_std"]

    def number(v: Any) -> str:
        return "" if v is None or (isinstance(v, float) and math.isnan(v)) else repr(v)

    rows = []
    for group in result.groups:
        for run in group.runs:
            row = {"kind": "run", "name": run.name, "group": group.name, "n": 1, "settings": group.label,
                   "seeds": _seeds_text(run), "path": run.path}
            for m in result.metrics:
                s = run.summary(m, result.minimized[m]) or {}
                row.update({f"{m}/{k}": number(s.get(k)) for k in ("final", "final_round", "best", "best_round")})
            rows.append(row)
        row = {"kind": "group", "name": group.name, "group": group.name, "settings": group.label,
               "seeds": "; ".join(_seeds_text(r) for r in group.runs), "path": ""}
        n = 0
        for m in result.metrics:
            s = group.summary(m, result.minimized[m]) or {}
            n = max(n, s.get("n", 0))
            row.update({f"{m}/{k}": number(s.get(k)) for k in ("final", "final_round", "best", "final_std", "best_std")})
        row["n"] = n
        rows.append(row)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def plot_report(result: Report, by: str = "group") -> Any:
    """A figure of each metric against the round, one panel per metric (stacked, sharing the round axis).

    Args:
        result: a :func:`report`.
        by: ``"group"`` (each group's mean over its runs at the rounds all of them logged, with a ± one standard
            deviation band, ddof=1; a group of one is its run's line) or ``"run"`` (one line per run).

    Returns:
        A ``matplotlib.figure.Figure`` with an Agg canvas (no pyplot state, no display).

    Raises:
        ReportError: ``by`` is neither ``"group"`` nor ``"run"``.
    """
    if by not in ("group", "run"):
        raise ReportError(f"--plot_by must be one of ('group', 'run'), got {by!r}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    k = len(result.metrics)
    fig = Figure(figsize=(7.5, 2.6 * k + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(k, 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, result.metrics):
        for group in result.groups:
            curves = [r.curves[metric] for r in group.runs if metric in r.curves]
            if not curves:
                continue
            if by == "run":
                for run in group.runs:
                    if metric in run.curves:
                        ax.plot(*run.curves[metric], marker=".", label=run.name)
                continue
            common = curves[0][0]
            for rounds, _ in curves[1:]:
                common = np.intersect1d(common, rounds)
            values = np.stack([v[np.isin(r, common)] for r, v in curves])
            mean = values.mean(axis=0)
            label = f"{group.name} (n={len(curves)})" + (f": {group.label}" if group.label else "")
            (line,) = ax.plot(common, mean, marker=".", label=label)
            if len(curves) > 1:
                std = values.std(axis=0, ddof=1)
                ax.fill_between(common, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} (best = {'min' if result.minimized[metric] else 'max'})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[-1].set_xlabel("round")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    if by == "group":
        fig.suptitle("each group's mean over its runs; band: ± 1 std (ddof=1)", fontsize=9)
    return fig


# ------------------------------------------------------------------------------------------------ the command
REPORT_USAGE = ("lightning-fed report RUNS... [--metrics M...] [--minimize M...] [--maximize M...] [--ignore KEY...] "
                "[--csv PATH.csv] [--plot PATH.png] [--plot_by group|run]")


def report_command(args: Sequence[str]) -> Report:
    """``lightning-fed report``: print :func:`report`'s table of ``RUNS``, optionally write its CSV (:func:`write_csv`)
    and figure (:func:`plot_report`, format from the suffix).

    Raises:
        SystemExit: (exit status 2) a bad argument: argparse's message with the usage for an unknown option, or one
            line ``error: ...`` for a :class:`ReportError`.
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog="lightning-fed report", usage=REPORT_USAGE,
        description="Final and best value of each metric per run, and mean ± std over runs that differ only in "
                    "their seeds, read from the runs' TensorBoard event files.")
    parser.add_argument("runs", nargs="+", metavar="RUNS", help="run folders (version_N) or folders above them")
    parser.add_argument("--metrics", nargs="+", default=None,
                        help="scalar tags to report (default: every validation metric logged, val_* and fed_val_*)")
    parser.add_argument("--minimize", nargs="+", default=[], help="metrics whose best is the minimum "
                        "(default rule: names containing 'loss'; every other metric is maximised)")
    parser.add_argument("--maximize", nargs="+", default=[], help="metrics whose best is the maximum")
    parser.add_argument("--ignore", nargs="+", default=[],
                        help="settings (and those below them, e.g. trainer.logger) not compared when grouping runs")
    parser.add_argument("--csv", default=None, help="write one row per run and per group to this CSV file")
    parser.add_argument("--plot", default=None, help="save the curves (metric against round) to this image file")
    parser.add_argument("--plot_by", choices=("group", "run"), default="group",
                        help="plot each group's mean with a ± std band (default) or each run")
    ns = parser.parse_args(list(args))
    try:
        result = report(ns.runs, ns.metrics, ns.minimize, ns.maximize, ns.ignore)
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_ARGUMENT) from None
    print(result.text)
    if ns.csv:
        write_csv(result, ns.csv)
        print(f"csv: {ns.csv}")
    if ns.plot:
        plot_report(result, by=ns.plot_by).savefig(ns.plot)
        print(f"plot: {ns.plot}")
    return result
