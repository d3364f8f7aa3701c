"""A server optimizer's constructor arguments checked by the class the user wrote (``FedAdam(lrr=0.1)`` names
``FedAdam`` and ``lr``, not the base class whose ``__init__`` it inherits), and the methods a subclass may no longer
override (:class:`~lightning_fed.callbacks.ServerOptimizer` refuses them when the subclass is defined)."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Sequence

__all__ = ["REMOVED_OVERRIDES", "check_arguments"]


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
