"""``lightning-fed partition`` (issue #52: moved out of ``cli.py``): a config's partition computed, printed and
plotted (:func:`partition_command`). Every name stays importable from :mod:`lightning_fed.cli`.
"""

from __future__ import annotations

from typing import Any

PARTITION_USAGE = (
    "lightning-fed partition --config CONFIG [--plot PATH.png] [--size_unit absolute|percent] [--max_clients N] "
    "[--data.* overrides]"
)


def partition_command(args: list[str]) -> dict[str, Any]:
    """``lightning-fed partition``: compute a config's partition, print its statistics, optionally plot it.

    Reads the same config as ``fit`` (every section is parsed and instantiated as ``fit`` would, with ``run=False``;
    only the data module is used; the trainer's start-up log lines, such as "GPU available" and the FedAvg
    default note, are not printed), runs ``datamodule.prepare_data()`` and ``setup("fit")`` (downloads included), then
    prints the partitioner, the size statistics of :meth:`~lightning_fed.datamodules.Partition.stats` and the
    per-client label counts (the first ``--max_clients`` clients), and with ``--plot PATH`` saves
    :func:`~lightning_fed.tensorboard.label_distribution_figure` there (format from the suffix, e.g. ``.png``).
    Other arguments (``--data.init_args.partitioner.init_args.alpha 0.1``, ...) override the config as in ``fit``.

    Args:
        args: the command-line arguments after ``partition``.

    Returns:
        The partition's :meth:`~lightning_fed.datamodules.Partition.stats` (with ``"label_histogram"`` when labelled).

    Raises:
        SystemExit: (exit code 2) no ``--config``, a bad ``--size_unit`` or ``--max_clients`` < 1, or a config error.
    """
    import argparse

    from lightning_fed.cli import FederatedCLI
    from lightning_fed.tensorboard import label_distribution_figure

    parser = argparse.ArgumentParser(prog="lightning-fed partition", usage=PARTITION_USAGE,
                                     description="Compute, print and plot the partition of a config's data module.")
    parser.add_argument("--config", action="append", required=True, help="a lightning-fed config (repeatable)")
    parser.add_argument("--plot", default=None, help="save the per-client label distribution figure to this path")
    parser.add_argument("--size_unit", choices=("absolute", "percent"), default="absolute",
                        help="bar lengths: sample counts (absolute, default) or percent of each client's samples")
    parser.add_argument("--max_clients", type=int, default=30,
                        help="clients printed and plotted (the first N, default 30)")
    ns, rest = parser.parse_known_args(args)
    if ns.max_clients < 1:
        parser.error(f"--max_clients must be an integer >= 1, got {ns.max_clients}")
    cli_args = [a for path in ns.config for a in ("--config", path)] + rest
    import logging
    import warnings

    # nothing is trained: the trainer's start-up notes (no server optimizer -> FedAvg, "GPU available: ...",
    # Lightning's tips) are not said; warnings are
    previous_disable = logging.root.manager.disable
    logging.disable(max(logging.INFO, previous_disable))
    try:
        with warnings.catch_warnings():  # the arguments come from sys.argv through main(): not a mix-up
            warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
            cli = FederatedCLI(args=cli_args, run=False)
    finally:
        logging.disable(previous_disable)
    dm = cli.datamodule
    dm.prepare_data()
    dm.setup("fit")
    partition = dm.partition
    stats = partition.stats()
    print(format_partition_stats(partition, stats, ns.max_clients, getattr(dm, "partitioner", None)))
    if ns.plot:
        fig = label_distribution_figure(partition, size_unit=ns.size_unit, max_clients=ns.max_clients)
        fig.savefig(ns.plot)
        print(f"plot: {ns.plot}")
    return stats


def format_partition_stats(partition: Any, stats: dict[str, Any], max_clients: int = 30, partitioner: Any = None) -> str:
    """The text ``lightning-fed partition`` prints: partitioner, sizes, and a clients × classes count table."""
    lines = []
    if partitioner is not None:
        lines.append(f"partitioner: {partitioner!r}")
    lines.append(f"num_clients: {stats['num_clients']}  num_samples: {stats['num_samples']}  "
                 f"num_classes: {stats['num_classes']}")
    lines.append(f"client size: min {stats['size_min']}  median {stats['size_median']:g}  "
                 f"mean {stats['size_mean']:.2f}  std {stats['size_std']:.2f}  max {stats['size_max']}")
    rows = min(max_clients, stats["num_clients"])
    sizes = stats["sizes"]
    hist = stats.get("label_histogram")
    if hist is None:
        lines.append(f"samples per client (first {rows}): " + " ".join(str(int(v)) for v in sizes[:rows]))
        return "\n".join(lines)
    names = partition.label_names
    header = [str(names[k]) if names is not None else str(k) for k in range(hist.shape[1])]
    width = max(max(len(h) for h in header), len(str(int(hist.max()) if hist.size else 0)))
    lines.append(f"label counts, clients x classes (first {rows} of {stats['num_clients']} clients):")
    lines.append("client    size  " + " ".join(h.rjust(width) for h in header))
    for c in range(rows):
        lines.append(f"{c:>6} {int(sizes[c]):>7}  " + " ".join(str(int(v)).rjust(width) for v in hist[c]))
    present = (hist > 0).sum(axis=1)
    lines.append(f"classes per client: min {int(present.min())}  mean {present.mean():.2f}  max {int(present.max())}")
    return "\n".join(lines)
