"""The ``lightning-fed`` command: LightningCLI with the federated trainer, its own server-optimizer argument and
TensorBoard by default."""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import sys
import warnings
from contextvars import ContextVar
from typing import Any, Optional

import yaml
from jsonargparse import DefaultHelpFormatter, Namespace
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_fed._jsonargparse import (ActionTypeHint, previous_config, resolve_class_path_by_name,
                                        subcommands_action)
from lightning_fed._moved import REMOVED_IN, new_paths
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.errors import DataNotFoundError
from lightning_fed.trainer import FederatedTrainer
from lightning_fed.vectorized import VectorizedExecutor  # noqa: F401 - a --trainer.client_executor class by short name

#: TensorBoard under ./runs unless the config or command line names another logger. ``default_hp_metric`` is off:
#: Lightning's placeholder ``hp_metric`` session would be the first one in the run and hide the federated
#: hyper-parameters the loop logs at fit start (see :mod:`lightning_fed.tensorboard`).
DEFAULT_LOGGER = {
    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
    "init_args": {"save_dir": "runs", "default_hp_metric": False},
}

#: The top-level argument holding the server optimizer.
SERVER_OPTIMIZER_KEY = "server_optimizer"

_SUBCOMMANDS = ("fit", "validate", "test", "predict")

#: Set to ``1`` for full error output: jsonargparse's whole message with the usage for a bad argument, the Python
#: traceback for a value a class refused (the same as ``--verbose`` anywhere on the command line).
VERBOSE_ENV = "LIGHTNING_FED_VERBOSE"

#: Exit status of ``lightning-fed`` for a bad argument: a parse error or a value a class refused in ``__init__``
#: (argparse's status for usage errors).
EXIT_BAD_ARGUMENT = 2

_verbose_flag: ContextVar[bool] = ContextVar("lightning_fed_cli_verbose", default=False)

#: Set on an exception raised while the CLI instantiated the config's classes (told apart from one raised by a run).
_INSTANTIATION_ERROR = "_lightning_fed_instantiation_error"

_VERBOSE_HINT = f"--verbose or {VERBOSE_ENV}=1"


def verbose() -> bool:
    """Whether ``lightning-fed`` shows full error output: ``--verbose`` was given (:func:`main` removes it from the
    arguments) or the environment variable :data:`VERBOSE_ENV` is ``1`` / ``true`` / ``yes``.

    >>> import os
    >>> os.environ.get(VERBOSE_ENV) is None and verbose()
    False
    """
    return _verbose_flag.get() or os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


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


def _class_path_of(value: Any) -> Optional[str]:
    """The class path a ``--server_optimizer`` value names (a short name, a class path, or a YAML/JSON mapping with
    ``class_path``), or ``None`` for anything else (``null``, a nested ``--server_optimizer.lr``-style value)."""
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            return None
    if isinstance(value, (dict, Namespace)):
        value = value.get("class_path")
    if not isinstance(value, str) or not value:
        return None
    try:
        class_path = resolve_class_path_by_name(ServerOptimizer, value)
    except ValueError:
        return None
    return class_path if _is_server_optimizer({"class_path": class_path}) else None


_ALGORITHMS = "lightning_fed.algorithms."


def _half(name: str, **init_args: Any) -> Namespace:
    """A client half as the parser holds it in ``trainer.client_algorithms``."""
    return Namespace(class_path=_ALGORITHMS + name, **({"init_args": Namespace(**init_args)} if init_args else {}))


def _flow(init_args: dict[str, Any]) -> str:
    """``{a: 1, b: x}``: init_args as one line of YAML for a command line."""
    return "{" + ", ".join(f"{k}: {yaml.safe_dump(v, default_flow_style=True).strip().removesuffix(chr(10) + '...')}"
                           for k, v in init_args.items()) + "}"


#: How a refused swap is given on purpose: ``null`` first drops the configured server optimizer whole.
_NULL_FIRST = (" (`--server_optimizer null` drops the configured server optimizer, its client half with it; with "
               "configs, read one that gives `server_optimizer: null` before the new one)")


def swap_client_halves(old: Any, new: str, how: str) -> list[Namespace]:
    """The client halves a ready-made server optimizer ``old`` (its parsed ``class_path``/``init_args``) brings itself,
    which a swap to another class ``new`` (short name) must keep: they are a part of the run the user did not change
    (issue #50). A pure client half — FedProx's proximal term, the personalised halves of FedBN, FedPer, FedRep and
    Ditto, and that of a class naming it in ``carried_client_half`` (LG-FedAvg, APFL, pFedMe, Per-FedAvg, FedBABU,
    FedRoD, FedALA) — is returned, to be carried into ``trainer.client_algorithms``; a method without one gives ``[]``.

    A client half that runs only with its own server half (SCAFFOLD's control variates, FedDyn, FedNova's proximal
    solver, Fed-LAMB/Fed-AMS) is not carried alone: the swap is refused, naming the composition that keeps the
    method under ``new`` and the way to drop it whole (``--server_optimizer null`` first). ``how`` names the swap in
    that message (``"`--server_optimizer FedYogi`"``).

    Raises:
        ValueError: ``old`` is a method whose client half needs its server half.

    Example::

        >>> old = Namespace(class_path="lightning_fed.callbacks.fedprox.FedProx",
        ...                 init_args=Namespace(mu=0.01, lr=1.0, weighting="num_samples"))
        >>> swap_client_halves(old, "FedYogi", "`--server_optimizer FedYogi`")
        [Namespace(class_path='lightning_fed.algorithms.FedProxClient', init_args=Namespace(mu=0.01))]
        >>> swap_client_halves(Namespace(class_path="lightning_fed.callbacks.SCAFFOLD"), "FedYogi", "a swap")
        Traceback (most recent call last):
        ...
        ValueError: a swap would drop SCAFFOLD's client half (ScaffoldClient: the control-variate correction c − c_i of every local step), which runs only with its server half (ScaffoldControl). Keep SCAFFOLD under FedYogi by giving both halves: --server_optimizer null --server_optimizer FedYogi --server_optimizer.weighting uniform --server_optimizer.aggregators '[{class_path: lightning_fed.algorithms.ScaffoldControl}]' --trainer.client_algorithms '[{class_path: lightning_fed.algorithms.ScaffoldClient}]' (a config: examples/fashion_mnist_hybrid_plus_scaffold_fedyogi.yaml); or run FedYogi without SCAFFOLD: --server_optimizer null --server_optimizer FedYogi. (`--server_optimizer null` drops the configured server optimizer, its client half with it; with configs, read one that gives `server_optimizer: null` before the new one)
    """
    from lightning_fed.callbacks import SCAFFOLD, Ditto, FedBN, FedDyn, FedNova, FedPer, FedProx, FedRep
    from lightning_fed.callbacks.fedlamb import LocalAdaptiveServer

    cls = _import_class(old.get("class_path") or "") if isinstance(old, (Namespace, dict)) else None
    if cls is None:
        return []
    args = old.get("init_args") or Namespace()
    args = args if isinstance(args, (Namespace, dict)) else Namespace()
    name = cls.__name__
    if issubclass(cls, FedProx):
        return [_half("FedProxClient", mu=args.get("mu"))]
    if issubclass(cls, FedBN):
        return [_half("FedBNClient")]
    if issubclass(cls, FedPer):
        return [_half("FedPerClient", head=args.get("head"))]
    if issubclass(cls, FedRep):
        return [_half("FedRepClient", head=args.get("head"), head_steps=args.get("head_steps", 10))]
    if issubclass(cls, Ditto):
        return [_half("DittoClient", lam=args.get("lam", 0.1), lr=args.get("personal_lr"))]
    carried = getattr(cls, "carried_client_half", None)  # (half's name, {its argument: the method's}), issue #55
    if carried is not None:
        defaults = inspect.signature(cls.__init__).parameters
        return [_half(carried[0], **{k: args.get(src, defaults[src].default) for k, src in carried[1].items()})]

    def compose(server: dict[str, Any], stage: str, stage_args: dict, client: str, client_args: dict,
                what: str, example: str = "") -> str:
        options = "".join(f" --server_optimizer.{k} {v}" for k, v in server.items())
        stage_cfg = f"{{class_path: {_ALGORITHMS}{stage}" + (f", init_args: {_flow(stage_args)}" if stage_args else "")
        client_cfg = f"{{class_path: {_ALGORITHMS}{client}" + (f", init_args: {_flow(client_args)}" if client_args
                                                               else "")
        return (f"{how} would drop {name}'s client half ({client}: {what}), which runs only with its server half "
                f"({stage}). Keep {name} under {new} by giving both halves: --server_optimizer null "
                f"--server_optimizer {new}{options} "
                f"--server_optimizer.aggregators '[{stage_cfg}}}]' --trainer.client_algorithms '[{client_cfg}}}]'"
                f"{f' (a config: {example})' if example else ''}; or run {new} without {name}: "
                f"--server_optimizer null --server_optimizer {new}.{_NULL_FIRST}")

    if issubclass(cls, SCAFFOLD):
        raise ValueError(compose({"weighting": "uniform"}, "ScaffoldControl", {}, "ScaffoldClient", {},
                                 "the control-variate correction c − c_i of every local step",
                                 "examples/fashion_mnist_hybrid_plus_scaffold_fedyogi.yaml"))
    if issubclass(cls, FedDyn):
        alpha = args.get("alpha", 0.01)
        raise ValueError(compose({"weighting": "uniform"}, "FedDynCorrection", {"alpha": alpha}, "FedDynClient",
                                 {"alpha": alpha}, "the dynamic regulariser and its g_k"))
    if issubclass(cls, FedNova) and args.get("local_solver") == "proximal":
        mu = args.get("mu", 0.0)
        raise ValueError(compose({}, "FedNovaAveraging", {"local_solver": "proximal", "mu": mu}, "FedProxClient",
                                 {"mu": mu}, "the proximal term FedNova's normalisation counts on"))
    from lightning_fed.callbacks import IFCA

    if issubclass(cls, IFCA):
        raise ValueError(
            f"{how} would drop IFCA's client half (IFCAClient: each client's choice of its cluster model), which runs "
            f"only with its server half (IFCAClusters, the other clusters' models) and the plain SGD rule. Keep IFCA, "
            f"or run {new} without it: --server_optimizer null --server_optimizer {new}.{_NULL_FIRST}")
    if issubclass(cls, LocalAdaptiveServer):
        raise ValueError(
            f"{how} would drop {name}'s client half (LocalAdaptiveClient: the client optimizer it installs and seeds "
            f"with the server's second moments), which runs only with its own server half (MaxSecondMoment) and no "
            f"other server rule. Keep {name}, or run {new} without it: --server_optimizer null --server_optimizer "
            f"{new}.{_NULL_FIRST}")
    return []


