"""lightning_fed.checks: one set of argument checks for the whole package, one error type and one spelling of each
message shape (issue #52 item 3d). Before: ~26 helpers in 19 files, "positive int" spelt five ways ("a positive int",
"a positive integer", "an int >= 1", "an integer >= 1", "None (3) or an int >= 1"), a TypeError or a ValueError
depending on the file."""

import re
from pathlib import Path

import pytest

from lightning_fed.checks import (
    ArgumentError, check_choice, check_consecutive_limit, check_fraction, check_in_range, check_int,
    check_names, check_non_negative, check_positive, check_positive_int, check_unit_interval,
)

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_fed"


@pytest.mark.parametrize("call, message", [
    (lambda: check_int("n", 0, 1), "`n` must be an integer >= 1, got 0."),
    (lambda: check_int("n", 2.0, 1), "`n` must be an integer >= 1, got 2.0."),
    (lambda: check_int("n", True, 0), "`n` must be an integer >= 0, got True."),
    (lambda: check_int("n", "3"), "`n` must be an integer, got '3'."),
    (lambda: check_int("n", None, 2), "`n` must be an integer >= 2, got None."),
    (lambda: check_int("n", -1, 0, optional=True), "`n` must be an integer >= 0 or None, got -1."),
    (lambda: check_int("n", 0, 1, optional=True, none_means="3"), "`n` must be an integer >= 1 or None (3), got 0."),
    (lambda: check_positive_int("k", 0), "`k` must be an integer >= 1, got 0."),
    (lambda: check_positive("lr", 0.0), "`lr` must be a finite number > 0, got 0.0."),
    (lambda: check_positive("lr", float("inf")), "`lr` must be a finite number > 0, got inf."),
    (lambda: check_positive("lr", True), "`lr` must be a finite number > 0, got True."),
    (lambda: check_non_negative("mu", -1e-9), "`mu` must be a finite number >= 0, got -1e-09."),
    (lambda: check_unit_interval("beta1", 1.0), "`beta1` must be a number in [0, 1), got 1.0."),
    (lambda: check_fraction("f", 0), "`f` must be a number in the open interval (0, 1), got 0."),
    (lambda: check_in_range("phi_max", 0.0, low=0.0, low_open=True),
     "`phi_max` must be a finite number in (0.0, inf), got 0.0."),
    (lambda: check_choice("w", "mean", ("a", "b")), "`w` must be one of ('a', 'b'), got 'mean'."),
    (lambda: check_names("head", []), "`head` must be a non-empty list of submodule or tensor names (e.g. "
     "['classifier']), got []."),
    (lambda: check_names("top", ["fc", 3], "fc"), "`top` must be a non-empty list of submodule or tensor names (e.g. "
     "['fc']), got ['fc', 3]."),
])
def test_each_check_names_the_argument_the_allowed_values_and_the_value(call, message):
    with pytest.raises(ArgumentError) as info:
        call()
    assert str(info.value) == message
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


def test_checks_return_the_value_converted():
    import numpy as np

    assert check_int("n", np.int64(3), 1) == 3 and type(check_int("n", np.int64(3), 1)) is int
    assert check_int("n", None, 1, optional=True) is None
    assert check_positive("lr", 1) == 1.0 and type(check_positive("lr", 1)) is float
    assert check_non_negative("mu", 0) == 0.0 and check_unit_interval("b", 0) == 0.0 and check_fraction("f", 0.5) == 0.5
    assert check_in_range("x", 2, low=1.0, low_open=True, high=3.0) == 2.0 and check_choice("w", "a", ("a",)) == "a"
    assert check_names("head", "fc") == ["fc"] and check_names("head", ("a", "b")) == ["a", "b"]


