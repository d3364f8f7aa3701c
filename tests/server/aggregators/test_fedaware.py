"""The old import path of FedAWARE's server half (now lightning_fed/algorithms/fedaware.py, tested in
tests/algorithms/test_fedaware.py) still works, with a DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib

import pytest

from lightning_fed import _moved
from lightning_fed.algorithms import fedaware


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test sees each old path's first use (the warning comes once per process)."""
    monkeypatch.setattr(_moved, "_warned", set())


@pytest.mark.parametrize("name", ["FedAWAREMinNorm", "fedaware_state_bytes", "physical_memory_bytes",
                                  "public_code_pairing"])
def test_old_path_warns_and_gives_the_moved_name(name):
    old = importlib.import_module("lightning_fed.server.aggregators.fedaware")
    with pytest.warns(DeprecationWarning, match=f"lightning_fed.algorithms.fedaware.{name}"):
        value = getattr(old, name)
    assert value is getattr(fedaware, name)


def test_old_path_from_import_warns():
    with pytest.warns(DeprecationWarning, match="moved to `lightning_fed.algorithms.fedaware.FedAWAREMinNorm`"):
        from lightning_fed.server.aggregators.fedaware import FedAWAREMinNorm
    assert FedAWAREMinNorm is fedaware.FedAWAREMinNorm


def test_package_path_does_not_warn_and_unknown_names_fail(recwarn):
    from lightning_fed.server.aggregators import FedAWAREMinNorm

    assert FedAWAREMinNorm is fedaware.FedAWAREMinNorm and not recwarn.list
    old = importlib.import_module("lightning_fed.server.aggregators.fedaware")
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        old.nothing
