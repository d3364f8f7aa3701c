"""The simulated clock (issue #53, lightning_fed/clock.py) against numbers worked out by hand for a small device
table, and against a per-client loop written from the time model of the module doc (FedScale, Lai et al. 2022,
Sec. 4: download + compute + upload; Bonawitz et al. 2019, Sec. 4: deadline and over-selection)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_fed.checks import ArgumentError
from lightning_fed.clock import STATUSES, SimulatedClock, payload_bytes, plan_round, shared_parameters
from lightning_fed.datamodules.devices import DeviceProfiles

IDS = np.array([10, 11, 12, 13])
# client: seconds/sample, download B/s, upload B/s, latency s; every client downloads 1000 B, uploads UP bytes
TABLE = DeviceProfiles(np.array([0.01, 0.1, 0.05, 0.2]), np.array([1000.0, 2000.0, 1000.0, 1000.0]),
                       np.array([500.0, 1000.0, 250.0, 1000.0]), np.array([0.5, 0.0, 0.25, 0.0]))
UP = np.array([1000.0, 1000.0, 500.0, 1000.0])
STEPS = [np.array([10] * 4), np.array([10] * 4), np.array([10, 10, 10, 5]), np.array([10] * 3)]
# by hand: download = 1000/down + lat, upload = UP/up + lat, compute = spp · samples
#   10: 1.5 + 0.01·40 = 0.4 + 2.5 = 4.4     11: 0.5 + 0.1·40 = 4 + 1 = 5.5
#   12: 1.25 + 0.05·35 = 1.75 + 2.25 = 5.25 (its last step holds 5 samples)     13: 1 + 0.2·30 = 6 + 1 = 8
FINISH = [4.4, 5.5, 5.25, 8.0]


def _plan(**kwargs):
    args = dict(start_time=0.0, client_ids=IDS, step_samples=STEPS, download_bytes=1000.0, upload_bytes=UP,
                profiles=TABLE)
    return plan_round(**(args | kwargs))


def _status(plan):
    return [STATUSES[s] for s in plan.status]


def test_client_times_without_a_deadline_match_the_hand_table():
    plan = _plan()
    np.testing.assert_allclose(plan.download_s, [1.5, 0.5, 1.25, 1.0])
    np.testing.assert_allclose(plan.compute_s, [0.4, 4.0, 1.75, 6.0])
    np.testing.assert_allclose(plan.upload_s, [2.5, 1.0, 2.25, 1.0])
    np.testing.assert_allclose(plan.finish_s, FINISH)
    assert plan.steps.tolist() == [4, 4, 4, 3] and _status(plan) == ["kept"] * 4
    assert plan.round_seconds == 8.0 and (plan.bytes_down, plan.bytes_up) == (4000.0, 3500.0)


def test_drop_leaves_out_who_finishes_after_the_deadline_and_the_round_lasts_until_it():
    plan = _plan(round_deadline=5.3)
    assert _status(plan) == ["kept", "missed_deadline", "kept", "missed_deadline"]
    assert plan.kept.tolist() == [10, 12] and plan.steps.tolist() == [4, 0, 4, 0]
    assert plan.round_seconds == 5.3  # the server waited for 11 and 13 until the deadline
    assert plan.bytes_down == 4000.0 and plan.bytes_up == 1500.0
    m = plan.metrics()
    assert m["clock/missed_deadline"] == 2 and m["clock/offline"] == 0 and m["clock/elapsed_seconds"] == 5.3


def test_partial_runs_the_steps_that_fit_floor_of_the_time_left_over_the_step_time():
    plan = _plan(round_deadline=5.3, policy="partial")
    # 11: k = floor((5.3 − 0.5 − 1) / (10 · 0.1)) = 3, finish 0.5 + 3 + 1 = 4.5
    # 13: k = floor((5.3 − 1 − 1) / (10 · 0.2)) = 1, finish 1 + 2 + 1 = 4
    assert plan.steps.tolist() == [4, 3, 4, 1] and _status(plan) == ["kept"] * 4
    np.testing.assert_allclose(plan.finish_s, [4.4, 4.5, 5.25, 4.0])
    np.testing.assert_allclose(plan.compute_s, [0.4, 3.0, 1.75, 2.0])
    assert plan.round_seconds == 5.25 and plan.bytes_up == 3500.0  # every client reported by 5.25
    # a deadline that leaves no step: 13 needs 1 + 1 + 2 = 4 s for one step
    tight = _plan(round_deadline=3.9, policy="partial")
    assert _status(tight)[3] == "missed_deadline" and tight.steps[3] == 0 and tight.round_seconds == 3.9


def test_over_selection_keeps_the_first_to_finish_ties_by_client_id():
    plan = _plan(clients_per_round=2)
    assert _status(plan) == ["kept", "not_needed", "kept", "not_needed"]  # 4.4 and 5.25 come first
    assert plan.round_seconds == 5.25 and plan.bytes_up == 1500.0 and plan.bytes_down == 4000.0
    # with the deadline: 2 made it, the cohort is full, the server does not wait for the deadline
    full = _plan(clients_per_round=2, round_deadline=5.3)
    assert full.round_seconds == 5.25 and _status(full) == ["kept", "not_needed", "kept", "not_needed"]
    until = np.array([np.inf, 5.0, np.inf, 6.0])  # 11 goes while the server waits; 13 after it stopped waiting
    assert _status(_plan(clients_per_round=2, online_until=until)) == ["kept", "offline", "kept", "not_needed"]
    assert _plan(clients_per_round=3, round_deadline=5.3).round_seconds == 5.3  # only 2 of 3: until D
    same = DeviceProfiles(*(np.full(3, v[0]) for v in TABLE))
    tie = plan_round(0.0, np.array([7, 3, 5]), [np.array([10])] * 3, 1000.0, 1000.0, same, clients_per_round=1)
    assert tie.kept.tolist() == [3]


def test_a_client_going_offline_before_it_would_stop_fails_and_the_deadline_comes_first_when_it_is_earlier():
    until = np.array([103.0, np.inf, np.inf, 105.4])  # 10 goes at 3 s (before 4.4); 13 at 5.4 s (before 8)
    plan = _plan(start_time=100.0, online_until=until)
    assert _status(plan) == ["offline", "kept", "kept", "offline"] and plan.round_seconds == 5.5
    assert plan.bytes_up == 1500.0 and plan.end_time == 105.5 and plan.metrics()["clock/offline"] == 2
    plan = _plan(start_time=100.0, online_until=until, round_deadline=5.3)
    # 13 misses the deadline (5.3) before it goes offline (5.4): counted as missed; 11 misses it too
    assert _status(plan) == ["offline", "missed_deadline", "kept", "missed_deadline"]
    assert plan.metrics()["clock/offline"] == 1 and plan.round_seconds == 5.3
    gone = _plan(online_until=np.full(4, 2.0))  # everyone leaves at 2 s: the server learns it then
    assert plan.kept.tolist() == [12] and gone.round_seconds == 2.0 and gone.kept.size == 0


def _loop_reference(profiles, steps, down_bytes, up_bytes, deadline, policy):
    """Each client on its own, from the module doc's formulas (no vectorisation)."""
    out = []
    for i, samples in enumerate(steps):
        spp, dbw, ubw, lat = (float(f[i]) for f in profiles)
        d, u = down_bytes[i] / dbw + lat, up_bytes[i] / ubw + lat
        k = len(samples)
        if deadline is not None and d + spp * sum(samples) + u > deadline:
            if policy == "drop":
                k = 0
            else:
                while k > 0 and d + spp * sum(samples[:k]) + u > deadline:
                    k -= 1
        out.append((k, d + spp * sum(samples[:k]) + u))
    return out