def _carry_client_halves(cfg: Namespace, key: str, halves: list[Namespace]) -> None:
    """Put ``halves`` first in ``cfg[key]`` (``trainer.client_algorithms``), before the halves already there: the
    order they ran in (a method's own halves run before the others)."""
    if not halves:
        return
    existing = cfg.get(key)
    existing = [] if existing is None else list(existing) if isinstance(existing, list) else [existing]
    cfg[key] = [*halves, *existing]


class _SwapFromDefaults(ActionTypeHint):
    """The ``server_optimizer`` argument's action: giving another class (``--server_optimizer FedAvg`` on a FedAdam
    config) starts from that class's defaults instead of jsonargparse's rule of keeping the settings with the same
    names (which would silently give FedAvg FedAdam's ``lr: 0.01``). Settings given after it
    (``--server_optimizer.lr 0.5``) apply; the same class keeps the configured settings. The client half of a
    ready-made method it replaces (FedProx's proximal term) is carried into ``trainer.client_algorithms``, or the
    swap refused where that half needs its server half (:func:`swap_client_halves`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 4:
            _, cfg, value, option = args
            if option in self.option_strings:  # the class itself, not `--server_optimizer.lr`
                new, old_server = _class_path_of(value), cfg.get(self.dest)
                old = old_server.get("class_path") if isinstance(old_server, Namespace) else None
                same = new == old or (_imported_class(new) is not None and _imported_class(new) is _imported_class(old))
                if new is not None and old is not None and not same:  # one class by two paths is no swap
                    short = new.rpartition(".")[2]
                    try:
                        halves = swap_client_halves(old_server, short, f"`--{self.dest} {short}`")
                    except ValueError as err:
                        args[0].error(str(err))
                        raise  # pragma: no cover - error() exits or raises
                    cfg[self.dest] = None
                    _carry_client_halves(cfg, CLIENT_HALVES_KEY, halves)
        return super().__call__(*args, **kwargs)


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


# ------------------------------------------------------------------------------------------------ help text
_ROLE_RE = re.compile(r":(?:[\w-]+:)+`(~?)([^`<]*?)\s*(?:<([^>`]+)>)?`")
_ABBREVIATIONS = {"e.g", "i.e", "al", "cf", "vs", "etc", "Alg", "Sec", "Eq", "Fig", "App", "Tab", "No", "approx", "resp"}


def plain_text(text: str) -> str:
    """Docstring text as a person reads it in ``--help``: Sphinx roles become their name (``:class:`~a.b.C``` → C,
    ``:meth:`a.B.f``` → a.B.f, ``:func:`title <a.f>``` → title) and ````literal```` loses its backticks.

    >>> plain_text("a :class:`~lightning_fed.callbacks.FedAvg` with ``lr=1`` (:meth:`lightning.Trainer.fit`)")
    'a FedAvg with lr=1 (lightning.Trainer.fit)'
    """

    def role(match: re.Match) -> str:
        tilde, name, target = match.groups()
        if target is not None and name:
            return name
        name = (target or name).strip()
        return name.rsplit(".", 1)[-1] if tilde else name

    return re.sub(r"``(.+?)``", r"\1", _ROLE_RE.sub(role, text), flags=re.S)  # a literal may span lines


def first_sentence(text: str) -> str:
    """The first sentence of ``text``'s first paragraph, as plain text (:func:`plain_text`); abbreviations such as
    "e.g." or "et al." do not end it.

    >>> first_sentence("The server optimizer (Reddi et al. 2021, Alg. 1): one callback,\\n e.g. FedAdam. More.\\n\\nOther.")
    'The server optimizer (Reddi et al. 2021, Alg. 1): one callback, e.g. FedAdam.'
    """
    import inspect

    paragraph = inspect.cleandoc(text).split("\n\n", 1)[0]
    paragraph = plain_text(" ".join(line.strip() for line in paragraph.splitlines())).strip()
    for match in re.finditer(r"[.!?](?=\s+[A-Z(\"'])", paragraph):
        word = re.search(r"([\w.]+)$", paragraph[: match.start()])
        if word is not None and word.group(1) in _ABBREVIATIONS:
            continue
        return paragraph[: match.end()]
    return paragraph


def _docstring_summary(obj: Any, first_line: Optional[str] = None) -> Optional[str]:
    """The first sentence of the docstring ``first_line`` was taken from (jsonargparse and Lightning title help
    with a docstring's first *line*, which our wrapped docstrings end mid-sentence), among ``obj``, its classes'
    docstrings and their ``__init__``; else of ``obj``'s own docstring."""
    if isinstance(obj, tuple):
        obj = obj[0] if obj else None
    candidates = [obj]
    if isinstance(obj, type):
        for cls in obj.__mro__:
            candidates += [cls, cls.__dict__.get("__init__")]
    docs = [c.__doc__ for c in candidates if c is not None and isinstance(getattr(c, "__doc__", None), str)]
    docs = [d for d in docs if d.strip()]
    if first_line:
        start = first_line.strip().rstrip(".")
        for doc in docs:
            if doc.strip().startswith(start):
                return first_sentence(doc)
        return plain_text(first_line)
    if isinstance(obj, type):
        return obj.__name__  # no docstring of its own: its name, not jsonargparse's "<class '...'>"
    own = getattr(obj, "__doc__", None)
    return first_sentence(own) if isinstance(own, str) and own.strip() else None


class _PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter with docstring text made plain (:func:`plain_text`): in argument help, group
    titles and descriptions."""

    def _expand_help(self, action: Any) -> str:
        return plain_text(super()._expand_help(action))

    def start_section(self, heading: Optional[str]) -> None:
        super().start_section(plain_text(heading) if heading else heading)

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))


class FederatedArgumentParser(LightningArgumentParser):
    """A :class:`~lightning.pytorch.cli.LightningArgumentParser` that applies :func:`move_server_optimizer` to every
    config it reads (files, strings and objects), so configs with the server optimizer in ``trainer.callbacks``
    keep working next to the ``server_optimizer`` argument.

    Example (the parser of :class:`FederatedCLI`): a config with FedYogi in ``trainer.callbacks``, the old way::

        >>> config = ("{trainer: {logger: false, enable_progress_bar: false, "
        ...           "callbacks: [{class_path: lightning_fed.callbacks.FedYogi, init_args: {lr: 0.01}}]}}")
        >>> cli = FederatedCLI(args=["--config", config, "--model", "lightning_fed.models.MNISTMLP",
        ...                          "--data", "lightning_fed.datamodules.MNISTDataModule",
        ...                          "--data.partitioner", "IIDPartitioner", "--data.partitioner.num_clients", "10"],
        ...                    run=False)
        >>> cli.config.server_optimizer.class_path, cli.config.trainer.callbacks
        ('lightning_fed.callbacks.FedYogi', [])
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # `--trainer.max_ep 7` must be an error, not `max_epochs` (argparse's prefix matching is off)
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _PlainHelpFormatter)
        super().__init__(*args, **kwargs)

    def _create_group_if_requested(self, obj: Any, nested_key: Any, as_group: Any, doc_group: Any, *args: Any,
                                   **kwargs: Any) -> Any:
        """jsonargparse's, with the group's title the first sentence of the class's or method's docstring, as plain
        text, instead of its first line (cut mid-sentence where the docstring wraps)."""
        if as_group:
            doc_group = _docstring_summary(obj, doc_group) or doc_group
        return super()._create_group_if_requested(obj, nested_key, as_group, doc_group, *args, **kwargs)

    def parse_path(self, path: Any, *args: Any, **kwargs: Any) -> Namespace:
        """jsonargparse's, after the config's bounds (:func:`config_size_problem`: its size checked before it is
        read, its YAML aliases before they are expanded), which exit like a bad argument naming the file."""
        source = f"Config {str(path)!r}"
        try:
            file_name = getattr(path, "absolute", None) or str(path)
            size = os.path.getsize(file_name)
            if size > MAX_CONFIG_BYTES:
                self.error(f"{source} is {size / 2**20:.1f} MiB; the limit is {MAX_CONFIG_BYTES / 2**20:g} MiB "
                           "(MAX_CONFIG_BYTES): a config holds settings, not data.")
            with open(file_name, encoding="utf-8") as fh:
                content = fh.read()
        except (OSError, UnicodeDecodeError):
            content = None  # jsonargparse reports an unreadable config
        if content is not None:
            problem = config_size_problem(content, source)
            if problem is not None:
                self.error(problem)
            self._swap(content, source)
        self._checked_content, self._checked_source = content, source
        try:
            return self._move(super().parse_path(path, *args, **kwargs), source)
        finally:
            self._checked_content = None

    def parse_string(self, content: str, *args: Any, **kwargs: Any) -> Namespace:
        if content != getattr(self, "_checked_content", None):  # not the file parse_path read and checked
            problem = config_size_problem(content, "The config")
            if problem is not None:
                self.error(problem)
            self._swap(content, "The config")
        checked = content == getattr(self, "_checked_content", None)
        content = read_new_paths(content, self._checked_source if checked else "The config")
        return self._move(super().parse_string(content, *args, **kwargs), "The config")

    def _swap(self, content: str, source: str) -> None:
        try:
            self._forget_swapped(new_paths(content)[0], source)
        except ValueError as err:  # a method whose client half needs its server half (swap_client_halves)
            self.error(str(err))
            raise  # pragma: no cover - error() exits or raises unless the parser was told otherwise

    @staticmethod
    def _forget_swapped(content: str, source: str = "The config") -> None:
        """A config read after another (``--config a.yaml --config b.yaml``) that names a different server optimizer
        class starts it from that class's defaults: the earlier server optimizer is dropped from the config being
        built before jsonargparse would carry its same-named settings over (see :class:`_SwapFromDefaults`); the
        client half of a ready-made method it replaces is carried into ``trainer.client_algorithms``, or the swap
        refused (:func:`swap_client_halves`, ``ValueError`` naming ``source``)."""
        previous = previous_config()
        if not isinstance(previous, Namespace):
            return
        try:
            raw = yaml.safe_load(content)
        except yaml.YAMLError:
            return  # jsonargparse reports it
        if not isinstance(raw, dict):
            return
        nodes = [("", raw)] + [(f"{name}.", raw[name]) for name in _SUBCOMMANDS if isinstance(raw.get(name), dict)]
        for prefix, node in nodes:
            named = [node.get(SERVER_OPTIMIZER_KEY)]
            trainer = node.get("trainer")
            if isinstance(trainer, dict) and isinstance(trainer.get("callbacks"), list):
                named += trainer["callbacks"]
            new = next((c for c in map(_class_path_of, named) if c is not None), None)
            old_server = previous.get(prefix + SERVER_OPTIMIZER_KEY)
            old = old_server.get("class_path") if isinstance(old_server, Namespace) else None
            if new is not None and old is not None and new != old:
                short = new.rpartition(".")[2]
                halves = swap_client_halves(old_server, short, f"{source} (server optimizer {short})")
                previous[prefix + SERVER_OPTIMIZER_KEY] = None
                _carry_client_halves(previous, prefix + CLIENT_HALVES_KEY, halves)

    def parse_object(self, obj: Any, *args: Any, **kwargs: Any) -> Namespace:
        return self._move(super().parse_object(obj, *args, **kwargs), "The config")

    def error(self, message: str, ex: Optional[Exception] = None) -> Any:
        """A bad argument: ``error: ...`` in a few lines and exit status 2, without jsonargparse's usage dump; a
        misspelt class or option name names the closest known ones (:func:`readable_parse_error`). With
        ``--verbose`` (or ``LIGHTNING_FED_VERBOSE=1``), or when this parser raises instead of exiting, jsonargparse's
        own handling (usage and the full message)."""
        from lightning_fed._jsonargparse import debug_mode_active, report_error

        if verbose() or not self.exit_on_error or debug_mode_active():
            return super().error(message, ex)
        report_error(self, message)
        parser = getattr(ex, "subcommand_parser", None) or self
        readable = readable_parse_error(message, parser)
        prog = parser.prog.replace(" [options]", "")
        sys.stderr.write(f"error: {readable or message}\n")
        sys.stderr.write(f"  (`{prog} --help` lists the options; {_VERBOSE_HINT} shows the parser's full message)\n")
        self.exit(EXIT_BAD_ARGUMENT)

    def _move(self, cfg: Namespace, source: str) -> Namespace:
        try:
            return move_server_optimizer(cfg, source)
        except ValueError as err:
            self.error(str(err))  # usage and message on stderr, exit code 2 (like any bad argument)
            raise  # pragma: no cover - error() exits or raises unless the parser was told otherwise


