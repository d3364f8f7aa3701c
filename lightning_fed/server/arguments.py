"""A server optimizer's constructor arguments checked by the class the user wrote (``FedAdam(lrr=0.1)`` names
``FedAdam`` and ``lr``, not the base class whose ``__init__`` it inherits), the methods a subclass may no longer
override (:class:`~lightning_fed.callbacks.ServerOptimizer` refuses them when the subclass is defined), the
server learning rate given as ``lr`` or on the rule and the deprecated ``client=[...]``. The settings a server
optimizer's ``state_key`` and ``repr`` are derived from are :mod:`lightning_fed.server.fields`' (:func:`fields_of`,
re-exported here)."""

from __future__ import annotations

import difflib
import inspect
import warnings
from typing import Any, Sequence

from lightning_fed.server.checks import check_positive
from lightning_fed.server.fields import fields_of, none_if_infinite  # noqa: F401  (re-exported)
from lightning_fed.server.rules.base import Rule

__all__ = ["REMOVED_OVERRIDES", "check_arguments", "check_removed_overrides", "check_rule_lr"]


def check_arguments(cls: type, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Refuse ``cls(*args, **kwargs)`` before any ``__init__`` runs when the arguments do not fit ``cls.__init__``,
    with an error naming ``cls`` (not the base class whose ``__init__`` it inherits) and, for a misspelt keyword, the
    closest valid one (:func:`difflib.get_close_matches`).

    Raises:
        TypeError: an unknown keyword, too many positional arguments, a missing required one, a repeated one.

    Example::

        >>> from lightning_fed.callbacks import FedAdam
        >>> check_arguments(FedAdam, (), {"lr": 0.1})
        >>> FedAdam(lrr=0.1)
        Traceback (most recent call last):
        ...
        TypeError: FedAdam got an unexpected keyword argument 'lrr'; did you mean 'lr'? (FedAdam's arguments: lr, beta1, beta2, tau, initial_accumulator, bias_correction, weighting, convention, aggregators, client)
    """
    signature = inspect.signature(cls.__init__)
    try:
        signature.bind(None, *args, **kwargs)
        return
    except TypeError as error:
        problem = str(error)
    params = list(signature.parameters.values())[1:]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    valid = f"({cls.__name__}'s arguments: {', '.join(names)})"
    unknown = [k for k in kwargs if k not in names]
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in params):
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise TypeError(f"{cls.__name__} got an unexpected keyword argument {unknown[0]!r}{hint} {valid}") from None
    raise TypeError(f"{cls.__name__}: {problem} {valid}") from None


#: Methods a subclass may no longer define, and what to write instead: the server optimizer does not call them (or
#: not on every path), so an override would be silently ignored; it is refused when the subclass is defined.
REMOVED_OVERRIDES = {
    "step": "the update is a server rule (lightning_fed.server.rules.Rule, `ServerOptimizer(rule=...)`)",
    "init_state": "the update's state is the rule's typed state (Rule.init) or an aggregator stage's (Stage.init_state)",
    "aggregate": "an aggregation is an aggregator chain (`aggregators=[...]` of lightning_fed.server.aggregators.Stage)",
    "client_delta": "a change of each client's contribution is a 'transform' Stage (Stage.client_delta) in `aggregators`",
    "client_weight_counts": "a change of the clients' weights is a 'transform' Stage (Stage.client_counts) in `aggregators`",
}


def check_removed_overrides(cls: type) -> None:
    """Refuse a server optimizer class ``cls`` that defines a method of :data:`REMOVED_OVERRIDES` itself (run when
    the subclass is defined, by ``ServerOptimizer.__init_subclass__``).

    Raises:
        TypeError: naming ``cls``, the method and what to write instead.

    Example::

        >>> check_removed_overrides(type("Mine", (), {"step": None}))
        Traceback (most recent call last):
        ...
        TypeError: Mine defines `step`, which a server optimizer no longer lets a subclass override (it would be ignored): the update is a server rule (lightning_fed.server.rules.Rule, `ServerOptimizer(rule=...)`).
    """
    for name, instead in REMOVED_OVERRIDES.items():
        if name in vars(cls):
            raise TypeError(f"{cls.__name__} defines `{name}`, which a server optimizer no longer lets a subclass "
                            f"override (it would be ignored): {instead}.")


def check_rule_lr(lr: Any, rule: Any) -> Any:
    """The server learning rate of ``ServerOptimizer(lr=..., rule=...)``: with a ``rule``, the rule's (``lr`` unset
    or equal to it); without, ``lr`` (``None``: 1.0, the default). ``lr`` itself is checked finite and > 0.

    Raises:
        TypeError: ``rule`` not a :class:`~lightning_fed.server.rules.Rule`.
        ValueError: ``lr`` not a finite number > 0, or disagreeing with ``rule.lr``, naming both.

    Example::

        >>> from lightning_fed.server.rules import Adam
        >>> check_rule_lr(None, None), check_rule_lr(0.5, None), check_rule_lr(None, Adam(lr=0.01))
        (1.0, 0.5, 0.01)
        >>> check_rule_lr(0.1, Adam(lr=0.01))
        Traceback (most recent call last):
        ...
        ValueError: `lr`=0.1 disagrees with the rule's learning rate 0.01; give the server learning rate on the rule (e.g. `rule: {class_path: Adam, init_args: {lr: 0.01}}`) and leave `lr` unset.
    """
    if rule is not None:
        if not isinstance(rule, Rule):
            raise TypeError(f"`rule` must be a server rule (lightning_fed.server.rules.Rule), got {type(rule).__name__}.")
        if lr is not None and check_positive("lr", lr) != rule.lr:
            raise ValueError(
                f"`lr`={lr!r} disagrees with the rule's learning rate {rule.lr!r}; give the server learning rate "
                "on the rule (e.g. `rule: {class_path: Adam, init_args: {lr: 0.01}}`) and leave `lr` unset."
            )
        lr = rule.lr
    return check_positive("lr", 1.0 if lr is None else lr)


class _ArgumentsCheckedByName:
    """Checks a server optimizer's arguments against ``cls.__init__`` before it is built, so a wrong one is named with
    the class the user wrote (``FedAdam(lrr=0.1)`` would otherwise be a ``TypeError`` of
    ``AdaptiveServerOptimizer.__init__``). A base class of its own, not ``ServerOptimizer.__new__``: jsonargparse reads
    the signature of a class that defines ``__new__`` itself from that ``__new__`` (``*args, **kwargs``), which would
    hide ``ServerOptimizer``'s own arguments from the CLI and YAML."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Raises: TypeError naming ``cls``, the argument, the closest valid keyword and the valid ones."""
        if args or kwargs:
            check_arguments(cls, args, kwargs)
        return super().__new__(cls)


#: The release that drops ``ServerOptimizer(client=...)`` (deprecated for ``FederatedTrainer(client_algorithms=...)``).
CLIENT_REMOVED_IN = "0.3.0"


def warn_client_deprecated(server: Any) -> None:
    """Warn (``DeprecationWarning``, at the line that built ``server``) that ``client=[...]`` of a server optimizer
    is deprecated: the kept way is ``FederatedTrainer(client_algorithms=[...])``, removal in :data:`CLIENT_REMOVED_IN`."""
    level, frame = 3, inspect.currentframe().f_back.f_back  # the caller of ServerOptimizer.__init__
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is server:
        level, frame = level + 1, frame.f_back  # a subclass's __init__ passing `client` on: point past it
    name = type(server).__name__
    warnings.warn(
        f"`{name}(client=[...])` is deprecated and will be removed in lightning_fed {CLIENT_REMOVED_IN}: give the "
        "client halves to the trainer instead, `FederatedTrainer(client_algorithms=[...])` (YAML/CLI: "
        "`trainer.client_algorithms`), which also keeps them when the server optimizer is swapped.",
        DeprecationWarning, stacklevel=level)