@pytest.mark.parametrize("policy", ["drop", "partial"])
def test_random_tables_match_a_per_client_loop(policy):
    rng = np.random.default_rng(0)
    n = 40
    profiles = DeviceProfiles(rng.lognormal(-4, 1, n), rng.lognormal(13, 1, n), rng.lognormal(11, 1, n),
                              rng.uniform(0, 0.2, n))
    steps = [rng.integers(1, 33, rng.integers(0, 12)) for _ in range(n)]
    down, up = np.full(n, 4e5), rng.uniform(1e5, 4e5, n)
    plan = plan_round(0.0, np.arange(n), steps, down, up, profiles, round_deadline=6.0, policy=policy)
    ref = _loop_reference(profiles, steps, down, up, 6.0, policy)
    kept = [k > 0 or len(s) == 0 and f <= 6.0 for (k, f), s in zip(ref, steps)]
    assert plan.steps.tolist() == [k if keep else 0 for (k, _), keep in zip(ref, kept)]
    assert (plan.status == 0).tolist() == kept and 0 < sum(kept) < n
    np.testing.assert_allclose(plan.finish_s[kept], [f for (_, f), keep in zip(ref, kept) if keep], rtol=1e-12)
    last = max(f for (_, f), keep in zip(ref, kept) if keep)
    assert plan.round_seconds == (6.0 if not all(kept) else pytest.approx(last))


def test_o_cohort_at_a_million_clients():
    """The planner sees only the cohort: the population size does not enter (ids up to 10^6 - 1)."""
    ids = np.array([0, 999_999])
    p = DeviceProfiles(np.full(2, 0.01), np.full(2, 1e6), np.full(2, 1e5), np.zeros(2))
    assert plan_round(0.0, ids, [np.array([20])] * 2, 1e6, 1e5, p).round_seconds == pytest.approx(1 + 0.2 + 1)


def test_payload_bytes_count_the_tensors_that_travel_in_their_dtypes():
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2).to(torch.float64))
    assert payload_bytes(net.parameters()) == (12 + 3) * 4 + (6 + 2) * 8
    every = list(net.parameters())

    class KeepsHead:
        def local_parameters(self):
            return [2, 3]

    assert payload_bytes(shared_parameters(every, net, [KeepsHead()])) == 15 * 4
    assert payload_bytes(shared_parameters(every[:1], net)) == 48  # a frozen bias (not federated) does not travel


