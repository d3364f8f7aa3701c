"""Issue #56 item 5: the communication table of ``benchmarks/reproduce.py`` (``communication``): final accuracy
against megabytes uploaded.

Tasks × server rules: Shakespeare (``examples/communication_shakespeare_<rule>.yaml``: Reddi et al. 2021's recipe,
:data:`ROUNDS` ``["shakespeare"]`` = 200 rounds of the paper's 1,500, validation on a seeded 2,000-sequence test
subset) and Fashion-MNIST Hybrid+ (``examples/communication_fmnist_<rule>.yaml``: the recipe of
``fashion_mnist_hybrid_plus_fedavg_qsgd_ef.yaml``, 100 rounds of its 500) × FedAvg and FedAdam, each with the uplink
compressors of :data:`COMPRESSORS` (the config is the uncompressed run; the others add a
:class:`~lightning_fed.communication.Compression` client half here, its draw seed the run's seed): none, bf16
(2 bytes an entry), 8-bit min-max quantisation, QSGD-4 (s = 7: a sign and 3 level bits an entry, the norm as
float32) and top-1 % with error feedback (1 % of the entries as float32 values and int32 indices) — seeds 0, 1, 2,
validation every :data:`VAL_EVERY` rounds. 2 × 2 × 5 × 3 = 60 runs.

Per row (mean ± sample std over the finished seeds): the final ``val_acc`` (%), the megabytes (10⁶ bytes) all
clients uploaded over the run (``total_bytes_up`` of the last round, the ledger's exact count) and the megabytes
uploaded when ``val_acc`` first reached the task's :data:`TARGETS` (seeds that never did are counted apart).

Budget (``round_time_s`` of the committed ``reddi_shakespeare`` / ``fedaware_fmnist`` CSVs on this 2-core CPU, one
thread a run): a Shakespeare round ≈ 2.7–3.1 s, a Fashion-MNIST Hybrid+ round ≈ 5.6 s; 30 runs × 200 × 3 s + 30 × 100
× 5.6 s ≈ 9.7 hours of one core, ≈ 5 hours with ``--parallel 2`` (compression adds a few ms a client, validation
some minutes a run).

Figure: ``python benchmarks/communication_table.py figure OUT.png`` draws val_acc against the megabytes uploaded,
one panel per task × rule, one line per compressor (mean over the finished seeds; :func:`figure`).
"""

from __future__ import annotations

import copy
import math
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional

TABLE = "communication"
TASKS = ("shakespeare", "fmnist")
RULES = ("fedavg", "fedadam")
ROUNDS = {"shakespeare": 200, "fmnist": 100}
VAL_EVERY = 10
SEEDS = (0, 1, 2)
#: the val_acc whose upload cost the table reports, per task
TARGETS = {"shakespeare": 0.45, "fmnist": 0.70}

_C = "lightning_fed.communication."
#: the uplink compressors in row order: name -> the Compression half's init_args (``None``: sent raw)
COMPRESSORS: dict[str, Optional[dict]] = {
    "none": None,
    "bf16": {"compressor": {"class_path": _C + "BFloat16"}},
    "uniform8": {"compressor": {"class_path": _C + "UniformQuantization", "init_args": {"bits": 8}}},
    "qsgd4": {"compressor": {"class_path": _C + "QSGD", "init_args": {"levels": 7}}},
    "topk1_ef": {"compressor": {"class_path": _C + "TopK", "init_args": {"fraction": 0.01}}, "error_feedback": True},
}
NAMES = {"none": "none (float32)", "bf16": "bfloat16", "uniform8": "8-bit uniform", "qsgd4": "QSGD-4 (s = 7)",
         "topk1_ef": "top-1 % + EF"}
TASK_NAMES = {"shakespeare": "Shakespeare", "fmnist": "Fashion-MNIST Hybrid+"}
RULE_NAMES = {"fedavg": "FedAvg", "fedadam": "FedAdam"}


def config(base: dict, compressor: str, seed: int) -> dict:
    """The task × rule config ``base`` with the uplink ``compressor`` (a :data:`COMPRESSORS` name) whose draws are
    seeded ``seed``; every other setting as in ``base``.

    >>> cfg = config({"trainer": {"max_epochs": 100}}, "qsgd4", 2)
    >>> half = cfg["trainer"]["client_algorithms"][0]
    >>> half["class_path"], half["init_args"]["compressor"]["init_args"], half["init_args"]["seed"]
    ('lightning_fed.communication.Compression', {'levels': 7}, 2)
    >>> "client_algorithms" in config({"trainer": {}}, "none", 0)["trainer"]
    False
    """
    cfg = copy.deepcopy(base)
    args = COMPRESSORS[compressor]
    if args is not None:
        halves = cfg.setdefault("trainer", {}).setdefault("client_algorithms", [])
        halves.append({"class_path": _C + "Compression", "init_args": {**copy.deepcopy(args), "seed": seed}})
    return cfg


def run_specs(examples: Path) -> list[tuple[str, dict, dict]]:
    """Every run as ``(name, config before seeding, labels)``: seed 0 first, then task, rule and compressor in
    :data:`TASKS` / :data:`RULES` / :data:`COMPRESSORS` order (one whole row block a seed)."""
    from yaml import safe_load

    bases = {(t, r): safe_load((examples / f"{TABLE}_{t}_{r}.yaml").read_text()) for t in TASKS for r in RULES}
    return [(f"{task}_{rule}_{c}_seed{seed}", config(bases[task, rule], c, seed),
             {"task": task, "rule": rule, "compressor": c, "seed": seed})
            for seed in SEEDS for task in TASKS for rule in RULES for c in COMPRESSORS]


