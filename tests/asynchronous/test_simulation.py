"""AsyncSimulation against NumPy references of FedBuff (Nguyen et al., AISTATS 2022, Alg. 1) and FedAsync (Xie,
Koyejo, Gupta 2019, Alg. 1) on a fixed event schedule; the degenerate case against the synchronous FedAvg step;
resume, memory, availability and the refusals."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from lightning_fed.asynchronous import AsyncConfig, AsyncSimulation, StalenessWeighting
from lightning_fed.checks import ArgumentError
from lightning_fed.client.update import ClientUpdate
from lightning_fed.datamodules.devices import DeviceModel, DeviceProfiles, ParametricDeviceModel
from lightning_fed.server.composer import ServerComposer
from lightning_fed.server.rules import SGD, Adam

# four clients on a 2-d linear model; client c's local work: one gradient step on ½xᵀA_c x − b_cᵀx with lr 0.3;
# it takes DURATIONS[c] seconds (one sample, instantaneous network): no two reports fall at one time before 17 s
DURATIONS = [1.0, 1.7, 2.9, 4.3]
A = [np.diag([1.0, 2.0]), np.array([[2.0, 0.5], [0.5, 1.0]]), np.diag([0.5, 3.0]), np.array([[1.5, -0.3], [-0.3, 0.8]])]
B = [np.array([1.0, -1.0]), np.array([0.5, 2.0]), np.array([-2.0, 0.3]), np.array([0.7, 0.7])]
LR = 0.3
X0 = np.array([0.2, -0.4])


class Durations(DeviceModel):
    def profiles(self, ids):
        n = len(ids)
        return DeviceProfiles(np.array([DURATIONS[c] for c in ids]), np.full(n, np.inf), np.full(n, np.inf),
                              np.zeros(n))


def local_delta(c, x):
    return -LR * (A[c] @ x - B[c])


def reference(num_steps, buffer_size, s, eta, max_staleness=None, mixing=None):
    """Alg. 1 of each paper written out: every client is always training (population = concurrency), a reporting
    client is dispatched again at once with the model of that moment."""
    x, version, buffer, dropped = X0.copy(), 0, [], 0
    start = {c: (X0.copy(), 0) for c in range(4)}
    queue = [(DURATIONS[c], c) for c in range(4)]
    steps, seen = [], set()
    while len(steps) < num_steps:
        t, c = min(queue)
        queue.remove((t, c))
        assert t not in seen  # the schedule has no ties
        seen.add(t)
        x_v, v = start[c]
        tau = version - v
        if max_staleness is not None and tau > max_staleness:
            dropped += 1
        elif mixing is None:  # FedBuff: Δ ← Δ + s(τ)Δ_i; after K: x ← x + η_g Δ/K (Δ_i = y − x: sign flipped)
            buffer.append((c, tau, s(tau) * local_delta(c, x_v)))
        else:  # FedAsync: x_t = (1 − α_t) x_{t−1} + α_t x_new, α_t = α s(t − τ)
            alpha = mixing * s(tau)
            x = (1 - alpha) * x + alpha * (x_v + local_delta(c, x_v))
            buffer.append((c, tau, None))
        if len(buffer) == buffer_size:
            if mixing is None:
                x = x + eta * sum(d for _, _, d in buffer) / buffer_size
            version += 1
            steps.append((x.copy(), [c for c, _, _ in buffer], [tau for _, tau, _ in buffer], dropped))
            buffer, dropped = [], 0
        start[c] = (x.copy(), version)
        queue.append((t + DURATIONS[c], c))
    return steps


def simulation(config, eta):
    train = lambda c, p, k: ClientUpdate(c, [torch.from_numpy(local_delta(c, p[0].numpy()))], 1, 1, 0.0)  # noqa: E731
    return AsyncSimulation(config, 4, train, ServerComposer("uniform", None, SGD(lr=eta)).update, Durations(),
                           lambda c, k: np.array([1]))


@pytest.mark.parametrize("staleness, buffer_size, max_staleness", [
    (StalenessWeighting("fedbuff"), 2, None),
    (StalenessWeighting("polynomial", a=1.0), 3, 1),
    (StalenessWeighting("hinge", a=2.0, b=1), 2, 2),
])
def test_fedbuff_equals_numpy_algorithm_1(staleness, buffer_size, max_staleness):
    s = lambda tau: staleness(np.array([tau]))[0]  # noqa: E731 (the formulas are tested against the paper apart)
    expected = reference(7, buffer_size, s, 0.8, max_staleness)
    sim = simulation(AsyncConfig(4, buffer_size, staleness, max_staleness), 0.8)
    x = [torch.from_numpy(X0.copy())]
    for x_ref, clients, taus, dropped in expected:
        step = sim.step(x)
        np.testing.assert_allclose(x[0].numpy(), x_ref, rtol=0, atol=1e-9)
        assert step.client_ids.tolist() == clients and step.staleness.tolist() == taus
        assert step.dropped_stale == dropped
    assert max(max(t) for _, _, t, _ in expected) > 0  # stale updates did occur
    if max_staleness is not None:
        assert sum(d for *_, d in expected) > 0  # and were dropped


def test_fedasync_equals_numpy_mixing():
    staleness = StalenessWeighting("polynomial", a=0.5)
    expected = reference(12, 1, lambda tau: (tau + 1.0) ** -0.5, None, mixing=0.6)
    sim = simulation(AsyncConfig(4, 1, staleness, mixing=0.6), 1.0)
    x = [torch.from_numpy(X0.copy())]
    for x_ref, clients, taus, _ in expected:
        step = sim.step(x)
        np.testing.assert_allclose(x[0].numpy(), x_ref, rtol=0, atol=1e-9)
        assert step.client_ids.tolist() == clients and step.staleness.tolist() == taus
        np.testing.assert_allclose(step.weights, [0.6 * (taus[0] + 1.0) ** -0.5], rtol=1e-15)
    assert max(t[0] for *_, t, _ in expected) >= 2


def _linear_train(c, p, k=None):
    """Two local gradient steps (lr 0.1) of least squares on client c's 4 samples, float32."""
    g = torch.Generator().manual_seed(100 + c)
    features, targets = torch.randn(4, 3, generator=g), torch.randn(4, generator=g)
    w = p[0].clone()
    for _ in range(2):
        w = w - 0.1 * features.T @ (features @ w - targets) / 4
    return ClientUpdate(c, [w - p[0]], 4, 2, 0.0)


