"""benchmarks/pfl_processes.py (issue #33.4): its argument checks, the commands it starts (lightning_fed through
ddp_speedup.py's worker, pfl under torch.distributed.run), its table with a failed variant, and a tiny run without
pfl (CI has no pfl: its rows are "skipped"; lightning_fed's two processes equal its one, bit for bit)."""

from __future__ import annotations

import csv

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def pfl_processes():
    return load_script("benchmarks/pfl_processes.py")


@pytest.mark.parametrize("argv, match", [
    (["--variants", "pfl-3"], "--variants: unknown"),
    (["--cohorts", "10,x"], "comma-separated integers"),
    (["--cohorts", "9"], "--cohorts must be even and >= 2"),
    (["--rounds", "1"], "--rounds must be >= 2"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--device", "tpu"], "invalid choice"),
])
def test_bad_arguments_are_refused_by_name(pfl_processes, argv, match, capsys):
    with pytest.raises(SystemExit):
        pfl_processes.parse_args(argv)
    assert match in capsys.readouterr().err


def test_commands(pfl_processes):
    args = pfl_processes.parse_args(["--cohorts", "10"])
    assert (args.cohorts, args.rounds, args.repeats, args.device) == ([10], 5, 3, "cpu")
    ours = pfl_processes._command("lightning_fed-2", args, 10, "o.json")
    assert ours[1].endswith("ddp_speedup.py") and ours[ours.index("--devices") + 1] == "2"
    assert ours[ours.index("--accelerator") + 1] == "cpu" and "--processes-per-device" not in ours
    pfl_two = pfl_processes._command("pfl-2", args, 10, "o.json")
    assert pfl_two[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2"]
    assert pfl_two[pfl_two.index("--pfl-worker") + 1] == "o.json"
    pfl_one = pfl_processes._command("pfl-1", args, 10, "o.json")
    assert pfl_one[1].endswith("pfl_processes.py")


def test_table_shows_a_failed_variant_as_a_dash(pfl_processes):
    rows = [dict(cohort=10, variant=v, status=s, s_per_round_median=m, s_per_round_min=m, speedup_vs_one_process=sp,
                 ratio_to_pfl_same_processes=r, loadavg_1m_min="0.5", loadavg_1m_max="1.5")
            for v, s, m, sp, r in [("lightning_fed-1", "ok", "0.8", "", ""), ("lightning_fed-2", "ok", "0.4", "2", ""),
                                   ("pfl-1", "ok", "0.8", "", ""), ("pfl-2", "failed", "", "", "")]]
    table = pfl_processes.markdown_table(rows).splitlines()
    assert table[2] == ("| 10 | 0.800 (0.800) | 0.400 (0.400) | 0.800 (0.800) | — | 2.00× | — | — | 0.50–1.50 |")


def test_quick_run_without_pfl(pfl_processes, tmp_path):
    import importlib.util

    if importlib.util.find_spec("pfl") is not None:
        pytest.skip("pfl is installed here: the quick run would time it too")
    out = tmp_path / "processes.csv"
    pfl_processes.main(["--quick", "--variants", "lightning_fed-1,lightning_fed-2,pfl-2", "--out", str(out)])
    rows = {r["variant"]: r for r in csv.DictReader(out.open())}
    assert rows["lightning_fed-1"]["status"] == rows["lightning_fed-2"]["status"] == "ok"
    assert rows["lightning_fed-2"]["max_abs_diff_vs_lightning_fed_1"] == "0"
    assert rows["pfl-2"]["status"] == "skipped" and "setup_pfl_env.sh" in rows["pfl-2"]["note"]


def test_a_failed_workers_reason_is_its_own_error_not_torchruns(pfl_processes):
    stderr = ("[rank1]: Traceback (most recent call last):\n"
              "[rank1]: torch.AcceleratorError: CUDA error: invalid device ordinal\n"
              "E1127 torch.distributed.elastic.multiprocessing.api: failed (exitcode: 1)\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert pfl_processes.failure_reason(stderr) == "[rank1]: torch.AcceleratorError: CUDA error: invalid device ordinal"
    assert pfl_processes.failure_reason("ValueError: bad\nlast words\n") == "ValueError: bad"
    assert pfl_processes.failure_reason("only this\n") == "only this"
    assert pfl_processes.failure_reason("") == "(no output)"