def summary(rows: list[dict], target: float) -> dict:
    """A finished run's figures from its merged per-round rows (``round``, ``val_acc``, ``total_bytes_up``): the
    final val_acc (%), the megabytes uploaded over the run and when val_acc first reached ``target`` (``nan``: never).

    >>> rows = [{"round": "1", "total_bytes_up": "2e6"}, {"round": "2", "val_acc": "0.5", "total_bytes_up": "4e6"},
    ...         {"round": "3", "val_acc": "0.6", "total_bytes_up": "6e6"}]
    >>> summary(rows, 0.55)
    {'final': 60.0, 'mb': 6.0, 'mb_to_target': 6.0}
    """
    def values(key: str) -> list[tuple[int, float]]:
        return [(int(r["round"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]

    accuracy, uploaded = values("val_acc"), dict(values("total_bytes_up"))
    if not accuracy or not uploaded:
        raise SystemExit("a communication run's CSV needs val_acc and total_bytes_up values")
    reached = next((uploaded[r] / 1e6 for r, a in accuracy if a >= target and r in uploaded), math.nan)
    return {"final": 100 * accuracy[-1][1], "mb": uploaded[max(uploaded)] / 1e6, "mb_to_target": reached}


def table(runs: list, rows_of: Callable[[object], Optional[list[dict]]], cell: Callable[[list[float]], str]) -> str:
    """The markdown table, one block per task: a row per rule × compressor; ``rows_of(run)`` gives a finished run's
    merged rows (``None`` before its CSV exists), ``cell(values)`` a cell from the finished seeds' values
    (``reproduce.mean_std``)."""
    lines = []
    for task in TASKS:
        members = [r for r in runs if r.labels["task"] == task]
        if not members:
            continue
        target = TARGETS[task]
        lines += [f"**{TASK_NAMES[task]}, {ROUNDS[task]} rounds**", "",
                  f"| server | uplink | seeds | final val_acc (%) | MB uploaded | MB uploaded to reach "
                  f"{100 * target:.0f} % |", "|---|---|---|---|---|---|"]
        for rule in RULES:
            for c in COMPRESSORS:
                group = [r for r in members if r.labels["rule"] == rule and r.labels["compressor"] == c]
                done = [summary(rows, target) for rows in (rows_of(r) for r in group) if rows is not None]
                hit = [s["mb_to_target"] for s in done if not math.isnan(s["mb_to_target"])]
                lines.append(f"| {RULE_NAMES[rule]} | {NAMES[c]} | {len(done)}/{len(group)} | "
                             f"{cell([s['final'] for s in done])} | {cell([s['mb'] for s in done])} | "
                             f"{cell(hit)}{'' if len(hit) == len(done) else f' ({len(hit)} of {len(done)})'} |")
        lines.append("")
    return "\n".join(lines).rstrip()


def figure(runs: list, rows_of: Callable[[object], Optional[list[dict]]], path: Path, dpi: int = 120) -> Path:
    """val_acc (%) against the megabytes uploaded (log scale), one panel per task × rule, a line per compressor:
    the mean over the finished seeds at each validated round; written to ``path`` (PNG, matplotlib's Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(TASKS), len(RULES), figsize=(11, 8), squeeze=False)
    for i, task in enumerate(TASKS):
        for j, rule in enumerate(RULES):
            ax = axes[i][j]
            for c in COMPRESSORS:
                curves = []
                for run in runs:
                    if run.labels["task"] != task or run.labels["rule"] != rule or run.labels["compressor"] != c:
                        continue
                    rows = rows_of(run)
                    if rows is None:
                        continue
                    up = {int(r["round"]): float(r["total_bytes_up"]) for r in rows if r.get("total_bytes_up")}
                    curves.append({int(r["round"]): (up[int(r["round"])] / 1e6, 100 * float(r["val_acc"]))
                                   for r in rows if r.get("val_acc") and int(r["round"]) in up})
                common = sorted(set.intersection(*(set(k) for k in curves))) if curves else []
                if common:
                    ax.plot([statistics.mean(cv[r][0] for cv in curves) for r in common],
                            [statistics.mean(cv[r][1] for cv in curves) for r in common], marker=".", label=NAMES[c])
            ax.set_xscale("log")
            ax.set_title(f"{TASK_NAMES[task]}, {RULE_NAMES[rule]}", fontsize=10)
            ax.set_xlabel("MB uploaded (all clients)")
            ax.set_ylabel("val_acc (%)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def main(argv: Optional[list[str]] = None) -> None:
    """``figure OUT.png``: the table's figure from the committed CSVs (runs without a CSV are left out)."""
    import argparse

    parser = argparse.ArgumentParser(description="The communication table's figure, from the committed CSVs.")
    parser.add_argument("command", choices=["figure"])
    parser.add_argument("out", type=Path, help="the PNG to write")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import reproduce

    print(figure(reproduce.TABLES[TABLE](), reproduce.communication_rows, args.out))


if __name__ == "__main__":
    main()