def test_the_clock_adds_rounds_and_round_trips_through_its_state():
    clock = SimulatedClock()
    for seconds in (5.3, 5.25, 0.0):
        clock.advance(seconds)
    assert clock.state_dict() == {"elapsed_seconds": 5.3 + 5.25, "rounds": 3}
    other = SimulatedClock()
    other.load_state_dict(clock.state_dict())
    assert other.state_dict() == clock.state_dict()
    with pytest.raises(ArgumentError, match="`round_seconds` must be a finite number >= 0"):
        clock.advance(math.nan)


@pytest.mark.parametrize("kwargs, message", [
    (dict(round_deadline=-1.0), r"`round_deadline` must be a finite number > 0, got -1.0"),
    (dict(round_deadline=0), r"`round_deadline` must be a finite number > 0, got 0"),
    (dict(policy="wait"), r"`policy` must be one of \('drop', 'partial'\), got 'wait'"),
    (dict(clients_per_round=0), r"`clients_per_round` must be an integer >= 1, got 0"),
    (dict(step_samples=STEPS[:2]), r"`step_samples` must hold one array per client \(4\), got 2"),
    (dict(upload_bytes=np.array([1.0, -1.0, 1.0, 1.0])), r"`upload_bytes` must be finite numbers >= 0"),
    (dict(online_until=np.zeros(3)), r"`online_until` must hold one time per client \(4\)"),
])
def test_bad_arguments_are_refused_by_name(kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        _plan(**kwargs)


# --- empty rounds and the clients offline at selection (issue #53, the clock's leftovers) ---------------------------

NOBODY = dict(start_time=40.0, client_ids=np.zeros(0, dtype=np.int64), step_samples=[], download_bytes=1000.0,
              upload_bytes=0.0, profiles=DeviceProfiles(*(np.zeros(0) for _ in range(4))))


def test_an_empty_round_lasts_until_the_deadline_when_there_is_one():
    """By hand: every client leaves at 2 s, before it would finish (4.4 s at the earliest). Without a deadline the
    server learns of the last failure at 2 s (as before); with D = 5.3 it waits for a report until D: 5.3 s, not 2 s.
    Nobody planned: D again (before this change: 0 s)."""
    gone = np.full(4, 2.0)
    assert _plan(online_until=gone).round_seconds == 2.0
    plan = _plan(online_until=gone, round_deadline=5.3)
    assert _status(plan) == ["offline"] * 4 and plan.kept.size == 0 and plan.round_seconds == 5.3
    assert plan.metrics()["clock/offline"] == 4 and plan.bytes_up == 0.0
    late = _plan(online_until=np.array([np.inf, 2.0, np.inf, 1.5]), round_deadline=2.5)  # 10, 12 late; 11, 13 gone
    assert _status(late) == ["missed_deadline", "offline", "missed_deadline", "offline"] and late.round_seconds == 2.5
    assert plan_round(**NOBODY, round_deadline=6.0).round_seconds == 6.0
    assert plan_round(**NOBODY, round_deadline=6.0, idle_until=52.5).round_seconds == 6.0  # the deadline first


def test_an_empty_round_without_a_deadline_waits_for_the_failures_or_until_a_drawn_client_is_back():
    """By hand, from t = 40 s: nobody planned and a client drawn offline back at 52.5 s: 12.5 s; nobody to wait for
    (``idle_until=None``: every candidate dropped out, or nobody was drawn): 0 s. Failure times: clients leaving at
    1, 3.5, 2 and 0.5 s after the start: the last, 3.5 s. A round in which a client reports ignores ``idle_until``."""
    back = plan_round(**NOBODY, idle_until=52.5)
    assert back.round_seconds == 12.5 and back.end_time == 52.5 and back.status.size == 0
    assert plan_round(**NOBODY).round_seconds == 0.0
    assert _plan(start_time=40.0, online_until=40.0 + np.array([1.0, 3.5, 2.0, 0.5])).round_seconds == 3.5
    assert _plan(idle_until=1e9).round_seconds == 8.0
    for bad in (30.0, math.inf, math.nan):
        with pytest.raises(ArgumentError, match=r"`idle_until` must be a finite time >= start_time \(40.0\)"):
            plan_round(**NOBODY, idle_until=bad)


def test_the_plan_reports_the_clients_offline_at_selection():
    assert _plan().metrics()["clock/offline_at_selection"] == 0.0
    plan = _plan(offline_at_selection=3)
    assert plan.offline_at_selection == 3 and plan.metrics()["clock/offline_at_selection"] == 3.0
    with pytest.raises(ArgumentError, match=r"`offline_at_selection` must be an integer >= 0, got -1"):
        _plan(offline_at_selection=-1)
