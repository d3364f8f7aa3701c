"""lightning_fed._jsonargparse: every private jsonargparse name the package uses exists in the installed jsonargparse,
a jsonargparse that lacks one fails at import with a message naming it and the supported versions, and no other
module of the package reaches into jsonargparse's private modules or attributes (issue #52 item 3c)."""

import importlib
import re
from pathlib import Path

import jsonargparse
import jsonargparse._typehints as jsonargparse_typehints
import pytest

from lightning_fed import _jsonargparse

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_fed"


def test_supported_range_is_the_pyproject_pin():
    pin = re.search(r'"jsonargparse\[signatures\](>=[^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert _jsonargparse.SUPPORTED_JSONARGPARSE == pin == ">=4.39,<5"


@pytest.mark.parametrize("module, path", _jsonargparse.REQUIRED_SYMBOLS,
                         ids=[p for _, p in _jsonargparse.REQUIRED_SYMBOLS])
def test_required_symbol_exists(module, path):
    obj = importlib.import_module(module)
    for part in path.split("."):
        assert hasattr(obj, part), (
            f"jsonargparse {jsonargparse.__version__} lacks {module}.{path}, a private name "
            f"lightning_fed._jsonargparse uses (supported: jsonargparse{_jsonargparse.SUPPORTED_JSONARGPARSE}); "
            "update _jsonargparse.py."
        )
        obj = getattr(obj, part)


def test_every_private_instance_attribute_exists():
    parser = jsonargparse.ArgumentParser()
    with_subcommands = jsonargparse.ArgumentParser()
    with_subcommands.add_subcommands()
    owners = {"ArgumentParser": parser, "ArgumentParser with subcommands": with_subcommands}
    missing = [f"{owner}.{attr}" for owner, attr in _jsonargparse.INSTANCE_ATTRIBUTES
               if not hasattr(owners[owner], attr)]
    assert not missing, (
        f"jsonargparse {jsonargparse.__version__} lacks the private attribute(s) {missing} that "
        f"lightning_fed._jsonargparse uses (supported: jsonargparse{_jsonargparse.SUPPORTED_JSONARGPARSE})."
    )


def test_the_wrappers_do_what_jsonargparse_does():
    from lightning_fed.callbacks import FedAdam, FedAvg, ServerOptimizer

    def imported(path):
        module, _, name = path.rpartition(".")
        return getattr(importlib.import_module(module), name)

    assert imported(_jsonargparse.resolve_class_path_by_name(ServerOptimizer, "FedAdam")) is FedAdam
    assert FedAvg in map(imported, _jsonargparse.subclass_paths(ServerOptimizer))
    assert set(_jsonargparse.init_parameter_names(FedAdam)) >= {"lr", "beta1", "beta2", "tau", "weighting"}
    assert _jsonargparse.previous_config() is None and _jsonargparse.debug_mode_active() is False
    parser = jsonargparse.ArgumentParser()
    assert _jsonargparse.subcommands_action(parser) is None
    calls = []
    parser._error_handler = lambda p, message: calls.append((p, message))  # the deprecated handler, if a user set one
    _jsonargparse.report_error(parser, "bad")
    assert calls == [(parser, "bad")]


def test_a_jsonargparse_without_a_name_fails_at_import_naming_it(monkeypatch):
    monkeypatch.delattr(jsonargparse_typehints, "resolve_class_path_by_name")
    try:
        with pytest.raises(ImportError, match=r"jsonargparse\._typehints\.resolve_class_path_by_name.*"
                                              r"jsonargparse>=4\.39,<5"):
            importlib.reload(_jsonargparse)
    finally:
        monkeypatch.undo()
        importlib.reload(_jsonargparse)


#: ``import jsonargparse._x`` / ``from jsonargparse._x import ...`` and the private attributes listed in
#: ``INSTANCE_ATTRIBUTES`` (``parser._subcommands_action``, ``getattr(parser, "_subcommands_action")``).
PRIVATE_USE = re.compile(
    r"^\s*(?:from|import)\s+jsonargparse(?:\.\w+)*\._\w+"
    + "".join(rf"|\b{re.escape(attr)}\b" for _, attr in _jsonargparse.INSTANCE_ATTRIBUTES),
    re.MULTILINE,
)


def _private_jsonargparse_uses(text):
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}" for m in PRIVATE_USE.finditer(text)]


def test_only_the_shim_uses_private_jsonargparse_names():
    found = [f"{path.relative_to(ROOT)} {use}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.name != "_jsonargparse.py" for use in _private_jsonargparse_uses(path.read_text())]
    assert not found, (
        "jsonargparse's private API used outside lightning_fed/_jsonargparse.py (add a named function there, with its "
        "name in REQUIRED_SYMBOLS or INSTANCE_ATTRIBUTES):\n" + "\n".join(found)
    )


def test_the_scan_finds_the_uses_main_had():
    """The check above is not vacuous: the imports ``cli.py`` had before this module existed are found."""
    old = ("from jsonargparse._actions import previous_config\n"
           "import jsonargparse._typehints\n"
           "def f(parser):\n    from jsonargparse._common import debug_mode_active\n"
           "    return parser._subcommands_action, getattr(parser, '_subcommands_action', None)\n"
           "from jsonargparse import ArgumentParser  # public: not found\n")
    assert len(_private_jsonargparse_uses(old)) == 5
