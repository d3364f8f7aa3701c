"""Swapping the server optimizer on the ``lightning-fed`` command line (issue #52: moved out of ``cli.py``):
``--server_optimizer NAME`` over a configured one starts from ``NAME``'s defaults (:class:`_SwapFromDefaults`), and
the client half the replaced ready-made method brought is carried into ``trainer.client_algorithms`` or the swap
refused where that half needs its server half (:func:`swap_client_halves`). Every name stays importable from
:mod:`lightning_fed.cli`.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import yaml
from jsonargparse import Namespace

from lightning_fed._jsonargparse import ActionTypeHint, resolve_class_path_by_name
from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.cli_config import CLIENT_HALVES_KEY, _imported_class, _is_server_optimizer
from lightning_fed.cli_errors import _import_class

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
    solver, Fed-LAMB/Fed-AMS, IFCA's cluster choice) is not carried alone: the swap is refused, naming the composition that keeps the
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
        epochs, steps = args.get("head_epochs"), args.get("head_steps")  # τ_h in epochs (the paper's) or steps
        tau = {"head_epochs": epochs} if epochs is not None else {"head_steps": 10 if steps is None else steps}
        return [_half("FedRepClient", head=args.get("head"), **tau)]
    if issubclass(cls, Ditto):
        init = args.get("personal_init") or "global"  # "initial" also needs DittoInitialModel: refused at fit start
        return [_half("DittoClient", lam=args.get("lam", 0.1), lr=args.get("personal_lr"),
                      **({"personal_init": init} if init != "global" else {}))]
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
                new_class = _imported_class(new)  # imported once
                same = new == old or (new_class is not None and new_class is _imported_class(old))
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