class FederatedCLI(LightningCLI):
    """``lightning-fed fit --config examples/shakespeare_fedadam.yaml [--server_optimizer FedYogi ...]``.

    A :class:`lightning.pytorch.cli.LightningCLI` whose trainer is :class:`~lightning_fed.FederatedTrainer`
    (``trainer.max_epochs`` counts rounds). ``model`` is any LightningModule and ``data`` any
    :class:`~lightning_fed.datamodules.FederatedDataModule`, each given by ``class_path``/``init_args``. Every
    argument can be overridden on the command line.

    The server optimizer has its own top-level argument, ``server_optimizer``: any
    :class:`~lightning_fed.callbacks.ServerOptimizer` subclass, by short name (``--server_optimizer FedYogi``) or
    class path, with its settings as ``--server_optimizer.lr 0.01``; ``null`` (the default) means
    :class:`~lightning_fed.callbacks.FedAvg` with η = 1. It becomes the first of the trainer's callbacks, so swapping
    it leaves ``trainer.callbacks`` (checkpoints, ...) alone. A different class starts from its own defaults
    (``--server_optimizer FedAvg`` on a FedYogi config gives FedAvg's η = 1, not FedYogi's 0.01), on the command line
    and in a later ``--config`` alike; settings given after it (``--server_optimizer.lr 0.5``, or ``init_args`` in the
    config that names it) apply, and naming the configured class again keeps its settings. A ready-made method's
    own client half outlives the swap (:func:`swap_client_halves`): FedProx's, FedBN's, FedPer's, FedRep's, Ditto's
    and the #55 personalised methods' are carried into ``trainer.client_algorithms``; a swap away from SCAFFOLD,
    FedDyn, FedNova's proximal solver, Fed-LAMB or IFCA (halves that need their server halves) is refused, and
    ``--server_optimizer null`` first drops the configured method whole. Check with
    ``--print_config``. Option names are never abbreviated (``--trainer.max_ep`` is an error). Configs that give the
    server optimizer the old way, in
    ``trainer.callbacks``, still work: it is moved to ``server_optimizer`` as the config is read (``--print_config``
    shows it there). A class named by its path from before a move
    (``lightning_fed.datamodules.cifar.CIFAR10DataModule``, ``lightning_fed._moved``), in a config or on the
    command line, is read as its path now with a ``FutureWarning`` (:func:`read_new_paths`) until 0.3.0.

    ``lightning-fed predict`` runs ``Trainer.predict`` (the global model's ``predict_step``, after ``--ckpt_path``
    restores it) on the data module's ``predict_dataloader``; without one it stops before loading data.

    Errors are short (:meth:`FederatedArgumentParser.error`): ``error: ...`` and one line on how to see more,
    without jsonargparse's usage dump; a misspelt class or option name names the closest known ones
    (:func:`readable_parse_error`). Through :func:`main` (the ``lightning-fed`` command), a value a class refuses in
    ``__init__`` prints that class's own message (:func:`instantiation_error_message`), exit status 2; ``--verbose``
    or ``LIGHTNING_FED_VERBOSE=1`` shows the full parser message or traceback instead.

    Raises:
        SystemExit: (a parser error, exit code 2) a misspelt class or option name, a server optimizer given both as
            ``server_optimizer`` and in ``trainer.callbacks``, two server optimizers in ``trainer.callbacks``, a swap
            that would strand a client half needing its server half (:func:`swap_client_halves`), or
            ``predict`` without a ``predict_dataloader`` on the data module or the model.

    Example: parse and instantiate without running (``run=False``; nothing is read or written)::

        >>> cli = FederatedCLI(args=["--model", "lightning_fed.models.MNISTMLP",
        ...                          "--data", "lightning_fed.datamodules.MNISTDataModule",
        ...                          "--data.partitioner", "IIDPartitioner", "--data.partitioner.num_clients", "10",
        ...                          "--server_optimizer", "FedAdam", "--server_optimizer.lr", "0.03",
        ...                          "--trainer.max_epochs", "3", "--trainer.logger", "false",
        ...                          "--trainer.enable_progress_bar", "false"], run=False)
        >>> type(cli.trainer).__name__, cli.trainer.max_epochs, type(cli.model).__name__, cli.datamodule.partitioner
        ('FederatedTrainer', 3, 'MNISTMLP', IIDPartitioner(num_clients=10, seed=0))
        >>> cli.trainer.callbacks[0]  # the server optimizer comes first
        FedAdam(lr=0.03, weighting='num_samples', beta1=0.9, beta2=0.99, tau=0.001, initial_accumulator=1e-06, bias_correction=False, convention='reddi')
    """

    def __init__(self, args: Optional[Any] = None, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_class", FederatedTrainer)
        kwargs.setdefault("trainer_defaults", {"logger": DEFAULT_LOGGER})
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("parser_class", FederatedArgumentParser)
        argv = sys.argv[1:] if args is None else args
        self._help_of = _help_subcommand(argv)
        if self._help_of is not None:
            # `lightning-fed fit --help`: only that subcommand's parser is built (each takes about a second)
            self.subcommands = lambda: {self._help_of: LightningCLI.subcommands()[self._help_of]}  # type: ignore
        super().__init__(args=args, **kwargs)

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        """Lightning's subcommands, then ``partition`` (run by :func:`main` before this parser is built; listed here
        so that ``lightning-fed --help`` names every subcommand)."""
        trainer_class = self.trainer_class if isinstance(self.trainer_class, type) else None
        summaries = {}
        for name in self.subcommands():
            method = getattr(trainer_class, name, None)
            summaries[name] = _docstring_summary(method) if method is not None else None
            if summaries[name]:
                kwargs[name] = {"description": summaries[name], **kwargs.get(name, {})}
        super()._add_subcommands(parser, **kwargs)
        for choice in subcommands_action(parser)._choices_actions:  # `lightning-fed --help`'s list
            if summaries.get(choice.dest):
                choice.help = summaries[choice.dest]
        if self._help_of is not None:
            return  # `lightning-fed fit --help`: no listing of the others
        summary = "Compute and print a data module's partition (client sizes, label counts) without training."
        listing = FederatedArgumentParser(description=f"{summary} Usage: {PARTITION_USAGE}", add_help=False)
        subcommands_action(parser).add_subcommand("partition", listing, help=summary)
        from lightning_fed.report import REPORT_USAGE

        summary = "Final and best metrics of finished runs, mean ± std over seeds, CSV and curves (from their logs)."
        listing = FederatedArgumentParser(description=f"{summary} Usage: {REPORT_USAGE}", add_help=False)
        subcommands_action(parser).add_subcommand("report", listing, help=summary)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_subclass_arguments(
            ServerOptimizer,
            SERVER_OPTIMIZER_KEY,
            required=False,
            fail_untyped=False,
            help="The server optimizer (ServerOpt), e.g. FedAdam; null = FedAvg with lr 1. Replaces a server "
            "optimizer in trainer.callbacks; a different class starts from its own defaults.",
        )
        for action in parser._actions:
            if action.dest == SERVER_OPTIMIZER_KEY and isinstance(action, ActionTypeHint):
                action.__class__ = _SwapFromDefaults

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)) and any(isinstance(a, str) and new_paths(a)[1] for a in argv):
            argv = [read_new_paths(a, "The command line") if isinstance(a, str) else a for a in argv]
            with warnings.catch_warnings():  # sys.argv's arguments, old paths read as the new ones: not a mix-up
                warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
                super().parse_arguments(parser, argv)
        else:
            super().parse_arguments(parser, args)
        # what command-line arguments added after the configs were read: e.g. `--trainer.callbacks+ FedYogi`
        subcommand = self.config.get("subcommand")
        prefix = f"{subcommand}." if subcommand else ""
        callbacks, found = _server_optimizer_in_callbacks(self.config, prefix)
        given = self.config.get(prefix + SERVER_OPTIMIZER_KEY)
        if found and (given is not None or len(found) > 1):
            names = ", ".join(_describe(callbacks[i]) for i in found)
            first = f"`{SERVER_OPTIMIZER_KEY}` ({_describe(given)}) and " if given is not None else ""
            parser.error(
                f"A server optimizer is given more than once: {first}`trainer.callbacks` ({names}). A federated run "
                f"has exactly one: swap it with `--{SERVER_OPTIMIZER_KEY} NAME` (e.g. `--{SERVER_OPTIMIZER_KEY} "
                f"FedYogi --{SERVER_OPTIMIZER_KEY}.lr 0.01`), which keeps the other callbacks."
            )
        move_client_halves(self.config)  # `--server_optimizer.client ...` given on the command line
        self._check_config_callables(parser, prefix)
        self._check_ckpt_path(parser, prefix)
        if subcommand == "predict":
            self._check_predict_source(parser, prefix)

    def _check_config_callables(self, parser: LightningArgumentParser, prefix: str) -> None:
        """Refuse a ``LocalParts`` (or subclass) ``predicate`` in the config that is not a registered name
        (:data:`~lightning_fed.client.personal.PARTS_PREDICATES`): a config must not name an arbitrary importable
        function, or a ``class_path`` of a callable class, to be called (or instantiated) at fit start."""
        from lightning_fed.client.personal import PARTS_PREDICATES, LocalParts

        def walk(value: Any, key: str) -> None:
            if isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    walk(item, f"{key}[{i}]")
                return
            if not isinstance(value, (Namespace, dict)):
                return
            class_path = value.get("class_path")
            init_args = value.get("init_args")
            cls = _import_class(class_path) if isinstance(class_path, str) else None
            if cls is not None and issubclass(cls, LocalParts) and isinstance(init_args, (Namespace, dict)):
                predicate = init_args.get("predicate")
                if predicate is not None and not (isinstance(predicate, str) and predicate in PARTS_PREDICATES):
                    shown = predicate.get("class_path", predicate) if isinstance(predicate, (Namespace, dict)) \
                        else predicate
                    parser.error(
                        f"{key}.init_args.predicate {shown}: {cls.__name__}'s predicate from a config must be a "
                        f"registered name, one of {sorted(PARTS_PREDICATES)} (register others in Python with "
                        "lightning_fed.client.personal.register_parts_predicate, or pass a callable from Python)."
                    )
            items = value.items() if isinstance(value, dict) else vars(value).items()
            for name, item in items:
                walk(item, f"{key}.{name}" if key else name)

        walk(self.config.get(prefix.rstrip(".")) if prefix else self.config, "")

    def _check_ckpt_path(self, parser: LightningArgumentParser, prefix: str) -> None:
        """Refuse a ``--ckpt_path`` that names a local file or folder that does not exist, before any logger folder
        is created (``last``, ``best``, ``hpc``, ``registry...`` and URLs are Lightning's to resolve)."""
        ckpt_path = self.config.get(prefix + "ckpt_path")
        if not isinstance(ckpt_path, (str, os.PathLike)):
            return
        path = os.fspath(ckpt_path)
        if path in ("last", "best", "hpc") or path.startswith("registry") or "://" in path or os.path.exists(path):
            return
        subcommand = self.config.get("subcommand")
        parser = getattr(self, "_subcommand_parsers", {}).get(subcommand, parser)
        parser.error(f"--ckpt_path {path}: no such file or folder (give a checkpoint written by `lightning-fed fit`, "
                     "or 'last' / 'best').")

    def _check_predict_source(self, parser: LightningArgumentParser, prefix: str) -> None:
        """Refuse ``predict`` up front (before any data is read) when nothing defines ``predict_dataloader``."""
        classes = []
        for key, base in (("data", LightningDataModule), ("model", LightningModule)):
            class_path = (self.config.get(prefix + key) or Namespace()).get("class_path")
            if not class_path:
                continue
            module_name, _, name = class_path.rpartition(".")
            cls = getattr(importlib.import_module(module_name), name)
            if is_overridden("predict_dataloader", cls, parent=base):
                return
            classes.append(f"{key} ({name})")
        parser.error(
            "`lightning-fed predict` needs a `predict_dataloader` (the data the global model predicts on), and neither "
            f"the {' nor the '.join(classes) or 'data module nor the model'} defines one: the federated data modules "
            "have none. Subclass the data module and add `predict_dataloader()` (the model's `predict_step` gets its "
            "batches), or evaluate with `lightning-fed test`."
        )

    def instantiate_classes(self) -> None:
        """Lightning's, with any exception it raises marked as a refused value (a class's ``__init__`` refused a
        setting), which :func:`main` prints as :func:`instantiation_error_message`; the exception itself is
        unchanged."""
        try:
            super().instantiate_classes()
        except Exception as err:
            try:
                setattr(err, _INSTANTIATION_ERROR, True)
            except AttributeError:  # pragma: no cover - an exception type with __slots__: shown in full
                pass
            raise

    def after_fit(self) -> None:
        """Close ``lightning-fed fit`` with :func:`run_summary`: rounds trained, last validation metrics, and where
        the logs, metrics, checkpoints and saved config are (``rank_zero_info``, Lightning's console logger)."""
        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        rank_zero_info(run_summary(self.trainer))

    def instantiate_trainer(self, **kwargs: Any) -> FederatedTrainer:
        """The trainer, with the ``server_optimizer`` argument as the first callback (none: the trainer's FedAvg)."""
        server = self._get(self.config_init, SERVER_OPTIMIZER_KEY)
        if server is None:
            return super().instantiate_trainer(**kwargs)
        trainer_config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        callbacks = trainer_config.get("callbacks")
        if callbacks is None:
            callbacks = []
        elif not isinstance(callbacks, list):
            callbacks = [callbacks]
        trainer_config["callbacks"] = [server, *callbacks]
        extra = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        return self._instantiate_trainer(trainer_config, extra)


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