def test_degenerate_case_is_synchronous_fedavg_bit_for_bit():
    """K = concurrency = cohort size, equal devices and local work, s ≡ 1: each server step is the synchronous
    step (the project's ServerComposer: FedAvg's weighted mean, FedAdam's rule) on the cohort dispatched together,
    in client id order. Through the pure pieces (the loop has no asynchronous mode yet)."""
    config = AsyncConfig(concurrency=4, buffer_size=4, staleness=StalenessWeighting("constant"), seed=7)
    sim = AsyncSimulation(config, 10, _linear_train, ServerComposer("num_samples", None, Adam(lr=0.05)).update,
                          ParametricDeviceModel(0.01), lambda c, k: np.array([4, 4]))
    synchronous = ServerComposer("num_samples", None, Adam(lr=0.05))
    x_async, x_sync = [torch.zeros(3)], [torch.zeros(3)]
    cohorts = []
    for _ in range(4):
        step = sim.step(x_async)
        cohort = step.client_ids.tolist()
        assert cohort == sorted(set(cohort)) and len(cohort) == 4 and step.staleness.tolist() == [0] * 4
        synchronous.update(x_sync, [_linear_train(c, x_sync) for c in cohort])
        assert torch.equal(x_async[0], x_sync[0])
        cohorts.append(cohort)
    assert len({tuple(c) for c in cohorts}) > 1  # new cohorts each step


def _lognormal_run(config):
    composer = ServerComposer("uniform", None, Adam(lr=0.05))
    sim = AsyncSimulation(config, 30, _linear_train, composer.update,
                          ParametricDeviceModel(0.01, compute_sigma=1.0, network_sigma=0.5, seed=3),
                          lambda c, k: np.array([4, 4]), download_bytes=1e4, upload_bytes=1e4)
    return sim, composer


