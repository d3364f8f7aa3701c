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


def test_the_server_learning_rate_is_the_rules_or_lr_and_a_disagreement_or_a_non_rule_is_refused():
    from lightning_fed.server.arguments import check_rule_lr
    from lightning_fed.server.rules import SGD, Adam

    assert check_rule_lr(None, None) == 1.0 and check_rule_lr(0.25, None) == 0.25
    assert check_rule_lr(None, Adam(lr=0.01)) == 0.01 and check_rule_lr(0.01, Adam(lr=0.01)) == 0.01
    with pytest.raises(ValueError, match=r"^`lr`=0\.5 disagrees with the rule's learning rate 0\.1; give the server "
                                         r"learning rate on the rule"):
        check_rule_lr(0.5, SGD(0.1))
    with pytest.raises(TypeError, match=r"^`rule` must be a server rule \(lightning_fed\.server\.rules\.Rule\), got "
                                        r"str\.$"):
        check_rule_lr(None, "adam")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=r"`lr`"):
            check_rule_lr(bad, None)


def test_removed_overrides_are_refused_on_any_class_and_others_pass():
    from lightning_fed.server.arguments import check_removed_overrides

    check_removed_overrides(type("Fine", (), {"extra_repr": lambda self: ""}))
    with pytest.raises(TypeError, match=r"^Mine defines `aggregate`, which a server optimizer no longer lets a "
                                        r"subclass override \(it would be ignored\): an aggregation is an aggregator "
                                        r"chain"):
        check_removed_overrides(type("Mine", (), {"aggregate": None}))
