"""The partition in TensorBoard and in figures (issue #52: moved out of ``tensorboard.py``): the clients × classes
figure, the per-client label distribution, the client-size distribution with its quantiles and the rounded size
statistics, written once per run at fit start by :func:`log_partition` (and drawn by ``lightning-fed partition``).
Every name stays importable from :mod:`lightning_fed.tensorboard`.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_only

#: Tag of the partition figure (image) and of the size statistics (text).
PARTITION_FIGURE_TAG = "partition/clients_x_classes"
PARTITION_STATS_TAG = "partition/stats"
#: Tag of the per-client label distribution (stacked bars, :func:`label_distribution_figure`).
PARTITION_DISTRIBUTION_TAG = "partition/label_distribution"
#: Tag of the client-size distribution (histogram on log bins with quantiles, :func:`client_size_figure`).
PARTITION_SIZES_TAG = "partition/client_sizes"
#: Above this many clients the per-client label bars (one bar per client, the first 30) are left out: they would
#: show a handful of the clients; the size distribution and the clients × classes figure cover all of them.
MANY_CLIENTS = 100
#: Quantiles of the client size written in the statistics and drawn on :func:`client_size_figure`.
SIZE_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
_SIZE_UNITS = ("absolute", "percent")


def partition_figure(partition: Any, max_clients: int = 100) -> Any:
    """A matplotlib figure of the label distribution: clients × classes, colour = fraction of the client's samples.

    Row ``c`` is client ``c`` (the first ``max_clients`` clients), column ``k`` class ``k``; the cell's colour
    (viridis, fixed scale 0 → 1, with a colour bar) is n_{c,k} / n_c, the share of client c's samples with label
    k (0 for an empty client) — the same numbers as :meth:`~lightning_fed.datamodules.Partition.heatmap`.

    Args:
        partition: A :class:`~lightning_fed.datamodules.Partition` with labels.
        max_clients: Number of client rows (default 100).

    Returns:
        A ``matplotlib.figure.Figure`` with an Agg canvas (no pyplot state); ``SummaryWriter.add_figure`` renders it.

    Raises:
        ValueError: the partition has no labels, or ``max_clients`` < 1.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from lightning_fed.datamodules.partition import _check_int

    max_clients = _check_int("max_clients", max_clients, minimum=1)
    hist = partition.label_histogram(max_clients).astype(np.float64)
    totals = hist.sum(axis=1, keepdims=True)
    frac = np.divide(hist, totals, out=np.zeros_like(hist), where=totals > 0)
    rows, cols = frac.shape
    fig = Figure(figsize=(6.4, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(frac, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    shown = f"clients 0-{rows - 1} of {partition.num_clients}" if rows < partition.num_clients else f"{rows} clients"
    ax.set_title(f"Label distribution per client ({shown}, {cols} classes)")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("fraction of the client's samples")
    return fig


def label_distribution_figure(
    partition: Any, size_unit: str = "absolute", max_clients: int = 30, legend: bool = True, title: Optional[str] = None
) -> Any:
    """Per-client label distribution as stacked horizontal bars (the layout of Flower's
    ``flwr_datasets.visualization.plot_label_distributions``, its default ``plot_type="bar"``).

    One bar per client (client 0 at the top, the first ``max_clients`` clients), split into one coloured segment per
    class whose length is n_{c,k}, the number of client c's samples with label k (``size_unit="absolute"``), or
    100 · n_{c,k} / n_c (``"percent"``, every bar then spans 100; an empty client has an empty bar). The legend names
    the classes: ``Partition.label_names`` for text labels, else the class index. Without labels, each bar is the
    client's size (one segment, no legend), e.g. for a natural partition such as Shakespeare.

    Args:
        partition: a :class:`~lightning_fed.datamodules.Partition`.
        size_unit: ``"absolute"`` (default, sample counts) or ``"percent"`` (share of the client's samples).
        max_clients: number of client bars (int >= 1, default 30).
        legend: draw the class legend (bool, default ``True``), right of the bars.
        title: figure title (default: a description of what is shown).

    Returns:
        A ``matplotlib.figure.Figure`` with an Agg canvas (no pyplot state), width 8 in, height growing with the number
        of clients; ``fig.savefig(path)`` writes it, ``SummaryWriter.add_figure`` logs it.

    Raises:
        ValueError: ``size_unit`` not in ``("absolute", "percent")`` or ``max_clients`` < 1.
        TypeError: ``legend`` is not a bool.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from lightning_fed.datamodules.partition import _check_int

    if size_unit not in _SIZE_UNITS:
        raise ValueError(f"`size_unit` must be one of {_SIZE_UNITS}, got {size_unit!r}")
    max_clients = _check_int("max_clients", max_clients, minimum=1)
    if not isinstance(legend, (bool, np.bool_)):
        raise TypeError(f"`legend` must be a bool, got {legend!r}")
    rows = min(max_clients, partition.num_clients)
    has_labels = partition.labels is not None
    if has_labels:
        values = partition.label_histogram(rows).astype(np.float64)  # [rows, C]
    else:
        values = partition.sizes()[:rows].astype(np.float64)[:, None]
    if size_unit == "percent":
        totals = values.sum(axis=1, keepdims=True)
        values = np.divide(100.0 * values, totals, out=np.zeros_like(values), where=totals > 0)
    num_classes = values.shape[1]
    fig = Figure(figsize=(8.0, max(2.5, 0.9 + 0.22 * rows)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = _class_colours(num_classes)
    y = np.arange(rows)
    left = np.zeros(rows)
    names = getattr(partition, "label_names", None)
    for k in range(num_classes):
        label = (str(names[k]) if names is not None else str(k)) if has_labels else "samples"
        ax.barh(y, values[:, k], left=left, height=0.8, color=cmap[k], label=label)
        left += values[:, k]
    ax.set_yticks(y, [str(c) for c in range(rows)], fontsize=7 if rows > 40 else 9)
    ax.invert_yaxis()
    ax.set_ylabel("client")
    ax.set_xlabel("share of the client's samples (%)" if size_unit == "percent" else "number of samples")
    if size_unit == "percent":
        ax.set_xlim(0, 100)
    if title is None:
        shown = f"clients 0-{rows - 1} of {partition.num_clients}" if rows < partition.num_clients else f"{rows} clients"
        what = "Label distribution per client" if has_labels else "Samples per client"
        title = f"{what} ({shown}" + (f", {num_classes} classes)" if has_labels else ")")
    ax.set_title(title)
    if legend and has_labels:
        fig.legend(*ax.get_legend_handles_labels(), title="class", loc="outside right upper",
                   ncols=1 if num_classes <= 25 else 2, fontsize=8)
    return fig


def _class_colours(num_classes: int) -> list:
    """One colour per class: tab10 / tab20 for up to 20 classes, then evenly spaced viridis."""
    from matplotlib import colormaps

    if num_classes <= 10:
        return [colormaps["tab10"](k) for k in range(num_classes)]
    if num_classes <= 20:
        return [colormaps["tab20"](k) for k in range(num_classes)]
    return [colormaps["viridis"](x) for x in np.linspace(0, 1, num_classes)]


def size_quantiles(partition: Any) -> dict[str, float]:
    """The client-size quantiles :data:`SIZE_QUANTILES` (``numpy.quantile``, linear), as ``{"p10": ..., ...}``."""
    sizes = partition.sizes().astype(np.float64)
    return {f"p{round(100 * q)}": float(np.quantile(sizes, q)) for q in SIZE_QUANTILES}


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return int(value) if value.is_integer() else float(f"{value:.3g}") if abs(value) < 100 else round(value, 1)
    return value


def partition_stats_text(partition: Any) -> str:
    """The partition's statistics as TensorBoard text (``partition/stats``), one ``key: value`` per line: the keys of
    :meth:`Partition.stats` without ``sizes`` and ``num_classes`` when there are no labels, plus the size quantiles
    ``size_p10`` … ``size_p90``; floats rounded to 3 significant digits (one decimal from 100 up), integers with
    thousands separators.

    >>> from lightning_fed.datamodules import Partition
    >>> print(partition_stats_text(Partition.from_client_lists([[0], [1, 2], [3, 4, 5]])))
    num_clients: 3
    num_samples: 6
    size_min: 1
    size_median: 2
    size_mean: 2
    size_std: 0.816
    size_max: 3
    size_p10: 1.2
    size_p25: 1.5
    size_p50: 2
    size_p75: 2.5
    size_p90: 2.8
    """
    stats = partition.stats(label_histogram=False)
    summary = {k: v for k, v in stats.items() if k != "sizes" and not (k == "num_classes" and v is None)}
    summary.update({f"size_{k}": v for k, v in size_quantiles(partition).items()})
    lines = []
    for key, value in summary.items():
        value = _round(value)
        lines.append(f"{key}: {value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{key}: {value}")
    return "\n".join(lines)


def client_size_figure(partition: Any, bins: int = 30) -> Any:
    """The distribution of client sizes (samples per client) over all clients: a histogram on logarithmically
    spaced bins (x axis log scale), with the quantiles :data:`SIZE_QUANTILES` as dashed vertical lines, labelled.

    For natural-id partitions (Shakespeare's 1,154 roles, ...) this is the figure that says something: per-client
    bars of the first clients would show a few arbitrary ids.

    Args:
        partition: a :class:`~lightning_fed.datamodules.Partition`.
        bins: number of histogram bins (int >= 1, default 30), spaced evenly in log(size) between the smallest and
            the largest non-empty client.

    Returns:
        A ``matplotlib.figure.Figure`` (Agg canvas, 6.4 × 4 in at 100 dpi). Its first axes hold the histogram: bar
        heights are the numbers of clients per bin (empty clients are counted in the title, not drawn: log scale).

    Raises:
        ValueError: ``bins`` < 1.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from lightning_fed.datamodules.partition import _check_int

    bins = _check_int("bins", bins, minimum=1)
    sizes = partition.sizes()
    nonempty = sizes[sizes > 0].astype(np.float64)
    fig = Figure(figsize=(6.4, 4.0), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if nonempty.size:
        lo, hi = nonempty.min(), nonempty.max()
        edges = np.geomspace(lo, hi if hi > lo else lo * 1.0001, bins + 1)
        ax.hist(nonempty, bins=edges, color="tab:blue", edgecolor="white")
        ax.set_xscale("log")
        for (name, value), colour in zip(size_quantiles(partition).items(), ("0.5", "0.3", "black", "0.3", "0.5")):
            ax.axvline(value, color=colour, linestyle="--", linewidth=1)
            ax.annotate(f"{name} = {_round(value):,}", (value, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                        va="top", ha="right", fontsize=8)
    ax.set_xlabel("samples per client (log scale)")
    ax.set_ylabel("number of clients")
    empty = int((sizes == 0).sum())
    title = f"Client sizes: {partition.num_clients:,} clients, {int(sizes.sum()):,} samples"
    ax.set_title(title + (f" ({empty} empty)" if empty else ""))
    return fig


def _tensorboard_loggers(trainer: Any) -> list[Any]:
    from lightning.fabric.loggers import TensorBoardLogger as FabricTensorBoardLogger
    from lightning.pytorch.loggers import TensorBoardLogger

    return [lg for lg in trainer.loggers if isinstance(lg, (TensorBoardLogger, FabricTensorBoardLogger))]


@rank_zero_only
def log_partition(trainer: Any, partition: Any, max_clients: int = 100) -> None:
    """Write to every TensorBoard logger, at step 0: the partition's statistics (text, ``partition/stats``,
    :func:`partition_stats_text`: rounded, with size quantiles), its client-size distribution (image,
    ``partition/client_sizes``, :func:`client_size_figure`) and, when it has labels, its :func:`partition_figure`
    (image, ``partition/clients_x_classes``) and, for at most :data:`MANY_CLIENTS` clients, its
    :func:`label_distribution_figure` (image, ``partition/label_distribution``: stacked per-client class counts)."""
    for logger in _tensorboard_loggers(trainer):
        experiment = logger.experiment
        experiment.add_text(PARTITION_STATS_TAG, partition_stats_text(partition).replace("\n", "  \n"), 0)
        experiment.add_figure(PARTITION_SIZES_TAG, client_size_figure(partition), 0)
        if partition.labels is not None:
            experiment.add_figure(PARTITION_FIGURE_TAG, partition_figure(partition, max_clients), 0)
            if partition.num_clients <= MANY_CLIENTS:
                experiment.add_figure(PARTITION_DISTRIBUTION_TAG, label_distribution_figure(partition), 0)