def _help_subcommand(argv: Any) -> Optional[str]:
    """The subcommand whose help ``argv`` asks for (``fit --help``, ``validate -h ...``), else ``None``.

    >>> _help_subcommand(["fit", "--config", "c.yaml", "--help"]), _help_subcommand(["fit", "--config", "c.yaml"])
    ('fit', None)
    """
    if not isinstance(argv, (list, tuple)) or not argv or argv[0] not in _SUBCOMMANDS:
        return None
    return argv[0] if {"-h", "--help"} & set(argv) else None


def run_summary(trainer: Any) -> str:
    """The closing lines of ``lightning-fed fit``: how many rounds were trained, the last validation metrics, and
    where the run's outputs are.

    Rounds are counted from 0 in the TensorBoard step, the progress bar and the messages (round t of Reddi et al.'s
    Alg. 1, ``trainer.current_epoch``); "N rounds trained" is the count, so validation "after 10 rounds" is logged
    at step 9.

    Lines: ``Trained N round(s) (rounds 0..N-1 ...)`` (resumed from a checkpoint of round k: ``Trained N-k round(s)
    in this process (rounds k..N-1), N in total ...``); ``last validation (round t): val_acc 0.454, ...`` (the
    ``val_*`` values of ``trainer.callback_metrics``, 4 significant digits); with federated evaluation, ``last
    federated evaluation, weighted over clients: fed_personal_val_acc 0.61, fed_val_acc 0.45, ...`` (the
    ``fed_*/weighted`` values, ``fed_personal_*`` included, by name, 4 significant digits); one per logger
    (TensorBoard: the run's folder and the ``tensorboard --logdir`` command; CSV: ``metrics.csv`` and
    ``hparams.yaml``; another logger: its ``log_dir``), or ``no logger``; the saved ``config.yaml`` when there is
    one; one per ModelCheckpoint (its folder, the best checkpoint with its monitored score, the last one).
    """
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    rounds = int(trainer.current_epoch)
    first = min(int(getattr(trainer.fit_loop, "first_round", 0)), rounds)
    if first:  # resumed: this process trained rounds first..rounds-1
        done = f"rounds {first}..{rounds - 1}" if rounds > first else "no round"
        lines = [f"Trained {rounds - first} round(s) in this process ({done}), {rounds} in total (the TensorBoard "
                 "step and the progress bar count rounds from 0)."]
    else:
        last = f"rounds 0..{rounds - 1}" if rounds else "no round"
        lines = [f"Trained {rounds} round(s) ({last}; the TensorBoard step and the progress bar count rounds from 0)."]
    val = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    if val:
        lines.append(f"  last validation (round {rounds - 1}): " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(val.items())))
    fed = {k[: -len("/weighted")]: float(v) for k, v in trainer.callback_metrics.items()
           if k.startswith("fed_") and k.endswith("/weighted")}
    if fed:
        lines.append("  last federated evaluation, weighted over clients: "
                     + ", ".join(f"{k} {v:.4g}" for k, v in sorted(fed.items())))
    config_dirs = []
    for logger in trainer.loggers:
        log_dir = getattr(logger, "log_dir", None) or logger.save_dir
        config_dirs.append(log_dir)
        if isinstance(logger, TensorBoardLogger):
            lines.append(f"  logs and metrics (TensorBoard): {log_dir}  -> tensorboard --logdir {logger.save_dir}")
        elif isinstance(logger, CSVLogger):
            lines.append(f"  metrics (CSV): {os.path.join(log_dir, 'metrics.csv')}; settings: "
                         f"{os.path.join(log_dir, 'hparams.yaml')}")
        else:
            lines.append(f"  logs ({type(logger).__name__}): {log_dir}")
    if not trainer.loggers:
        lines.append("  no logger (trainer.logger is false): no metrics were written")
    for folder in dict.fromkeys([*config_dirs, trainer.default_root_dir]):
        if folder and os.path.isfile(os.path.join(folder, "config.yaml")):
            lines.append(f"  config: {os.path.join(folder, 'config.yaml')}")
            break
    for callback in trainer.checkpoint_callbacks:
        parts = [f"  checkpoints: {callback.dirpath}"]
        if callback.best_model_path and callback.monitor:
            score = callback.best_model_score
            parts.append(f"best ({callback.monitor} {float(score):.4g}): {callback.best_model_path}")
        if callback.last_model_path:
            parts.append(f"last: {callback.last_model_path}")
        elif callback.best_model_path and not callback.monitor:
            parts.append(f"latest: {callback.best_model_path}")
        lines.append(parts[0] + (" (" + "; ".join(parts[1:]) + ")" if len(parts) > 1 else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ readable errors
def _root_cause(err: BaseException) -> BaseException:
    """The innermost exception of ``err``'s chain (``raise ... from``, or raised while handling)."""
    seen = {id(err)}
    while True:
        nxt = err.__cause__ or (None if err.__suppress_context__ else err.__context__)
        if nxt is None or id(nxt) in seen:
            return err
        seen.add(id(nxt))
        err = nxt


def _refusing_object(err: BaseException) -> tuple[Any, dict[str, Any]]:
    """The object whose ``__init__`` raised ``err`` (the outermost ``__init__`` in its traceback that is not the
    CLI's or jsonargparse's own) and that frame's local variables; ``(None, {})`` if none."""
    from jsonargparse import ArgumentParser

    tb = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__":
            obj = frame.f_locals.get("self")
            if obj is not None and not isinstance(obj, (LightningCLI, ArgumentParser)) and not (
                type(obj).__module__.startswith("jsonargparse")
            ):
                return obj, dict(frame.f_locals)
        tb = tb.tb_next
    return None, {}


def instantiation_error_message(err: BaseException) -> str:
    """The few lines ``lightning-fed`` prints for a value a class refused while the config was instantiated: the
    class with the arguments its message names, the message itself, and how to see the full traceback.

    jsonargparse wraps such an error in a "Does not validate against any of the Union subtypes" report that ends
    with a dump of the whole ``Namespace``; the class's own message is the root of the exception chain.

    >>> try:
    ...     try:
    ...         raise ValueError("`lr` must be a finite number > 0, got -1.0.")
    ...     except ValueError as inner:
    ...         raise ValueError("Does not validate against any of the Union subtypes ...") from inner
    ... except ValueError as outer:
    ...     print(instantiation_error_message(outer))
    error: ValueError: `lr` must be a finite number > 0, got -1.0.
      (the full traceback: run again with --verbose or LIGHTNING_FED_VERBOSE=1)
    """
    import inspect

    root = _root_cause(err)
    text = str(root).strip() or type(root).__name__
    obj, local_vars = _refusing_object(root)
    if obj is None:
        head = type(root).__name__
    else:
        try:
            names = [p.name for p in inspect.signature(type(obj)).parameters.values()
                     if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        except (TypeError, ValueError):
            names = []
        extra = local_vars.get("kwargs") if isinstance(local_vars.get("kwargs"), dict) else {}
        names += [k for k in extra if k not in names]
        given = {}
        for name in names:
            if re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text):
                if name in local_vars and name not in ("self", "kwargs"):
                    given[name] = local_vars[name]
                elif name in extra:
                    given[name] = extra[name]
        head = f"{type(obj).__name__}({', '.join(f'{k}={v!r}' for k, v in given.items())})"
    return f"error: {head}: {text}\n  (the full traceback: run again with {_VERBOSE_HINT})"


def data_not_found_message(err: BaseException) -> str:
    """The lines ``lightning-fed`` prints for a task's data that is not there
    (:class:`~lightning_fed.errors.DataNotFoundError`: its message says what is missing and how to get it), instead of
    the traceback: ``error: <message>`` and how to see the traceback (exit status 2).

    >>> print(data_not_found_message(DataNotFoundError("Fashion-MNIST not found: data/FashionMNIST/raw lacks [...].")))
    error: Fashion-MNIST not found: data/FashionMNIST/raw lacks [...].
      (the full traceback: run again with --verbose or LIGHTNING_FED_VERBOSE=1)
    """
    return f"error: {str(err).strip() or type(err).__name__}\n  (the full traceback: run again with {_VERBOSE_HINT})"


_CLASS_PATH_RE = re.compile(r"(?:<class '|\[|, )([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)")


def _import_class(class_path: str) -> Optional[type]:
    module_name, _, name = class_path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return obj if isinstance(obj, type) else None


def _known_class_names(bases: list[type]) -> list[str]:
    """Short names of the classes a ``class_path`` of type ``bases`` accepts (what jsonargparse resolves a short
    name against), with the project's callbacks, data modules and models imported."""
    from lightning_fed._jsonargparse import subclass_paths

    for module in ("lightning_fed.callbacks", "lightning_fed.datamodules", "lightning_fed.models"):
        try:
            importlib.import_module(module)
        except ImportError:  # pragma: no cover - part of the package
            pass
    names: dict[str, None] = {}
    for base in bases:
        try:
            paths = subclass_paths(base)
        except Exception:  # pragma: no cover - jsonargparse's helper refused a type: no suggestion
            continue
        names.update((path.rsplit(".", 1)[1], None) for path in paths)
    return sorted(names)


def _init_arg_names(class_path: str) -> list[str]:
    """The arguments jsonargparse accepts for ``class_path``'s ``init_args`` (parents' ones through ``**kwargs``)."""
    cls = _import_class(class_path)
    if cls is None:
        return []
    try:
        from lightning_fed._jsonargparse import init_parameter_names

        return init_parameter_names(cls)
    except Exception:  # pragma: no cover - fall back to the plain signature
        import inspect

        return [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]


def _did_you_mean(word: str, candidates: list[str], prefix: str = "") -> str:
    close = [prefix + c for c in difflib.get_close_matches(word, candidates, n=3, cutoff=0.6)]
    if not close:
        return ""
    return f" Did you mean {close[0]}?" if len(close) == 1 else f" Did you mean {', '.join(close[:-1])} or {close[-1]}?"


def _key_path(lines: list[str], upto: int) -> list[str]:
    """The nested ``Parser key "k":`` names of jsonargparse's message above line ``upto`` (by indentation)."""
    stack: list[tuple[int, str]] = []
    for line in lines[:upto]:
        match = re.match(r'^(\s*)(?:- )?Parser key "([^"]+)"', line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
    return [key for _, key in stack]


def readable_parse_error(message: str, parser: Any = None) -> Optional[str]:
    """A short version of jsonargparse's error ``message`` for a misspelt class or option name, naming the option
    and the closest known names; ``None`` for other errors (shown as they are).

    Recognised: an unknown class (``--server_optimizer FedYogy``; the closest subclasses of the option's type, e.g.
    the registered server optimizers), an unknown ``init_args`` name (``--server_optimizer.lrr``; the class's
    arguments), an unknown option (``--trainer.max_epoch``, or a config key; the parser's options), and a value of
    the wrong type (``--trainer.max_epochs abc: expected int or null.``; for an ``Optional``/``Union`` option of a
    class, ``FashionMNISTDataModule(eval_fraction='abc'): expected float or null (--data.eval_fraction).``,
    :func:`_nested_union_error`).

    >>> print(readable_parse_error('Parser key "server_optimizer":\\n'
    ...                            '  - Expected a path but FedYogy either not accessible or invalid\\n'
    ...                            "  Subtypes: [<class 'lightning_fed.callbacks.server_optimizer.ServerOptimizer'>, "
    ...                            "<class 'NoneType'>]"))  # doctest: +ELLIPSIS
    --server_optimizer FedYogy: no class of that name (a ServerOptimizer). Did you mean FedYogi, DPFedYogi or ...?
    """
    lines = message.splitlines()
    for i, line in enumerate(lines):
        match = re.search(r"Expected a path but (\S+) either not accessible or invalid", line)
        if match:
            given = match.group(1)
            keys = _key_path(lines, i)
            subtypes = next((ln for ln in lines[i:] if ln.strip().startswith("Subtypes:")), "")
            found = map(_import_class, _CLASS_PATH_RE.findall(subtypes))
            bases = list(dict.fromkeys(cls for cls in found if cls is not None))
            known = _known_class_names(bases)
            short = given.rsplit(".", 1)[-1]
            option = "--" + ".".join(keys) if keys else "the value"
            kind = " or ".join(b.__name__ for b in bases)
            text = f"{option} {given}: no class of that name" + (f" (a {kind})." if kind else ".")
            text += _did_you_mean(short, known)
            if known and len(known) <= 30 and "Did you mean" not in text:
                text += f" Known: {', '.join(known)}."
            return text
        match = re.search(r"Expected a (?:<class '([\w.]+)'>|(.+?))\. Got value: (.*)$", line)
        if match:
            kind = (match.group(1) or match.group(2)).replace("NoneType", "null")
            return f"--{'.'.join(_key_path(lines, i + 1))} {match.group(3)}: expected {kind}."
        match = re.search(r"Option '([^']+)' is not accepted", line)
        if match:
            wrong = match.group(1)
            class_path = None
            for prev in reversed(lines[:i]):
                found = re.search(r"Problem with given class_path '([^']+)'", prev)
                if found:
                    class_path = found.group(1)
                    break
            keys = _key_path(lines, i)
            prefix = "--" + ".".join(keys) + "." if keys else "--"
            name = class_path.rsplit(".", 1)[-1] if class_path else "the class"
            subtypes = next((ln for ln in lines[:i][::-1] if ln.strip().startswith("Subtypes:")), "")
            bases = [base.rsplit(".", 1)[-1] for base in _CLASS_PATH_RE.findall(subtypes)]
            if keys and class_path and name in bases:  # only the option's base class: no class named yet
                return (f"{prefix}{wrong}: no {prefix[:-1]} class given before its settings; name one first "
                        f"({prefix[:-1]} NAME {prefix}{wrong} ..., or class_path in a config).")
            return (f"{prefix}{wrong}: {name} has no argument {wrong!r}."
                    + _did_you_mean(wrong, _init_arg_names(class_path) if class_path else [], prefix))
    nested = _nested_union_error(lines)
    if nested is not None:
        return nested
    key = re.match(r'Parser key "([^"]+)":', message)
    given = re.search(r"^\s*Given value: (.*)$", message, re.M)
    errors = [ln.strip()[2:] for ln in lines if ln.strip().startswith("- ")]
    expected = [re.fullmatch(r"Expected a (?:<class '([\w.]+)'>|([\w.\[\], ]+))", e) for e in errors]
    if key and given and errors and all(expected):
        kinds = [(m.group(1) or m.group(2)).replace("NoneType", "null") for m in expected]
        return f"--{key.group(1)} {given.group(1)}: expected {' or '.join(dict.fromkeys(kinds))}."
    options = sorted({s for p in _parsers(parser) for a in p._actions for s in a.option_strings
                      if s.startswith("--") and not s.endswith(".help")})
    match = re.search(r"unrecognized arguments: (\S+)", message)
    if match:
        return f"{match.group(1)}: no such option." + _did_you_mean(match.group(1), options)
    match = re.search(r"does not accept option '([^']+)'", message)
    if match:  # a key of a config file
        keys = [o[2:] for o in options]
        return f"{match.group(1)} (in a config): no such setting." + _did_you_mean(match.group(1), keys)
    return None


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (``"Sequence[int], <class 'x'>"`` -> two parts)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _type_words(subtype: str) -> str:
    """A type as jsonargparse prints it in ``Subtypes: [...]``, as a person reads it: ``<class 'float'>`` -> float,
    ``<class 'NoneType'>`` -> null, ``typing.Sequence[int]`` -> a list of int, a class -> a <Name> (a class name, or
    class_path and init_args)."""
    match = re.fullmatch(r"<class '([\w.]+)'>", subtype)
    if match:
        name = match.group(1)
        if name == "NoneType":
            return "null"
        if "." not in name:
            return name
        return f"a {name.rsplit('.', 1)[-1]} (a class name, or class_path and init_args)"
    subtype = subtype.replace("typing.", "").replace("collections.abc.", "")
    match = re.fullmatch(r"(?:Sequence|List|list|Tuple|tuple|Iterable)\[(.+?)(?:, \.\.\.)?\]", subtype)
    if match:
        return f"a list of {_type_words(match.group(1))}"
    return subtype


def _nested_union_error(lines: list[str]) -> Optional[str]:
    """The one-line message for a value of the wrong type given to an ``Optional``/``Union`` option of a class
    (``--data.eval_fraction abc``): jsonargparse's nested "Does not validate against any of the Union subtypes"
    report under ``Problem with given class_path 'C'`` becomes ``C(name='abc'): expected float or null
    (--data.eval_fraction).`` (the innermost such report); ``None`` when ``lines`` hold none.

    >>> report = '''Parser key "data":
    ...   Does not validate against any of the Union subtypes
    ...   Errors:
    ...     - Problem with given class_path 'lightning_fed.datamodules.MNISTDataModule':
    ...         Parser key "eval_fraction":
    ...           Does not validate against any of the Union subtypes
    ...           Subtypes: [<class 'float'>, <class 'NoneType'>]
    ...           Errors:
    ...             - Expected a <class 'float'>
    ...             - Expected a <class 'NoneType'>
    ...           Given value type: <class 'str'>
    ...           Given value: abc
    ...     - Expected a <class 'NoneType'>
    ...   Given value type: <class 'jsonargparse._util.NestedArg'>'''
    >>> print(_nested_union_error(report.splitlines()))
    MNISTDataModule(eval_fraction='abc'): expected float or null (--data.eval_fraction).
    """
    best = None
    for i, line in enumerate(lines):
        if i == 0 or "Does not validate against any of the Union subtypes" not in line:
            continue
        head = re.match(r'^\s*(?:- )?Parser key "([^"]+)":', lines[i - 1])
        if head is None:
            continue
        indent = len(line) - len(line.lstrip())
        own = []
        for follow in lines[i + 1:]:
            depth = len(follow) - len(follow.lstrip())
            if follow.strip() and depth < indent:
                break
            if depth == indent:
                own.append(follow.strip())
        subtypes = next((ln[len("Subtypes: "):] for ln in own if ln.startswith("Subtypes: [")), None)
        given = next((ln[len("Given value: "):] for ln in own if ln.startswith("Given value: ")), None)
        given_type = next((ln for ln in own if ln.startswith("Given value type: ")), "")
        if subtypes is None or given is None or "NestedArg" in given_type:
            continue
        class_path = None
        for prev in reversed(lines[:i - 1]):
            found = re.search(r"Problem with given class_path '([^']+)'", prev)
            if found and len(prev) - len(prev.lstrip()) < indent:
                class_path = found.group(1)
                break
        if class_path is None or (best is not None and indent <= best[0]):
            continue
        value = repr(given) if given_type.endswith("<class 'str'>") else given
        kinds = [_type_words(t) for t in _split_top_level(subtypes[1:-1])]
        option = "--" + ".".join(_key_path(lines, i))
        best = (indent, f"{class_path.rsplit('.', 1)[-1]}({head.group(1)}={value}): expected "
                        f"{' or '.join(dict.fromkeys(kinds))} ({option}).")
    return None if best is None else best[1]


def _parsers(parser: Any) -> list[Any]:
    """``parser`` and its subcommand parsers."""
    if parser is None:
        return []
    out = [parser]
    action = subcommands_action(parser)
    if action is not None:
        out += list(getattr(action, "_name_parser_map", {}).values())
    return out


PARTITION_USAGE = (
    "lightning-fed partition --config CONFIG [--plot PATH.png] [--size_unit absolute|percent] [--max_clients N] "
    "[--data.* overrides]"
)


def partition_command(args: list[str]) -> dict[str, Any]:
    """``lightning-fed partition``: compute a config's partition, print its statistics, optionally plot it.

    Reads the same config as ``fit`` (every section is parsed and instantiated as ``fit`` would, with ``run=False``;
    only the data module is used; the trainer's start-up log lines, such as "GPU available" and the FedAvg
    default note, are not printed), runs ``datamodule.prepare_data()`` and ``setup("fit")`` (downloads included), then
    prints the partitioner, the size statistics of :meth:`~lightning_fed.datamodules.Partition.stats` and the
    per-client label counts (the first ``--max_clients`` clients), and with ``--plot PATH`` saves
    :func:`~lightning_fed.tensorboard.label_distribution_figure` there (format from the suffix, e.g. ``.png``).
    Other arguments (``--data.init_args.partitioner.init_args.alpha 0.1``, ...) override the config as in ``fit``.

    Args:
        args: the command-line arguments after ``partition``.

    Returns:
        The partition's :meth:`~lightning_fed.datamodules.Partition.stats` (with ``"label_histogram"`` when labelled).

    Raises:
        SystemExit: (exit code 2) no ``--config``, a bad ``--size_unit`` or ``--max_clients`` < 1, or a config error.
    """
    import argparse

    from lightning_fed.tensorboard import label_distribution_figure

    parser = argparse.ArgumentParser(prog="lightning-fed partition", usage=PARTITION_USAGE,
                                     description="Compute, print and plot the partition of a config's data module.")
    parser.add_argument("--config", action="append", required=True, help="a lightning-fed config (repeatable)")
    parser.add_argument("--plot", default=None, help="save the per-client label distribution figure to this path")
    parser.add_argument("--size_unit", choices=("absolute", "percent"), default="absolute",
                        help="bar lengths: sample counts (absolute, default) or percent of each client's samples")
    parser.add_argument("--max_clients", type=int, default=30,
                        help="clients printed and plotted (the first N, default 30)")
    ns, rest = parser.parse_known_args(args)
    if ns.max_clients < 1:
        parser.error(f"--max_clients must be an integer >= 1, got {ns.max_clients}")
    cli_args = [a for path in ns.config for a in ("--config", path)] + rest
    import logging
    import warnings

    # nothing is trained: the trainer's start-up notes (no server optimizer -> FedAvg, "GPU available: ...",
    # Lightning's tips) are not said; warnings are
    previous_disable = logging.root.manager.disable
    logging.disable(max(logging.INFO, previous_disable))
    try:
        with warnings.catch_warnings():  # the arguments come from sys.argv through main(): not a mix-up
            warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
            cli = FederatedCLI(args=cli_args, run=False)
    finally:
        logging.disable(previous_disable)
    dm = cli.datamodule
    dm.prepare_data()
    dm.setup("fit")
    partition = dm.partition
    stats = partition.stats()
    print(format_partition_stats(partition, stats, ns.max_clients, getattr(dm, "partitioner", None)))
    if ns.plot:
        fig = label_distribution_figure(partition, size_unit=ns.size_unit, max_clients=ns.max_clients)
        fig.savefig(ns.plot)
        print(f"plot: {ns.plot}")
    return stats


def format_partition_stats(partition: Any, stats: dict[str, Any], max_clients: int = 30, partitioner: Any = None) -> str:
    """The text ``lightning-fed partition`` prints: partitioner, sizes, and a clients × classes count table."""
    lines = []
    if partitioner is not None:
        lines.append(f"partitioner: {partitioner!r}")
    lines.append(f"num_clients: {stats['num_clients']}  num_samples: {stats['num_samples']}  "
                 f"num_classes: {stats['num_classes']}")
    lines.append(f"client size: min {stats['size_min']}  median {stats['size_median']:g}  "
                 f"mean {stats['size_mean']:.2f}  std {stats['size_std']:.2f}  max {stats['size_max']}")
    rows = min(max_clients, stats["num_clients"])
    sizes = stats["sizes"]
    hist = stats.get("label_histogram")
    if hist is None:
        lines.append(f"samples per client (first {rows}): " + " ".join(str(int(v)) for v in sizes[:rows]))
        return "\n".join(lines)
    names = partition.label_names
    header = [str(names[k]) if names is not None else str(k) for k in range(hist.shape[1])]
    width = max(max(len(h) for h in header), len(str(int(hist.max()) if hist.size else 0)))
    lines.append(f"label counts, clients x classes (first {rows} of {stats['num_clients']} clients):")
    lines.append("client    size  " + " ".join(h.rjust(width) for h in header))
    for c in range(rows):
        lines.append(f"{c:>6} {int(sizes[c]):>7}  " + " ".join(str(int(v)).rjust(width) for v in hist[c]))
    present = (hist > 0).sum(axis=1)
    lines.append(f"classes per client: min {int(present.min())}  mean {present.mean():.2f}  max {int(present.max())}")
    return "\n".join(lines)


def main(args: Optional[Any] = None) -> None:
    """Entry point of the ``lightning-fed`` console script (``partition`` is handled by :func:`partition_command`,
    ``report`` by :func:`lightning_fed.report.report_command`, the other subcommands by :class:`FederatedCLI`).

    Exit status 2 (:data:`EXIT_BAD_ARGUMENT`) for a bad argument: a parse error, or a value a class refused in its
    ``__init__`` while the config was instantiated, printed as :func:`instantiation_error_message` (two lines). With
    ``--verbose`` anywhere on the command line (removed before parsing; ``validate``/``test``'s own
    ``--verbose true|false`` stays) or ``LIGHTNING_FED_VERBOSE=1``: the full parser message with the usage, or the
    exception itself with its traceback (exit status 1). An error raised by the run itself (after instantiation) is
    never shortened, except a task's data that is not there (:class:`~lightning_fed.errors.DataNotFoundError`):
    ``error: <message>`` (:func:`data_not_found_message`), exit status 2, the traceback with ``--verbose``.
    """
    argv = sys.argv[1:] if args is None else args
    given_verbose = False
    if isinstance(argv, (list, tuple)) and "--verbose" in argv:
        argv, given_verbose = _take_verbose(list(argv))
        args = argv
    token = _verbose_flag.set(given_verbose or _verbose_flag.get())
    try:
        if isinstance(argv, (list, tuple)) and argv and argv[0] == "partition":
            partition_command(list(argv[1:]))
            return
        if isinstance(argv, (list, tuple)) and argv and argv[0] == "report":
            from lightning_fed.report import report_command

            report_command(list(argv[1:]))
            return
        if isinstance(argv, (list, tuple)) and argv and argv[0] in _SUBCOMMANDS and not {"-h", "--help"} & set(argv):
            print(thread_note(), file=sys.stderr)
        import warnings

        with warnings.catch_warnings():  # `--verbose` removed from sys.argv's arguments: not a mix-up
            warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
            FederatedCLI(args=args)
    except Exception as err:
        if not verbose() and isinstance(err, DataNotFoundError):
            print(data_not_found_message(err), file=sys.stderr)
            raise SystemExit(EXIT_BAD_ARGUMENT) from None
        if verbose() or not getattr(err, _INSTANTIATION_ERROR, False):
            raise
        print(instantiation_error_message(err), file=sys.stderr)
        raise SystemExit(EXIT_BAD_ARGUMENT) from None
    finally:
        _verbose_flag.reset(token)


def _take_verbose(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without the ``--verbose`` switch, and whether it was given. ``--verbose true|false`` after
    ``validate`` or ``test`` is those subcommands' own argument (Lightning's: print the results) and stays.

    >>> _take_verbose(["fit", "--verbose", "--config", "c.yaml"])
    (['fit', '--config', 'c.yaml'], True)
    >>> _take_verbose(["test", "--verbose", "false"])
    (['test', '--verbose', 'false'], False)
    """
    out, given = [], False
    own = bool(argv) and argv[0] in ("validate", "test")
    for i, arg in enumerate(argv):
        following = argv[i + 1].lower() if i + 1 < len(argv) else ""
        if arg == "--verbose" and not (own and following in ("true", "false")):
            given = True
            continue
        out.append(arg)
    return out, given


def thread_note() -> str:
    """One line saying how many threads torch computes with and where that number came from (printed by
    ``lightning-fed fit`` and the other training subcommands at start).

    torch runs one thread per core by default; with other work on the same cores (two runs at once, a test suite)
    that oversubscribes them and rounds take 10-30x longer. ``OMP_NUM_THREADS=1`` before the command avoids it.

    >>> thread_note().startswith("torch threads: ")
    True
    """
    import os

    import torch

    given = os.environ.get("OMP_NUM_THREADS")
    source = f"OMP_NUM_THREADS={given}" if given else (
        f"torch's default for {os.cpu_count()} cores; with other work on these cores set OMP_NUM_THREADS=1"
    )
    return f"torch threads: {torch.get_num_threads()} ({source})"


if __name__ == "__main__":  # pragma: no cover
    main()
