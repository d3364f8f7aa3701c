"""The ``lightning-fed`` command's config rewriting (issue #52: moved out of ``cli.py``): what happens to a config
(file, string or command-line value) as it is read, before jsonargparse applies it — a server optimizer given in
``trainer.callbacks`` moved to ``server_optimizer`` (:func:`move_server_optimizer`), client halves given inside the
server optimizer moved to ``trainer.client_algorithms`` (:func:`move_client_halves`), old class paths read as the new
ones (:func:`read_new_paths`) and oversized or alias-bomb configs refused (:func:`config_size_problem`). Every name
stays importable from :mod:`lightning_fed.cli`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Optional

import yaml
from jsonargparse import Namespace

from lightning_fed._moved import REMOVED_IN, new_paths
from lightning_fed.callbacks.server_optimizer import ServerOptimizer

#: The top-level argument holding the server optimizer.
SERVER_OPTIMIZER_KEY = "server_optimizer"

_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def _imported_class(class_path: Any) -> Any:
    """The object ``class_path`` (``"module.Name"``) names, or ``None`` where it does not import."""
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return None


def _is_server_optimizer(callback: Any) -> bool:
    """Whether a parsed ``trainer.callbacks`` entry (an instance, or a ``class_path`` namespace/dict) is a
    :class:`ServerOptimizer`. A class path that does not import is not one (jsonargparse reports it)."""
    if isinstance(callback, ServerOptimizer):
        return True
    if isinstance(callback, (Namespace, dict)):
        cls = _imported_class(callback.get("class_path"))
        return isinstance(cls, type) and issubclass(cls, ServerOptimizer)
    return False


def _describe(value: Any) -> str:
    if isinstance(value, (Namespace, dict)):
        return str(value.get("class_path", value))
    return type(value).__name__


def _server_optimizer_in_callbacks(cfg: Namespace, prefix: str) -> tuple[list[Any], list[int]]:
    """The ``trainer.callbacks`` list under ``prefix`` and the positions of its server optimizers."""
    callbacks = cfg.get(prefix + "trainer.callbacks")
    if callbacks is None:
        return [], []
    callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
    return callbacks, [i for i, cb in enumerate(callbacks) if _is_server_optimizer(cb)]


def _prefixes(cfg: Namespace) -> list[str]:
    """``""`` for a subcommand's config, ``"fit."`` etc. for the root parser's config."""
    return [""] + [f"{name}." for name in _SUBCOMMANDS if isinstance(cfg.get(name), Namespace)]


def move_server_optimizer(cfg: Namespace, source: str = "the config") -> Namespace:
    """Move a server optimizer given the old way, inside ``trainer.callbacks``, to ``server_optimizer`` (in place).

    Called on every config file/string as it is read, before later command-line arguments apply, so
    ``--config old.yaml --server_optimizer FedYogi`` swaps the optimizer and ``--server_optimizer.lr 0.01``
    changes the configured one's learning rate; the other callbacks stay in ``trainer.callbacks`` in order.

    Raises:
        ValueError: ``source`` gives more than one server optimizer in ``trainer.callbacks``, or gives one there
            and another as ``server_optimizer``.
    """
    for prefix in _prefixes(cfg):
        callbacks, found = _server_optimizer_in_callbacks(cfg, prefix)
        if not found:
            continue
        names = ", ".join(_describe(callbacks[i]) for i in found)
        if len(found) > 1:
            raise ValueError(
                f"{source} gives {len(found)} server optimizers in `{prefix}trainer.callbacks` ({names}); a federated "
                f"run has exactly one: give it as `{prefix}{SERVER_OPTIMIZER_KEY}`."
            )
        existing = cfg.get(prefix + SERVER_OPTIMIZER_KEY)
        if existing is not None:
            raise ValueError(
                f"{source} gives a server optimizer both as `{prefix}{SERVER_OPTIMIZER_KEY}` ({_describe(existing)}) "
                f"and in `{prefix}trainer.callbacks` ({names}); give exactly one, preferably `{SERVER_OPTIMIZER_KEY}`."
            )
        cfg[prefix + SERVER_OPTIMIZER_KEY] = callbacks.pop(found[0])
        cfg[prefix + "trainer.callbacks"] = callbacks
    return move_client_halves(cfg)


#: Where the client halves of a run are given on the command line and in configs (issue #41).
CLIENT_HALVES_KEY = "trainer.client_algorithms"


def move_client_halves(cfg: Namespace) -> Namespace:
    """Move client halves given the old way, inside the server optimizer (``server_optimizer.init_args.client``), to
    ``trainer.client_algorithms`` (in place), so that swapping the server optimizer afterwards
    (``--server_optimizer FedYogi``, a later ``--config``) keeps them: they are a part of the run of their own.
    Halves given this way replace those already in ``trainer.client_algorithms`` (the config read last wins).

    Example::

        >>> cfg = Namespace({"server_optimizer": Namespace(class_path="lightning_fed.callbacks.FedAdam",
        ...                  init_args=Namespace(client=[{"class_path": "lightning_fed.algorithms.FedProxClient"}])),
        ...                  "trainer.client_algorithms": None})
        >>> moved = move_client_halves(cfg)
        >>> moved.server_optimizer.init_args.client, moved["trainer.client_algorithms"]
        (None, [{'class_path': 'lightning_fed.algorithms.FedProxClient'}])
    """
    for prefix in _prefixes(cfg):
        server = cfg.get(prefix + SERVER_OPTIMIZER_KEY)
        if not isinstance(server, Namespace):
            continue
        init_args = server.get("init_args")
        halves = init_args.get("client") if isinstance(init_args, Namespace) else None
        if not halves:
            continue
        cfg[prefix + CLIENT_HALVES_KEY] = list(halves) if isinstance(halves, list) else [halves]
        init_args["client"] = None
    return cfg


#: Largest config (file or string) ``lightning-fed`` reads, in bytes: a config is a few KiB; anything past this is
#: refused before it is read (``error: Config 'x.yaml' is 9.0 MiB; the limit is 8 MiB ...``).
MAX_CONFIG_BYTES = 8 * 2**20

#: Most YAML nodes a config's aliases (``*name``) may add when expanded: a few shared settings add tens; a
#: "billion laughs" alias bomb (10 lines, each alias list naming the previous one 9 times) adds ~10⁹ and is refused
#: before it is expanded.
MAX_ALIAS_EXPANSION = 100_000


def config_size_problem(content: str, source: str) -> Optional[str]:
    """Why ``lightning-fed`` refuses the config text ``content`` (from ``source``, e.g. ``"Config 'a.yaml'"``), or
    ``None``: more than :data:`MAX_CONFIG_BYTES` bytes, or YAML aliases that expand to more than
    :data:`MAX_ALIAS_EXPANSION` extra nodes (counted on the composed node graph, where an alias is shared, so the
    count costs the size of the file, not of the expansion). Text that is not YAML is left to the parser.

    >>> bomb = "a: &a [x, x]\\n" + "".join(f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\\n"
    ...                                    for p, n in zip("abcdefghi", "bcdefghij"))
    >>> print(config_size_problem(bomb, "Config 'bomb.yaml'"))
    Config 'bomb.yaml': its YAML aliases expand to more than 100000 nodes (the limit, MAX_ALIAS_EXPANSION); refusing to expand them.
    >>> config_size_problem("a: &lr 0.1\\nb: *lr\\n", "The config") is None
    True
    """
    size = len(content.encode("utf-8", errors="replace"))
    if size > MAX_CONFIG_BYTES:
        return (f"{source} is {size / 2**20:.1f} MiB; the limit is {MAX_CONFIG_BYTES / 2**20:g} MiB "
                "(MAX_CONFIG_BYTES): a config holds settings, not data.")
    if "*" not in content:  # no alias
        return None
    try:
        root = yaml.compose(content, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return None  # the parser reports it (or it is JSON/Jsonnet that YAML does not read)
    if root is None:
        return None
    expanded: dict[int, int] = {}
    distinct: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:  # the expanded size of each node (memoised: a shared node is counted once per use, not walked)
        node, children_done = stack.pop()
        if id(node) in expanded:
            continue
        distinct.add(id(node))
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            expanded[id(node)] = 1
            continue
        if children_done:
            expanded[id(node)] = 1 + sum(expanded[id(c)] for c in children)
            if expanded[id(node)] - len(distinct) > MAX_ALIAS_EXPANSION:
                return (f"{source}: its YAML aliases expand to more than {MAX_ALIAS_EXPANSION} nodes (the limit, "
                        "MAX_ALIAS_EXPANSION); refusing to expand them.")
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in expanded)
    return None


def read_new_paths(text: str, source: str) -> str:
    """``text`` (a config, a command-line argument) with every class named by an old path
    (``lightning_fed._moved.new_paths``: ``lightning_fed.datamodules.cifar.CIFAR10DataModule``) named by its path
    now, and a ``FutureWarning`` for each naming ``source``, the new path and the version that removes the old one.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     read_new_paths("class_path: lightning_fed.datamodules.iid.IIDPartitioner", "Config 'a.yaml'")
    'class_path: lightning_fed.datamodules.partitioners.iid.IIDPartitioner'
    >>> print(caught[0].message)
    Config 'a.yaml' names `lightning_fed.datamodules.iid.IIDPartitioner`, an old path removed in lightning_fed 0.3.0: read as `lightning_fed.datamodules.partitioners.iid.IIDPartitioner`; write that instead.
    """
    text, replaced = new_paths(text)
    for old, new in replaced:
        warnings.warn(f"{source} names `{old}`, an old path removed in lightning_fed {REMOVED_IN}: read as `{new}`; "
                      "write that instead.", FutureWarning, stacklevel=2)
    return text
