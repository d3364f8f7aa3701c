"""Every private jsonargparse name lightning_fed uses, in one place, each behind a small named function.

The ``lightning-fed`` command (:mod:`lightning_fed.cli`) needs a few things jsonargparse has no public API for: the
config read before the current one (a different server optimizer in a later config starts from its own defaults),
its type-hint action (subclassed for the ``server_optimizer`` argument), the short-name resolution of a
``class_path``, the classes and ``__init__`` arguments it accepts (for "did you mean" hints), its debug mode and its
error logging. Those private names live here and nowhere else in the package (``tests/test__jsonargparse.py``
checks it), so a jsonargparse release that renames one breaks this module, loudly, at import
(:data:`REQUIRED_SYMBOLS`) or in ``tests/test__jsonargparse.py`` (:data:`INSTANCE_ATTRIBUTES`), never the command
silently — as :mod:`lightning_fed._lightning` does for Lightning.

Supported jsonargparse: :data:`SUPPORTED_JSONARGPARSE` (the ``pyproject.toml`` pin; checked against 4.53).

Example::

    >>> from lightning_fed.callbacks import ServerOptimizer
    >>> resolve_class_path_by_name(ServerOptimizer, "FedAvg")
    'lightning_fed.callbacks.FedAvg'
    >>> previous_config() is None  # no config is being read
    True
"""

from __future__ import annotations

import importlib
from typing import Any

import jsonargparse

#: The jsonargparse versions these private names were checked against (``pyproject.toml``:
#: ``jsonargparse[signatures]>=4.39,<5``, the range of Lightning 2.6's own CLI).
SUPPORTED_JSONARGPARSE = ">=4.39,<5"

#: (module, attribute path) of every private module-level or class-level name used below (or overridden by a
#: subclass in :mod:`lightning_fed.cli`); checked at import.
REQUIRED_SYMBOLS: tuple[tuple[str, str], ...] = (
    ("jsonargparse._actions", "previous_config"),
    ("jsonargparse._typehints", "ActionTypeHint"),
    ("jsonargparse._typehints", "resolve_class_path_by_name"),
    ("jsonargparse._typehints", "get_all_subclass_paths"),
    ("jsonargparse._common", "debug_mode_active"),
    ("jsonargparse._parameter_resolvers", "get_signature_parameters"),
    # overridden by cli.FederatedArgumentParser (group titles): a rename would silently drop the override
    ("jsonargparse", "ArgumentParser._create_group_if_requested"),
)

#: Private instance attributes (set in ``__init__`` or ``add_subcommands``, so not checkable on the class):
#: (owner, attribute). ``tests/test__jsonargparse.py`` checks each on a real parser.
INSTANCE_ATTRIBUTES: tuple[tuple[str, str], ...] = (
    ("ArgumentParser", "_error_handler"),
    ("ArgumentParser with subcommands", "_subcommands_action"),
)


def _resolve(module: str, path: str) -> Any:
    try:
        obj: Any = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"lightning_fed needs the private jsonargparse name {module}.{path}, which the installed jsonargparse "
            f"{jsonargparse.__version__} lacks ({error}); lightning_fed supports jsonargparse"
            f"{SUPPORTED_JSONARGPARSE}: install a supported version (pip install "
            f"'jsonargparse[signatures]{SUPPORTED_JSONARGPARSE}')."
        ) from error
    return obj


_SYMBOLS = {f"{module}:{path}": _resolve(module, path) for module, path in REQUIRED_SYMBOLS}


def _symbol(module: str, path: str) -> Any:
    return _SYMBOLS[f"{module}:{path}"]


#: jsonargparse's action for an argument typed by a type hint (a ``class_path``/``init_args`` class argument);
#: ``cli_swaps._SwapFromDefaults`` subclasses it. Called as ``action(parser, cfg, value, option_string)``.
ActionTypeHint: type = _symbol("jsonargparse._typehints", "ActionTypeHint")


def previous_config() -> Any:
    """The config (a ``Namespace``) built from the configs and arguments read before the one being read now, or
    ``None`` outside a parse."""
    return _symbol("jsonargparse._actions", "previous_config").get()


def resolve_class_path_by_name(base: Any, name: str) -> str:
    """The full import path jsonargparse resolves ``name`` (a short class name or a path) to among the subclasses of
    ``base``; ``name`` itself where it resolves to none."""
    return _symbol("jsonargparse._typehints", "resolve_class_path_by_name")(base, name)


def subclass_paths(base: type) -> list[str]:
    """The import paths of the (imported) classes a ``class_path`` of type ``base`` accepts."""
    return _symbol("jsonargparse._typehints", "get_all_subclass_paths")(base)


def init_parameter_names(cls: type) -> list[str]:
    """The arguments jsonargparse accepts for ``cls``'s ``init_args`` (parents' ones through ``**kwargs``)."""
    return [p.name for p in _symbol("jsonargparse._parameter_resolvers", "get_signature_parameters")(cls)]


def debug_mode_active() -> bool:
    """Whether jsonargparse's debug mode is on (``JSONARGPARSE_DEBUG``): its parsers raise instead of exiting."""
    return bool(_symbol("jsonargparse._common", "debug_mode_active")())


def report_error(parser: Any, message: str) -> None:
    """What jsonargparse's ``ArgumentParser.error`` does with ``message`` before it prints and exits: log it to the
    parser's logger and call the parser's (deprecated) error handler, if one is set."""
    parser.logger.error(message)
    handler = parser._error_handler
    if callable(handler):
        handler(parser, message)


def subcommands_action(parser: Any) -> Any:
    """The subcommands action of ``parser`` (after ``add_subcommands``; ``None`` for a parser without subcommands):
    its ``_choices_actions`` are the listing of ``--help``, its ``add_subcommand`` adds one."""
    return getattr(parser, "_subcommands_action", None)
