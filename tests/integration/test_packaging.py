"""The package's metadata (pyproject.toml) as the build backend reads it: ``pip install -e .`` and ``pip wheel``
print no deprecation warning, and the license is the SPDX expression that the wheel's ``License-Expression``
carries (PEP 639)."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_license_is_an_spdx_string_the_required_backend_reads():
    """``project.license`` is a string (a TOML table is deprecated since setuptools 77 and printed three times by
    ``pip install -e .``), and ``[build-system]`` requires a setuptools that reads it (>= 77.0.3, PEP 639)."""
    data = _pyproject()
    assert data["project"]["license"] == "Apache-2.0"
    (req,) = [Requirement(r) for r in data["build-system"]["requires"] if Requirement(r).name == "setuptools"]
    assert not req.specifier.contains("76.1") and not req.specifier.contains("77.0.2")
    assert req.specifier.contains("77.0.3")


def test_build_backend_reads_the_metadata_without_deprecation_warnings():
    """setuptools' own reading of pyproject.toml (what ``pip wheel`` runs) warns of nothing deprecated and sets the
    license expression."""
    pytest.importorskip("setuptools", minversion="77.0.3")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), str(ROOT / "pyproject.toml"))
    deprecated = [str(w.message).splitlines()[0] for w in caught if "deprecat" in str(w.message).lower()]
    assert deprecated == []
    assert dist.metadata.license_expression == "Apache-2.0"
