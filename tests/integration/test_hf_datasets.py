"""benchmarks/hf_datasets.py (#40.4): a tiny run reports set-up and per-round times for every column kind, the
Hugging Face fits train the same weights as the TensorDataset fits, and bad arguments are refused by name."""

from __future__ import annotations

import math

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def hf_datasets():
    return load_script("benchmarks/hf_datasets.py")


def test_a_tiny_run_reports_every_kind_with_the_same_weights(hf_datasets, capsys):
    report = hf_datasets.main(["--in-process", "--samples", "120", "--clients", "6", "--cohort", "2", "--rounds", "2",
                               "--repeats", "1", "--batch", "10"])
    assert set(report) == {"nested", "array3d", "image", "image-disk"}
    for kind, variants in report.items():  # image-disk: a first run and a later one (the decoded column cached)
        assert set(variants) == ({"tensor", "hf", "hf-cached"} if kind == "image-disk" else {"tensor", "hf"})
        for variant, figures in variants.items():
            assert figures["same_weights"] is True, (kind, variant)
            assert all(figures[f] > 0 and math.isfinite(figures[f]) for f in hf_datasets.FIELDS), (kind, variant)
        assert variants["tensor"]["fit_ratio"] == 1.0
    out = capsys.readouterr().out
    assert "load average" in out and "set-up s" in out and "fit x" in out and "cpu x" in out


@pytest.mark.parametrize("argv, match", [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--cohort", "20", "--clients", "10"], "--cohort must be <= --clients"),
    (["--variants", "hf"], "--variants must include tensor"),
    (["--kinds", "png"], "invalid choice"),
])
def test_bad_arguments_are_refused_by_name(hf_datasets, argv, match, capsys):
    with pytest.raises(SystemExit):
        hf_datasets.main(argv)
    assert match in capsys.readouterr().err