def test_resume_mid_run_is_bit_for_bit(tmp_path):
    config = AsyncConfig(concurrency=8, buffer_size=3, max_staleness=3, seed=5)
    sim, _ = _lognormal_run(config)
    x = [torch.zeros(3)]
    full = [(sim.step(x), x[0].clone()) for _ in range(8)]
    sim, composer = _lognormal_run(config)
    x = [torch.zeros(3)]
    for _ in range(3):
        sim.step(x)
    torch.save({"sim": sim.state_dict(), "server": composer.state_dict(), "x": x}, tmp_path / "state.pt")
    assert len(sim.in_flight) == 7 and len({e.version for e in sim.in_flight}) >= 2  # mid-run: stale clients out
    state = torch.load(tmp_path / "state.pt", weights_only=False)
    sim, composer = _lognormal_run(config)
    sim.load_state_dict(state["sim"])
    composer.load_state_dict(state["server"])
    x = state["x"]
    for step, x_full in full[3:]:
        resumed = sim.step(x)
        assert torch.equal(x[0], x_full)
        assert resumed.time == step.time and resumed.client_ids.tolist() == step.client_ids.tolist()
        assert resumed.staleness.tolist() == step.staleness.tolist()
    assert sum(s.dropped_stale for s, _ in full) > 0 and sim.dropped_stale_total > 0


def test_same_seed_same_events_other_seed_other_clients():
    runs = []
    for seed in (1, 1, 2):
        sim, _ = _lognormal_run(AsyncConfig(concurrency=8, buffer_size=3, seed=seed))
        x = [torch.zeros(3)]
        runs.append([(s.time, s.client_ids.tolist(), x[0].clone()) for s in (sim.step(x) for _ in range(4))])
    assert [(t, c) for t, c, _ in runs[0]] == [(t, c) for t, c, _ in runs[1]]
    assert all(torch.equal(a[2], b[2]) for a, b in zip(runs[0], runs[1]))
    assert [c for _, c, _ in runs[0]] != [c for _, c, _ in runs[2]]


def test_memory_holds_only_referenced_versions_at_most_max_staleness_plus_one():
    sim, _ = _lognormal_run(AsyncConfig(concurrency=12, buffer_size=2, max_staleness=2, seed=0))
    x = [torch.zeros(3)]
    for _ in range(15):
        sim.step(x)
        assert len(sim.versions) <= 3 and set(sim.versions) <= set(sim.references)
        assert all(sim.version - v <= 2 for v in sim.versions)
        live = {e.version for e in sim.in_flight if sim.version - e.version <= 2}
        assert set(sim.versions) == live
        assert sim.memory_bytes()["versions"] == 12 * len(sim.versions)  # 3 float32 each
    assert sim.dropped_stale_total > 0


class _EvenOnline(DeviceModel):
    """Odd clients never online; client c's device goes offline at 0.3 + 0.1·c s, after which it is back."""

    def profiles(self, ids):
        n = len(ids)
        return DeviceProfiles(np.full(n, 0.05), np.full(n, np.inf), np.full(n, np.inf), np.zeros(n))

    def is_online(self, ids, t):
        return np.asarray(ids) % 2 == 0

    def online_until(self, ids, t):
        ids = np.asarray(ids, dtype=np.float64)
        return np.where(t < 0.3 + 0.1 * ids, 0.3 + 0.1 * ids, np.inf)


def test_availability_filters_dispatch_and_offline_clients_are_counted():
    sim = AsyncSimulation(AsyncConfig(concurrency=3, buffer_size=2), 10, _linear_train,
                          ServerComposer("uniform", None, SGD()).update, _EvenOnline(), lambda c, k: np.array([4, 4]))
    x = [torch.zeros(3)]
    steps = [sim.step(x) for _ in range(6)]
    assert all(c % 2 == 0 for s in steps for c in s.client_ids.tolist())
    assert sum(s.offline for s in steps) == sim.offline_total > 0


