"""server/arguments.py: a server optimizer's arguments are checked by the class the user wrote, and a subclass may not
override what the server optimizer no longer calls (issue #52 moved them out of callbacks/server_optimizer.py)."""

from __future__ import annotations

import pytest

from lightning_fed.callbacks import FedAvg, ServerOptimizer
from lightning_fed.server.arguments import REMOVED_OVERRIDES, check_arguments


def test_a_misspelt_keyword_names_the_class_written_and_the_closest_argument():
    check_arguments(FedAvg, (), {"lr": 0.5, "weighting": "uniform"})  # fits: nothing raised
    with pytest.raises(TypeError, match=r"^FedAvg got an unexpected keyword argument 'weigting'; did you mean "
                                        r"'weighting'\? \(FedAvg's arguments: lr, weighting, aggregators, client"):
        FedAvg(weigting="uniform")
    with pytest.raises(TypeError, match=r"^FedAvg: too many positional arguments \(FedAvg's arguments: lr,"):
        check_arguments(FedAvg, (1.0, "uniform", None, None, None, None, None, None), {})


@pytest.mark.parametrize("name", sorted(REMOVED_OVERRIDES))
def test_a_subclass_defining_a_removed_override_is_refused_naming_it(name):
    with pytest.raises(TypeError, match=rf"Mine defines `{name}`, which a server optimizer no longer lets a subclass "
                                        r"override \(it would be ignored\): "):
        type("Mine", (ServerOptimizer,), {name: lambda self: None})
