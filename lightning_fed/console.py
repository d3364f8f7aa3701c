"""The ``lightning-fed`` console script's entry point: :func:`main`, with a fast path for a subcommand's help.

Why a cache, and not only lazy imports: ``lightning-fed fit --help`` took 11.4 s under load (issue #50; 63 s,
median of 3, at a load of 13 on 2 cores, where ``import torch`` alone took 11 s), and its text is jsonargparse's
rendering of a parser built over Lightning's classes
(``lightning.Trainer``'s signature and docstrings, ``LightningModule`` and ``LightningDataModule`` subclasses, the
server optimizers): building it needs torch (~3.5 s alone) and Lightning (~10 s under load), whatever our own
package defers. So exactly ``lightning-fed <fit|validate|test|predict> --help`` (or ``-h``, nothing else on the
command line) prints the text the live rendering printed last time, stored under the user's cache folder
(``$XDG_CACHE_HOME/lightning_fed/help``, else ``~/.cache/lightning_fed/help``) and keyed by all that shapes it
(:func:`help_key`): the subcommand, the program name, the terminal width argparse formats for, lightning_fed's
version and a hash of every source file of the package, the Python version, the installed versions of Lightning,
jsonargparse, torch, docstring-parser and typeshed-client, and jsonargparse's ``JSONARGPARSE_*`` settings. Any of
them changing is a new key: the help is rendered live (:func:`lightning_fed.cli.main`), printed as it is written,
and stored on success, so the cache never shows stale text. Any error on the fast path (an unreadable cache, a
missing folder) falls back to the live rendering, and a failed store only loses the speed-up.
``LIGHTNING_FED_HELP_CACHE=0`` turns the cache off. The fast path imports neither torch nor Lightning nor
jsonargparse (``import lightning_fed`` is lazy); every other command line goes straight to
:func:`lightning_fed.cli.main`. Measured at that load: 0.44 s (median of 7; ``python -c pass`` 0.26 s), of which the
key (hashing the package's ~200 source files, finding the dependencies' ``dist-info``) ~0.1 s.

An alternative considered: a help text generated at build time and shipped with the package -- stale whenever
Lightning or jsonargparse differ from the build's, and wrong for another terminal width.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any, Optional

#: Setting it to ``0`` turns the help cache off (every help rendered live).
CACHE_ENV = "LIGHTNING_FED_HELP_CACHE"

#: Distributions whose version shapes the help text (by import name).
HELP_DEPENDENCIES = ("lightning", "jsonargparse", "torch", "docstring_parser", "typeshed_client")

#: Cached renderings kept (the newest); older ones are removed when a new one is stored.
KEEP = 8

_SUBCOMMANDS = ("fit", "validate", "test", "predict")
_PACKAGE = Path(__file__).resolve().parent


def help_subcommand(argv: Any) -> Optional[str]:
    """The subcommand of a command line that is exactly ``<subcommand> --help`` (or ``-h``), else ``None``.

    >>> help_subcommand(["fit", "--help"]), help_subcommand(["fit", "-h", "--config", "a.yaml"])
    ('fit', None)
    """
    if isinstance(argv, (list, tuple)) and len(argv) == 2 and argv[0] in _SUBCOMMANDS and argv[1] in ("-h", "--help"):
        return argv[0]
    return None


def cache_dir() -> Path:
    """The folder of the cached help texts: ``$XDG_CACHE_HOME/lightning_fed/help``, else
    ``~/.cache/lightning_fed/help``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightning_fed" / "help"


def source_hash(package: Path = _PACKAGE) -> str:
    """SHA-256 of every ``.py`` file under ``package`` (relative paths and contents, in sorted order)."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = Path(root, name)
            digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _installed(name: str) -> str:
    """``name``'s installed version, read from its ``*.dist-info`` folder name next to it without importing it
    (``importlib.metadata`` scans every path entry: ~0.4 s under load), with its ``__init__``'s size and mtime;
    ``'absent'`` where it is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return "absent"
    origin = Path(spec.origin)
    stat = origin.stat()
    site = origin.parent.parent if origin.name == "__init__.py" else origin.parent
    dists = sorted(p.name for p in site.glob("*.dist-info") if p.name.lower().replace("-", "_").startswith(name + "-"))
    return f"{origin}:{stat.st_size}:{stat.st_mtime_ns}:{','.join(dists)}"


def help_key(subcommand: str, prog: str, width: int, package: Path = _PACKAGE,
             dependencies: tuple[str, ...] = HELP_DEPENDENCIES) -> str:
    """The cache key of ``<prog> <subcommand> --help`` rendered ``width`` columns wide: a SHA-256 over everything
    that shapes the text (see the module's docstring).

    >>> a = help_key("fit", "lightning-fed", 100, dependencies=())
    >>> a == help_key("fit", "lightning-fed", 100, dependencies=())
    True
    >>> a == help_key("fit", "lightning-fed", 99, dependencies=())  # another width
    False
    """
    from lightning_fed import __version__

    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith("JSONARGPARSE_"))
    parts = [subcommand, prog, str(width), __version__, source_hash(package), sys.version,
             *(f"{name}={_installed(name)}" for name in dependencies), repr(settings)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _width() -> int:
    import shutil

    return shutil.get_terminal_size().columns  # what argparse's HelpFormatter formats for (less 2)


def _prog() -> str:
    return os.path.basename(sys.argv[0])


class _Tee:
    """``sys.stdout`` that also keeps what is written."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.parts = stream, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _store(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the whole new one
    for old in sorted(path.parent.glob("*.txt"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]:
        old.unlink(missing_ok=True)


def main(args: Optional[Any] = None) -> None:
    """Entry point of the ``lightning-fed`` console script: a subcommand's help from the cache where the key
    matches (see the module's docstring), else :func:`lightning_fed.cli.main` (the help rendered live and stored).

    Exits (``SystemExit``) as :func:`lightning_fed.cli.main` does; the cached help returns normally (status 0).
    """
    argv = sys.argv[1:] if args is None else args
    subcommand = help_subcommand(argv)
    path = None
    if subcommand is not None and os.environ.get(CACHE_ENV, "1") != "0":
        try:
            path = cache_dir() / f"{help_key(subcommand, _prog(), _width())}.txt"
            text = path.read_text(encoding="utf-8") if path.is_file() else None
        except Exception:  # anything wrong with the fast path: the live rendering
            path = text = None
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            return
    from lightning_fed.cli import main as live

    if path is None:
        return live(args)
    tee, stdout = _Tee(sys.stdout), sys.stdout
    sys.stdout = tee
    try:
        live(args)
    except SystemExit as exit_:
        if exit_.code in (0, None) and tee.parts:
            try:
                _store(path, "".join(tee.parts))
            except Exception:  # a read-only or full disk: the next help renders live again
                pass
        raise
    finally:
        sys.stdout = stdout


if __name__ == "__main__":  # pragma: no cover
    main()
