"""The README's picture: Reddi et al. 2021, Table 1's Shakespeare row, reproduced at full length on the real plays.

Reads the five committed runs of ``benchmarks/reproduce.py``'s ``reddi_shakespeare`` table
(``benchmarks/results/reddi_shakespeare/shakespeare_<optimizer>.csv``: one row per round, ``val_acc`` where the run
validated) and draws each optimizer's validation accuracy against the round, with the paper's figure (the mean
validation accuracy over rounds 1,401–1,500) as a mark at the right and ours beside it in the legend. Writes
``docs/images/reddi_shakespeare.png`` (matplotlib, Agg backend)::

    .venv/bin/python scripts/make_readme_figure.py

``tests/integration/test_docs.py`` checks the legend's figures against the CSVs.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "reddi_shakespeare"
OUT = ROOT / "docs" / "images" / "reddi_shakespeare.png"
#: Reddi et al. 2021, Table 1, Shakespeare: the mean validation accuracy (%) over the last 100 of 1,500 rounds.
PAPER = {"FedAdagrad": 57.5, "FedAdam": 57.0, "FedYogi": 57.2, "FedAvgM": 57.3, "FedAvg": 56.9}


def curve(optimizer: str) -> tuple[list[int], list[float]]:
    """``(rounds, val_acc in %)`` of one run: the rounds at which it validated (1-based, as the CSV counts them)."""
    rounds, acc = [], []
    with open(RESULTS / f"shakespeare_{optimizer.lower()}.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["val_acc"]:
                rounds.append(int(row["round"]))
                acc.append(100 * float(row["val_acc"]))
    return rounds, acc


def last_100_mean(optimizer: str) -> float:
    """The paper's statistic on our run: the mean of the validations in rounds 1,401–1,500 (%)."""
    rounds, acc = curve(optimizer)
    values = [a for r, a in zip(rounds, acc) if r > 1400]
    return sum(values) / len(values)


def main(out: Path = OUT) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6), dpi=110)
    for i, optimizer in enumerate(PAPER):
        rounds, acc = curve(optimizer)
        (line,) = ax.plot(rounds, acc, marker=".", markersize=4, linewidth=1.2,
                          label=f"{optimizer}: {last_100_mean(optimizer):.1f} % (paper {PAPER[optimizer]:.1f} %)")
        ax.plot([1540 + 12 * i], [PAPER[optimizer]], marker="<", color=line.get_color(), markersize=6)
    ax.set_xlabel("round")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_xlim(0, 1610)
    ax.set_ylim(47, 59.5)
    ax.set_title("Reddi et al. 2021, Table 1, Shakespeare: 1,154 real clients, 1,500 rounds "
                 "(◀ the paper's figure)", fontsize=9)
    ax.legend(title="mean of rounds 1,401–1,500", fontsize=8, title_fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
