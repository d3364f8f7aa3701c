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
    (["--decoders", "libpng"], "invalid choice"),
])
def test_bad_arguments_are_refused_by_name(hf_datasets, argv, match, capsys):
    with pytest.raises(SystemExit):
        hf_datasets.main(argv)
    assert match in capsys.readouterr().err


def test_decoders_report_cost_pixels_and_corrupt_pngs(hf_datasets, capsys):
    """``--decoders`` (#52 3, session 6): each decoder's CPU cost an image, whether it gives ``decode_example``'s
    pixels, and what it does with two corrupt PNGs; PIL (``decode_example``, as the package decodes today) decodes
    both: it does not check the image data's checksum, and fills rows missing from the image data with zeros."""
    report = hf_datasets.main(["--decoders", "decode_example", "pil-png", "--samples", "8", "--repeats", "1"])
    assert set(report) == {"decode_example", "pil-png"}
    for figures in report.values():
        assert figures["us"] > 0 and figures["same"] is True
        assert figures["bad-crc"] == "decodes" and figures["short"] == "decodes"
    assert "us/image" in capsys.readouterr().out


def test_corrupt_png_changes_only_what_it_names(hf_datasets):
    """The corrupt PNGs, checked with zlib and struct (not the benchmark's decoders): ``bad-crc`` keeps the image data
    and breaks its chunk's checksum; ``short`` holds the first half of the rows, with a right checksum."""
    import struct
    import zlib

    payload = hf_datasets.png_payloads(1)[0]

    def idat(png):
        length = struct.unpack(">I", png[33:37])[0]
        assert png[37:41] == b"IDAT" and png[-12:] == payload[-12:]  # IEND kept
        return png[41 : 41 + length], struct.unpack(">I", png[41 + length : 45 + length])[0]

    data, crc = idat(payload)
    assert crc == zlib.crc32(b"IDAT" + data)
    bad_data, bad_crc = idat(hf_datasets.corrupt_png(payload, "bad-crc"))
    assert bad_data == data and bad_crc != zlib.crc32(b"IDAT" + data)
    short_data, short_crc = idat(hf_datasets.corrupt_png(payload, "short"))
    rows = zlib.decompress(data)
    assert len(rows) == 28 * (1 + 28)  # 28 rows of a filter byte and 28 grey samples
    assert zlib.decompress(short_data) == rows[: len(rows) // 2] and short_crc == zlib.crc32(b"IDAT" + short_data)