def test_a_consecutive_limit_is_its_default_a_given_count_or_refused_with_another_policy():
    limit = dict(default=3, policy_name="on_failure", active="skip", policies=("skip", "raise"), why="W.")
    assert [check_consecutive_limit("m", v, policy="skip", **limit) for v in (None, 1, 7)] == [3, 1, 7]
    assert check_consecutive_limit("m", None, policy="raise", **limit) is None
    with pytest.raises(ArgumentError) as info:
        check_consecutive_limit("m", 2, policy="raise", **limit)
    assert str(info.value) == "`m`=2 applies only with on_failure='skip' (of ('skip', 'raise')): W."


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "3"])
def test_the_two_consecutive_failure_limits_are_one_check(value):
    """``max_consecutive_client_failures`` (client/runner.py) and ``max_consecutive_restores`` (guards.py) duplicated
    each other with their own wording; now both are :func:`check_consecutive_limit`: the same message shape."""
    from lightning_fed.client.runner import check_max_consecutive_client_failures
    from lightning_fed.guards import check_max_consecutive_restores

    messages = []
    for check, name in ((check_max_consecutive_client_failures, "max_consecutive_client_failures"),
                        (check_max_consecutive_restores, "max_consecutive_restores")):
        with pytest.raises(ArgumentError) as info:
            check(value)
        messages.append(str(info.value))
        assert str(info.value) == f"`{name}` must be an integer >= 1 or None (3), got {value!r}."
    assert check_max_consecutive_client_failures(None) == check_max_consecutive_restores(None) == 3
    assert check_max_consecutive_client_failures(4) == check_max_consecutive_restores(4) == 4


def _bad_ints():
    """(what, call) of public entry points given a bad integer argument, from every corner of the package."""
    from lightning_fed.algorithms import FedRepClient
    from lightning_fed.datamodules import ClientWork, FederatedDataModule, IIDPartitioner
    from lightning_fed.datamodules.cohorts import CohortSampler
    from lightning_fed.distributed import FederatedDDPStrategy
    from lightning_fed.models.char_lstm import ShakespeareLSTM
    from lightning_fed.models.stackoverflow import RecallAtK
    from lightning_fed.server.aggregators.robust import Krum
    from lightning_fed.server.attacks import choose_malicious_clients
    from lightning_fed.server.client_state import ClientStateTable
    from lightning_fed.server.min_norm import min_norm_frank_wolfe
    from lightning_fed.server.privacy import PrivacyAccountant
    from lightning_fed.vectorized import VectorizedExecutor

    return [
        ("num_clients", 2.5, 1, lambda: IIDPartitioner(2.5)),  # was a TypeError, "an int >= 1"
        ("batch_size", 0, 1, lambda: ClientWork(epochs=1, batch_size=0)),  # "an int >= 1"
        ("clients_per_round", 0, 1, lambda: CohortSampler(0)),  # "a positive integer"
        ("num_workers", -1, 0, lambda: FederatedDataModule(num_workers=-1)),  # "a non-negative integer"
        ("hidden_size", 0, 1, lambda: ShakespeareLSTM(hidden_size=0)),  # "a positive int"
        ("k", 0, 1, lambda: RecallAtK(k=0)),  # "a positive int"
        ("processes_per_device", 0, 1, lambda: FederatedDDPStrategy(processes_per_device=0)),
        ("num_malicious_clients", -1, 0, lambda: Krum(num_malicious_clients=-1)),
        ("num_clients", -1, 0, lambda: choose_malicious_clients(-1, 0.1)),
        ("dim", 0, 1, lambda: ClientStateTable(3, 0)),
        ("max_iter", 0, 1, lambda: min_norm_frank_wolfe([[1.0]], max_iter=0)),
        ("num_clients", 0, 1, lambda: PrivacyAccountant(1.0, 0, 1)),  # "a positive integer"
        ("head_steps", -1, 0, lambda: FedRepClient(head=["x"], head_steps=-1)),
        ("max_parallel", 0, "1 or None", lambda: VectorizedExecutor(max_parallel=0)),  # "a positive integer or None"
    ]


@pytest.mark.parametrize("index", range(14))
def test_every_public_entry_point_refuses_a_bad_int_in_the_one_spelling(index):
    name, value, minimum, call = _bad_ints()[index]
    with pytest.raises(ArgumentError) as info:
        call()
    assert str(info.value) == f"`{name}` must be an integer >= {minimum}, got {value!r}."


#: Message spellings the package used before the checks were one set; none is left (in messages or docstrings).
OLD_SPELLINGS = re.compile(
    r"(`|--\w+) must be (a positive int|a positive integer|an int\b|a non-negative integer|None \(\d+\) or an int"
    r"|> 0, got|a positive number|a float > 0|in \[0, 1\), got)"
)


def test_no_message_in_the_package_spells_a_check_the_old_ways():
    found = [f"{path.relative_to(PACKAGE.parent)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
             for path in sorted(PACKAGE.rglob("*.py")) for text in [path.read_text()]
             for match in OLD_SPELLINGS.finditer(text)]
    assert not found, "argument checks spelt outside lightning_fed.checks:\n" + "\n".join(found)
