"""benchmarks/pfl_compare.py (issue #33.1): its argument checks and table, and a tiny run without pfl (CI has no pfl:
the pfl row is then a "skipped" row saying how to install it). Where pfl imports (benchmarks/setup_pfl_env.sh's
venv), a tiny run also checks that pfl's FedAvg does the plain loop's work (weights equal to rounding)."""

from __future__ import annotations

import csv
import os
import pickletools
import zipfile
from pathlib import Path

import pytest
import torch

from helpers import load_script


@pytest.fixture(scope="module")
def pfl_compare():
    return load_script("benchmarks/pfl_compare.py")


@pytest.mark.parametrize("argv, match", [
    (["--workloads", "cnn,lstm"], "--workloads: unknown"),
    (["--variants", "plain,flower"], "--variants: unknown"),
    (["--cohorts", "10,x"], "comma-separated integers"),
    (["--cohorts", "0"], "--cohorts must be >= 1"),
    (["--threads", "0,1"], "--threads must be >= 1"),
    (["--rounds", "1"], "--rounds must be >= 2"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--cohorts", "10,200"], "200 exceeds the 100 clients"),
    (["--steps-per-client", "5,x"], "comma-separated integers"),
    (["--steps-per-client", "0,5"], "--steps-per-client must be >= 1"),
    (["--batch", "0"], "--batch must be >= 1"),
])
def test_bad_arguments_are_refused_by_name(pfl_compare, argv, match, capsys):
    with pytest.raises(SystemExit):
        pfl_compare.parse_args(argv)
    assert match in capsys.readouterr().err


def test_defaults_and_the_plain_baseline_always_run(pfl_compare):
    full = pfl_compare.parse_args([])
    assert (full.cohorts, full.threads, full.rounds, full.repeats, full.clients) == ([10, 50], [1, 2], 3, 3, 100)
    assert full.variants == ["plain", "pfl", "pfl-inproc", "sequential", "vectorized"]
    assert full.workloads == ["cnn", "mlp"]
    quick = pfl_compare.parse_args(["--quick", "--variants", "pfl"])
    assert quick.variants == ["plain", "pfl"] and quick.cohorts == [2, 4] and quick.clients == 6
    wl = pfl_compare.workload(full, "mlp", 50)
    assert (wl.cnn_arch, wl.clients, wl.cohort, wl.samples_per_client, wl.batch, wl.rounds) == ("mlp256", 100, 50, 600,
                                                                                                20, 3)


def test_steps_per_client_sets_each_clients_samples(pfl_compare):
    args = pfl_compare.parse_args(["--steps-per-client", "5,30"])
    assert args.steps_per_client == [5, 30] and pfl_compare.parse_args([]).steps_per_client is None
    assert [pfl_compare.workload(args, name, 10, 5).samples_per_client for name in ("cnn", "mlp")] == [100, 100]
    assert pfl_compare.workload(args, "cnn", 10).samples_per_client == 200  # the workload's own size
    small = pfl_compare.parse_args(["--steps-per-client", "5", "--batch", "10"])  # issue #44's 50 samples, B = 10
    assert [(w.samples_per_client, w.batch) for w in (pfl_compare.workload(small, "mlp", 10, 5),
                                                      pfl_compare.workload(small, "mlp", 10))] == [(50, 10), (300, 10)]


def _row(workload, cohort, threads, variant, ratio, status="ok", load=(3.0, 4.0), plain_s="1.5", low=""):
    return dict(workload=workload, cohort=cohort, threads=threads, variant=variant, status=status,
                ratio_to_plain=ratio if status == "ok" else "", ratio_min_to_plain_min=low, s_per_round_median=plain_s if status == "ok" else "",
                loadavg_1m_min=f"{load[0]}" if status == "ok" else "", loadavg_1m_max=f"{load[1]}" if status == "ok" else "")


def test_markdown_table_has_one_line_per_cell_in_the_issues_order(pfl_compare):
    rows = [_row("mlp", 10, 1, "plain", "1.0", plain_s="0.25"), _row("mlp", 10, 1, "pfl", "", status="skipped"),
            _row("mlp", 10, 1, "sequential", "1.234"),
            _row("cnn", 50, 2, "plain", "1.0", load=(2.5, 3.25)), _row("cnn", 50, 2, "vectorized", "0.5"),
            _row("cnn", 10, 1, "plain", "1.0"), _row("cnn", 10, 1, "pfl", "1.019", low="0.996"),
            _row("cnn", 10, 1, "sequential", "1.091"), _row("cnn", 10, 1, "vectorized", "1.5")]
    rows.append(_row("cnn", 10, 1, "pfl-inproc", "1.31"))
    lines = pfl_compare.markdown_table(rows).splitlines()
    assert lines[0].startswith("| workload (cohort C, threads) | plain s/round | pfl | pfl in-process |")
    assert lines[2:] == [
        "| CNN, C = 10, 1 thread | 1.500 | 1.02 (1.00) | 1.31 | 1.09 | 1.50 | 3.00–4.00 |",
        "| CNN, C = 50, 2 threads | 1.500 | — | — | — | 0.50 | 2.50–4.00 |",
        "| MLP 784-256-10, C = 10, 1 thread | 0.250 | — | — | 1.23 | — | 3.00–4.00 |",
    ]
    with_steps = [dict(r, steps_per_client=s) for s in (30, 5) for r in rows[:3]]
    assert pfl_compare.markdown_table(with_steps).splitlines()[2:] == [
        "| MLP 784-256-10, 5 steps, C = 10, 1 thread | 0.250 | — | — | 1.23 | — | 3.00–4.00 |",
        "| MLP 784-256-10, 30 steps, C = 10, 1 thread | 0.250 | — | — | 1.23 | — | 3.00–4.00 |",
    ]


def test_a_tiny_run_writes_the_csv_with_pfl_skipped_or_equal_to_the_plain_loop(pfl_compare, tmp_path):
    out = tmp_path / "pfl.csv"
    assert pfl_compare.main(["--quick", "--workloads", "mlp", "--cohorts", "2", "--threads", "1", "--rounds", "2",
                             "--variants", "plain,pfl,sequential", "--out", str(out)]) == out
    with out.open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == pfl_compare.COLUMNS
        rows = {r["variant"]: r for r in reader}
    assert set(rows) == {"plain", "pfl", "sequential"}
    assert float(rows["plain"]["ratio_to_plain"]) == 1.0 and float(rows["sequential"]["max_abs_diff_vs_plain"]) == 0.0
    for variant in ("plain", "sequential"):
        assert rows[variant]["status"] == "ok" and rows[variant]["loadavg_1m_min"] and rows[variant]["omp_env"]
    if pfl_compare.pfl_version() is None:
        assert rows["pfl"]["status"] == "skipped" and "setup_pfl_env.sh" in rows["pfl"]["note"]
    else:  # the same cohorts, batches and SGD: pfl's float32 averaging differs by rounding only
        assert rows["pfl"]["status"] == "ok" and float(rows["pfl"]["max_abs_diff_vs_plain"]) < 1e-6


def test_a_run_at_one_local_step_a_client_equals_the_plain_loop(pfl_compare, tmp_path):
    out = pfl_compare.main(["--quick", "--workloads", "mlp", "--steps-per-client", "1", "--cohorts", "2", "--threads",
                            "1", "--rounds", "2", "--variants", "plain,sequential", "--out", str(tmp_path / "s1.csv")])
    with out.open() as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert {r["steps_per_client"] for r in rows.values()} == {"1"} and rows["plain"]["samples_per_client"] == "20"
    assert float(rows["sequential"]["max_abs_diff_vs_plain"]) == 0.0


def test_pfl_does_the_plain_loops_work_where_it_is_installed(pfl_compare, tmp_path):
    if pfl_compare.pfl_version() is None:
        pytest.skip("pfl is not installed (bash benchmarks/setup_pfl_env.sh; not a dependency, not in CI)")
    out = pfl_compare.main(["--quick", "--workloads", "cnn", "--cohorts", "3", "--threads", "1", "--rounds", "3",
                            "--variants", "plain,pfl", "--out", str(tmp_path / "cnn.csv")])
    with out.open() as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert rows["pfl"]["status"] == "ok" and rows["pfl"]["pfl_version"] == "0.6.0"
    assert float(rows["pfl"]["max_abs_diff_vs_plain"]) < 1e-6
    assert int(rows["pfl"]["rounds_measured"]) == 2  # 1 repeat x 3 rounds, the warm-up excluded


# ---------------------------------------------------------------------------------------------- issue #51
PFL_PYTHON = Path(__file__).resolve().parents[2] / "benchmarks" / ".venv-pfl" / "bin" / "python"
NVML = "PYTORCH_NVML_BASED_CUDA_CHECK"


def test_pfls_own_process_gets_the_job_without_lightning_or_its_variable(pfl_compare, tmp_path):
    """The `pfl` column's process: Lightning's variable (set here by `import lightning`) is not in its environment,
    the job file needs nothing but torch's classes to load (so pfl_worker.py never imports Lightning or
    lightning_fed), and its model computes this process's module's logits; the plan is each round's cohort in
    order, each client's samples once, batch by batch."""
    assert os.environ.get(NVML) == "1" and NVML not in pfl_compare.pfl_env()
    args = pfl_compare.parse_args(["--quick", "--workloads", "mlp", "--cohorts", "2", "--rounds", "2"])
    wl = pfl_compare.workload(args, "mlp", 2)
    dm = pfl_compare.overhead.make_datamodule(wl, pfl_compare.overhead.make_dataset(wl))
    module = pfl_compare.overhead.make_model(wl)
    init_state = {k: v.clone() for k, v in module.state_dict().items()}
    job = pfl_compare.write_job(tmp_path / "job.pt", wl, dm, init_state, threads=1)
    plan = torch.load(job, weights_only=False)["plan"]
    assert [(r, c) for r, c, _ in plan] == [(r, c) for r in range(2) for c in dm.sample_clients(r).tolist()]
    for r, c, index in plan:
        assert sorted(index.tolist()) == sorted(dm.client_indices(c).tolist())
        assert index.tolist() == [int(i) for b in dm.client_batches(c, r) for i in b]
    with zipfile.ZipFile(job) as archive:  # the modules the job's pickle imports when it is loaded
        pickled = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
    modules = {arg.split(" ")[0].split(".")[0] for op, arg, _ in pickletools.genops(pickled) if op.name == "GLOBAL"}
    assert modules and modules <= {"torch", "collections", "__builtin__"}, modules
    net = torch.load(job, weights_only=False)["net"]
    assert type(net) is torch.nn.Sequential
    x = dm.train_dataset.tensors[0][plan[0][2]]
    with torch.no_grad():
        assert torch.equal(net(x), module(x))


def test_the_pfl_worker_refuses_to_run_with_lightnings_variable(pfl_compare, capsys):
    import pfl_worker

    with pytest.raises(SystemExit, match=f"{NVML} is set"):
        pfl_worker.main(["job.pt", "result.pt"])
    with pytest.raises(SystemExit, match="usage"):
        pfl_worker.main([])


@pytest.mark.slow  # two fresh processes importing torch and pfl: ~10 s quiet, 30-90 s under load
def test_pfl_in_its_own_process_does_the_plain_loops_work_where_it_is_installed(pfl_compare, tmp_path):
    if not PFL_PYTHON.exists():
        pytest.skip("no benchmarks/.venv-pfl (bash benchmarks/setup_pfl_env.sh; not a dependency, not in CI)")
    out = pfl_compare.main(["--quick", "--workloads", "mlp", "--cohorts", "2", "--threads", "1", "--rounds", "2",
                            "--variants", "plain,pfl", "--pfl-python", str(PFL_PYTHON), "--out",
                            str(tmp_path / "own.csv")])
    with out.open() as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert rows["pfl"]["status"] == "ok" and rows["pfl"]["pfl_version"] == "0.6.0"
    assert float(rows["pfl"]["max_abs_diff_vs_plain"]) < 1e-6 and "unset" in rows["pfl"]["note"]