def test_refusals_name_the_argument():
    with pytest.raises(ArgumentError, match="`concurrency` must be an integer >= 1"):
        AsyncConfig(concurrency=0)
    with pytest.raises(ArgumentError, match="`max_staleness` must be an integer >= 0"):
        AsyncConfig(concurrency=2, max_staleness=-1)
    with pytest.raises(ArgumentError, match="`mixing` must be a finite number in"):
        AsyncConfig(concurrency=2, buffer_size=1, mixing=1.5)
    with pytest.raises(ArgumentError, match="`staleness` must be a StalenessWeighting"):
        AsyncConfig(concurrency=2, staleness="fedbuff")
    with pytest.raises(ArgumentError, match="`num_clients` must be an integer >= 5"):
        AsyncSimulation(AsyncConfig(concurrency=5), 4, _linear_train, None, ParametricDeviceModel(), None)


class _NeverOnline(_EvenOnline):
    def is_online(self, ids, t):
        return np.zeros(len(ids), dtype=bool)


def test_no_client_online_is_an_error_naming_the_time():
    sim = AsyncSimulation(AsyncConfig(concurrency=2, buffer_size=1), 4, _linear_train,
                          ServerComposer("uniform", None, SGD()).update, _NeverOnline(), lambda c, k: np.array([1]))
    with pytest.raises(RuntimeError, match="stuck at simulated time 0.0 s"):
        sim.step([torch.zeros(3)])
    assert math.isfinite(sim.time)


def test_ties_go_by_client_id_and_all_reports_of_a_time_come_before_new_dispatches():
    """Three clients of equal devices, K = 1: all report at 0.04 s; steps in id order 0, 1, 2 with τ = 0, 1, 2
    (each later one started from version 0 while the server stepped), and the clients dispatched after them start
    from version 3 (no dispatch between reports of one time)."""
    trained, planned = [], []

    def train(c, p, k):
        trained.append((c, k))
        return _linear_train(c, p)

    def samples(c, k):
        planned.append((c, k))
        return np.array([4])

    sim = AsyncSimulation(AsyncConfig(concurrency=3, buffer_size=1, staleness=StalenessWeighting("constant")), 3,
                          train, ServerComposer("uniform", None, SGD()).update, ParametricDeviceModel(0.01),
                          samples, download_bytes=0.0, upload_bytes=0.0)
    x = [torch.zeros(3)]
    steps = [sim.step(x) for _ in range(3)]
    assert [s.client_ids.tolist() for s in steps] == [[0], [1], [2]]
    assert [s.staleness.tolist() for s in steps] == [[0], [1], [2]]
    assert [s.time for s in steps] == [0.04, 0.04, 0.04]
    assert [s.dispatched for s in steps] == [3, 0, 0]
    step = sim.step(x)
    assert step.dispatched == 3 and step.staleness.tolist() == [0] and step.time == 0.08
    assert step.metrics(previous_time=0.04)["async/updates_per_hour"] == pytest.approx(3600 / 0.04)
    # each dispatch k (unique in the run) is handed to the local work's plan and to the training of that client
    assert sorted(k for _, k in planned) == list(range(6)) and set(trained) <= set(planned)
    assert [c for c, _ in trained] == [0, 1, 2, 0]


def test_a_failed_client_is_counted_and_not_buffered():
    """``train`` returning ``None`` (the loop's failing or non-finite client): counted in ``AsyncStep.failed``, its
    slot refilled, the step still waits for K updates."""
    def train(c, p, k):
        return None if c == 0 else ClientUpdate(c, [torch.ones_like(p[0])], 1, 1, 0.0)

    sim = AsyncSimulation(AsyncConfig(concurrency=4, buffer_size=2, staleness=StalenessWeighting("constant")), 4,
                          train, ServerComposer("uniform", None, SGD()).update, Durations(), lambda c, k: np.array([1]))
    x = [torch.zeros(2, dtype=torch.float64)]
    # by hand: client 0 fails at 1 s and 2 s (re-dispatched each time, the only idle client); 1 reports at 1.7 s,
    # 2 at 2.9 s: the step. Then 0 fails at 3 s and 4 s; 1 reports at 3.4 s, 3 at 4.3 s
    step = sim.step(x)
    assert (step.client_ids.tolist(), step.failed, step.time) == ([1, 2], 2, 2.9)
    assert torch.equal(x[0], torch.ones(2, dtype=torch.float64))  # the mean of two unit updates
    step = sim.step(x)
    assert (step.client_ids.tolist(), step.failed, step.time) == ([1, 3], 2, 4.3)
    assert sim.state_dict()["counts"][3] == 0
