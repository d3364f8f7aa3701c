"""Device models from FedScale's traces (issue #53 item 1b): the trace files (FedScale's "Device Trace File Formats":
pickles of ``client id -> {'computation', 'communication'}`` and ``client id -> {'duration', 'inactive',
'finish_time', 'active', 'model'}``), written here in that format; the conversion of FedScale's units (its
``ClientMetadata.get_completion_time``), the seeded client -> row mapping and availability (its ``is_active``),
checked against references written from FedScale's definitions, not from our code."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import TensorDataset

from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import DPFedAvg, FedAvg
from lightning_fed.checks import ArgumentError
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.devices.fedscale import FedScaleDevices, trace_rows
from lightning_fed.datamodules.devices.fedscale_files import TraceFileError
from tests.helpers import LinearRegression, linear_weights, load_script, quiet_trainer_kwargs, regression_data

CAPACITY = {  # FedScale's keys are client ids; deliberately not in sorted order
    30: {"computation": 20.0, "communication": 1000.0},
    10: {"computation": 150.0, "communication": 250.5},
    20: {"computation": 0.5, "communication": 80_000.0},
}
BEHAVIOUR = {
    # one interval; parts of a period
    1: {"duration": 100, "inactive": [40], "finish_time": 100, "active": [10], "model": "a"},
    # two intervals, unsorted, the last reaching the period's end and the first starting at 0: the stretch
    # [80, 100) continues into [0, 5] of the next period
    2: {"duration": 100, "inactive": [100, 5], "finish_time": 100, "active": [80, 0], "model": "b"},
    # touching intervals join; the second sticks out of the period (FedScale's t mod finish_time never reaches it)
    3: {"duration": 50, "inactive": [20, 70], "finish_time": 50, "active": [10, 20], "model": "c"},
    # online through the whole period
    4: {"duration": 30, "inactive": [30], "finish_time": 30, "active": [0], "model": "d"},
}

MASK = (1 << 64) - 1


def splitmix_output(z: int) -> int:
    """SplitMix64's output function (Steele, Lea & Flood 2014), Python integers."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_row(client_id: int, num_rows: int, seed: int, stream: int) -> int:
    """The documented mapping: key = mix(2·seed + stream + golden), row = mix(id XOR key) mod R."""
    key = splitmix_output((2 * seed + stream + 0x9E3779B97F4A7C15) & MASK)
    return splitmix_output(client_id ^ key) % num_rows


def reference_online(row: dict, t: float) -> bool:
    """FedScale's is_active rule, stateless: t mod finish_time within some closed [active[k], inactive[k]]."""
    pos = np.fmod(t, row["finish_time"])
    return bool(np.any((np.array(row["active"]) <= pos) & (pos <= np.array(row["inactive"]))))


@pytest.fixture
def traces(tmp_path):
    cap, beh = tmp_path / "client_device_capacity", tmp_path / "client_behave_trace"
    cap.write_bytes(pickle.dumps(CAPACITY))
    beh.write_bytes(pickle.dumps(BEHAVIOUR))
    return cap, beh


def test_capacity_rows_convert_fedscale_units_exactly(traces):
    devices = FedScaleDevices(traces[0], seed=3)
    ids = np.array([0, 1, 2, 7, 12345, 999_999])
    seconds, down, up, latency = devices.profiles(ids)
    keys = sorted(CAPACITY)
    for i, cid in enumerate(ids.tolist()):
        row = CAPACITY[keys[reference_row(cid, 3, seed=3, stream=0)]]
        # FedScale: computation seconds = 3 · batch · steps · computation / 1000 (ms per sample → s, ×3 fwd+bwd)
        batch, steps = 16, 5
        assert seconds[i] * batch * steps == pytest.approx(3.0 * batch * steps * row["computation"] / 1000.0, rel=1e-15)
        # FedScale: seconds = size_kbit / communication, size_kbit = bytes / 1024 · 8
        size_bytes = 4 * 1_000_003
        assert size_bytes / down[i] == pytest.approx((size_bytes / 1024 * 8) / row["communication"], rel=1e-15)
        assert up[i] == down[i] and latency[i] == 0.0
    # by hand: 20 ms/sample → 0.06 s per trained sample, 1000 kbit/s → 128,000 bytes/s
    assert devices.trace_keys([0])[1] is None
    half = FedScaleDevices(traces[0], seed=3, augmentation_factor=1.5)
    assert np.array_equal(half.profiles(ids).seconds_per_sample * 2, seconds)


def test_rows_are_a_seeded_keyed_hash_of_the_client_id():
    ids = [0, 1, 2, 3, 17, 2**40, 10**6 - 1]
    for seed in (0, 5):
        for stream in (0, 1):
            assert trace_rows(ids, 7, seed, stream).tolist() == [reference_row(i, 7, seed, stream) for i in ids]
    assert trace_rows(ids, 7, 0, 0).tolist() != trace_rows(ids, 7, 1, 0).tolist()  # the seed matters
    rows = trace_rows(np.arange(70_000), 7, 0, 0)  # every row used, about equally
    assert np.bincount(rows, minlength=7).min() > 9_500


def test_trace_keys_name_the_fedscale_rows_each_client_replays(traces):
    devices = FedScaleDevices(*traces, seed=1)
    cap, beh = devices.trace_keys([4, 5])
    assert cap == [sorted(CAPACITY)[reference_row(i, 3, 1, 0)] for i in (4, 5)]
    assert beh == [sorted(BEHAVIOUR)[reference_row(i, 4, 1, 1)] for i in (4, 5)]
    assert devices.settings() == {"capacity_file": str(traces[0]), "behaviour_file": str(traces[1]), "seed": 1,
                                  "augmentation_factor": 3.0}


def test_availability_follows_fedscale_is_active_at_every_time(traces):
    devices = FedScaleDevices(*traces, seed=2)
    ids = np.arange(40)
    keys = [sorted(BEHAVIOUR)[reference_row(i, 4, 2, 1)] for i in ids.tolist()]
    assert set(keys) == set(BEHAVIOUR)  # the test sees every row
    for t in np.concatenate([np.arange(0.0, 210.0, 1.25), [5.0, 10.0, 40.0, 40.25, 80.0, 100.0, 1e6 + 12.5]]):
        expected = [reference_online(BEHAVIOUR[k], t) for k in keys]
        assert devices.is_online(ids, t).tolist() == expected, t


def online_until_by_hand(key: int, t: float) -> float:
    """Hand-derived ends of the online stretch holding t (t itself when offline)."""
    row = BEHAVIOUR[key]
    if not reference_online(row, t):
        return t
    pos, base = t % row["finish_time"], t - t % row["finish_time"]
    if key == 1:
        return base + 40
    if key == 2:  # [80, 100) runs into the next period's [0, 5]; [0, 5] ends at 5
        return base + 105 if pos >= 80 else base + 5
    if key == 3:  # [10, 20] ∪ [20, 70] clipped to the period: [10, 50)
        return base + 50
    return np.inf


def test_online_until_is_the_end_of_the_online_stretch(traces):
    devices = FedScaleDevices(*traces, seed=2)
    ids = np.arange(40)
    keys = [sorted(BEHAVIOUR)[reference_row(i, 4, 2, 1)] for i in ids.tolist()]
    for t in (0.0, 3.0, 12.0, 39.5, 40.0, 45.0, 85.0, 100.0, 199.0, 1234.0):
        assert devices.online_until(ids, t).tolist() == [online_until_by_hand(k, t) for k in keys], t


def test_without_a_behaviour_trace_everyone_is_always_online(traces):
    devices = FedScaleDevices(traces[0])
    assert not devices.has_availability and FedScaleDevices(*traces).has_availability
    assert devices.is_online([0, 10**6], 5.0).all()
    assert np.isinf(devices.online_until([0, 3], 5.0)).all()


def test_json_holds_the_same_traces_without_pickle(traces, tmp_path):
    cap, beh = tmp_path / "cap.json", tmp_path / "beh.json"
    cap.write_text(json.dumps(CAPACITY))  # JSON writes the ids as strings
    beh.write_text(json.dumps(BEHAVIOUR))
    a, b = FedScaleDevices(*traces, seed=4), FedScaleDevices(cap, beh, seed=4)
    ids = np.arange(30)
    assert all(np.array_equal(x, y) for x, y in zip(a.profiles(ids), b.profiles(ids)))
    for t in (0.0, 15.0, 90.0):
        assert np.array_equal(a.online_until(ids, t), b.online_until(ids, t))


def test_bad_files_and_arguments_are_refused_by_the_model(traces, tmp_path):
    """The file checks themselves: test_fedscale_files.py."""
    with pytest.raises(TraceFileError, match=r"is \d+ bytes, over the limit max_bytes=10"):
        FedScaleDevices(traces[0], max_bytes=10)
    bad = tmp_path / "beh"
    bad.write_bytes(pickle.dumps({1: {"finish_time": 9, "active": [3], "inactive": [2]}}))
    with pytest.raises(TraceFileError, match="behaviour trace .* client 1 interval 0 ends before it starts"):
        FedScaleDevices(traces[0], bad)
    with pytest.raises(ArgumentError, match="`augmentation_factor` must be a finite number >= 0"):
        FedScaleDevices(traces[0], augmentation_factor=-1)
    with pytest.raises(ArgumentError, match="`seed` must be an integer >= 0"):
        FedScaleDevices(traces[0], seed=-2)
    with pytest.raises(ArgumentError, match="`t` must be a finite number >= 0"):
        FedScaleDevices(*traces).is_online([0], -1.0)


def test_example_script_writes_a_seeded_pair_in_fedscale_format(tmp_path):
    script = load_script("scripts/make_device_trace.py")
    cap, beh = script.write_traces(tmp_path / "a", rows=6, seed=1, period=1000)
    again = script.write_traces(tmp_path / "b", rows=6, seed=1, period=1000)
    assert cap.read_bytes() == again[0].read_bytes() and beh.read_bytes() == again[1].read_bytes()
    capacity, behaviour = pickle.loads(cap.read_bytes()), pickle.loads(beh.read_bytes())
    assert sorted(capacity) == sorted(behaviour) == list(range(1, 7))
    for row in behaviour.values():
        assert set(row) == {"duration", "inactive", "finish_time", "active", "model"}
        bounds = np.array([row["active"], row["inactive"]]).T.ravel()
        assert np.all(np.diff(bounds) > 0) and 0 <= bounds[0] and bounds[-1] < 1000
    jc, jb = script.write_traces(tmp_path / "j", rows=6, seed=1, period=1000, as_json=True)
    devices, from_json = FedScaleDevices(cap, beh), FedScaleDevices(jc, jb)
    assert np.array_equal(devices.online_until(np.arange(20), 500.0), from_json.online_until(np.arange(20), 500.0))


# --- in a run: availability at selection, offline mid-round, DP refused (issue #53 item 3) --------------------------

#: one device for everyone: 300 ms/sample inference → 0.9 s per trained sample; 8 kbit/s → 1,024 bytes/s
ONE_DEVICE = {1: {"computation": 300.0, "communication": 8.0}}
#: row 1 always online; row 2 online over [0, 5] and [20, 1000] of each 1,000 s
TWO_BEHAVIOURS = {1: {"duration": 1000, "inactive": [1000], "finish_time": 1000, "active": [0], "model": "a"},
                  2: {"duration": 1000, "inactive": [5, 1000], "finish_time": 1000, "active": [0, 20], "model": "b"}}


class _RoundMetrics(Callback):
    def __init__(self):
        self.rounds = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.rounds.append(dict(trainer.fit_loop.round_metrics))


def _run_data(tmp_path, **kwargs):
    cap, beh = tmp_path / "client_device_capacity", tmp_path / "client_behave_trace"
    cap.write_bytes(pickle.dumps(ONE_DEVICE))
    beh.write_bytes(pickle.dumps(TWO_BEHAVIOURS))
    x, y = regression_data(n=60)
    return FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                               partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=5,
                               seed=0, device_model=FedScaleDevices(cap, beh, seed=3), **kwargs)


def test_a_client_going_offline_mid_round_fails_and_offline_ones_are_not_sampled(tmp_path):
    """By hand: each client trains 10 samples (2 steps of 5) at 0.9 s a sample = 9 s, and moves the 4 float64
    parameters (32 bytes) each way at 1,024 bytes/s = 0.03125 s: it finishes 9.0625 s after the round's start. Round
    0 starts at t = 0, when everyone is online; a client on behaviour row 2 goes offline at t = 5 < 9.0625, mid-round:
    it fails (``clock/offline``) and its update is not aggregated. The round ends at 9.0625 s, when row 2 is offline
    (5 < t < 20): rounds 1 and 2 (t = 9.0625, 18.125) sample only row-1 clients."""
    row_of = {i: sorted(TWO_BEHAVIOURS)[reference_row(i, 2, 3, 1)] for i in range(6)}  # the documented mapping
    first = np.random.default_rng([0, 0x5A3D, 0]).choice(6, size=3, replace=False).tolist()  # round 0: all online
    gone = [c for c in first if row_of[c] == 2]
    assert gone and len(gone) < 3 and sum(r == 1 for r in row_of.values()) >= 3  # the case this test is about
    dm, record = _run_data(tmp_path), _RoundMetrics()
    trainer = FederatedTrainer(max_epochs=3, callbacks=[FedAvg(), record], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=dm)
    r0, r1, r2 = record.rounds
    assert r0["clock/offline"] == len(gone) and r0["round_clients"] == 3 - len(gone)
    assert r0["clock/round_seconds"] == 9.0625 and r1["clock/elapsed_seconds"] == 18.125
    assert r1["clock/offline"] == r2["clock/offline"] == 0 and r1["round_clients"] == r2["round_clients"] == 3
    for round_idx, t in ((1, 9.0625), (2, 18.125)):
        cohort = dm.select_cohort(round_idx, time=t).cohort.tolist()
        assert len(cohort) == 3 and all(row_of[c] == 1 for c in cohort), (round_idx, cohort)
    assert any(row_of[c] == 2 for r in range(3, 12) for c in dm.select_cohort(r, time=25.0).cohort.tolist())  # back


def test_a_population_all_offline_stops_with_an_error_instead_of_a_clock_that_never_moves(tmp_path):
    """A behaviour trace of row 2 alone (offline over (5, 20) of each 1,000 s): at t = 10 no client of the
    population is online; at t = 0 and t = 25 everyone is."""
    cap, beh = tmp_path / "cap", tmp_path / "beh"
    cap.write_bytes(pickle.dumps(ONE_DEVICE))
    beh.write_bytes(pickle.dumps({2: TWO_BEHAVIOURS[2]}))
    x, y = regression_data(n=40)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
                             device_model=FedScaleDevices(cap, beh))
    dm.setup()
    assert len(dm.select_cohort(0, time=0.0).cohort) == 2 and len(dm.select_cohort(0, time=25.0).cohort) == 2
    with pytest.raises(RuntimeError, match=r"Round 1: none of the 4 clients is online at simulated time 10 s "
                                           r"\(FedScaleDevices's availability\)"):
        dm.select_cohort(1, time=10.0)


def test_dp_is_refused_at_fit_start_when_the_device_model_has_availability(tmp_path):
    dm = _run_data(tmp_path)
    model = LinearRegression()
    before = linear_weights(model)
    trainer = FederatedTrainer(max_epochs=2, callbacks=[DPFedAvg(0.1, 1.0, 1e-3)], **quiet_trainer_kwargs(tmp_path))
    with pytest.raises(ValueError, match=r"DPFedAvg accounts ε for cohorts drawn by 'fixed_size' sampling from all 6 "
                                         r"clients, but FederatedDataModule's device_model FedScaleDevices has "
                                         r"availability: each round samples only the clients online at its start"):
        trainer.fit(model, datamodule=dm)
    assert np.array_equal(linear_weights(model), before)  # refused before any client trained


def test_device_traces_guide_snippet_runs(tmp_path, monkeypatch, capsys):
    """docs/guide/device-traces.md's Python block, on the pair its bash block writes (the script, default arguments)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[3] / "docs" / "guide" / "device-traces.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    load_script("scripts/make_device_trace.py").write_traces(tmp_path / "traces")
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "device-traces.md", "exec"), {})
    first, second = capsys.readouterr().out.strip().splitlines()
    assert len(first.strip("[]").split()) == 5 and second.startswith("[")


def test_the_cli_takes_fedscale_devices_on_a_task(tmp_path, monkeypatch):
    """`--data.device_model` with FedScaleDevices, as docs/guide/device-traces.md writes it (no data is read)."""
    from pathlib import Path

    from lightning_fed.cli import FederatedCLI

    load_script("scripts/make_device_trace.py").write_traces(tmp_path / "traces")
    monkeypatch.chdir(tmp_path)
    config = Path(__file__).resolve().parents[3] / "examples" / "emnist_cr_fedavg.yaml"
    devices = {"class_path": "lightning_fed.datamodules.devices.FedScaleDevices",
               "init_args": {"capacity_file": "traces/client_device_capacity",
                             "behaviour_file": "traces/client_behave_trace", "seed": 4}}
    dm = FederatedCLI(args=["--config", str(config), "--data.device_model", json.dumps(devices)],
                      run=False).datamodule
    assert isinstance(dm.device_model, FedScaleDevices) and dm.device_model.has_availability
    assert dm.device_model.settings() == {"capacity_file": "traces/client_device_capacity",
                                          "behaviour_file": "traces/client_behave_trace", "seed": 4,
                                          "augmentation_factor": 3.0}


# --- the clock's leftovers: next online time, offline at selection, empty rounds, edited traces (issue #53) --------

def reference_next_online(row: dict, t: float) -> float:
    """The first time s >= t that FedScale's is_active rule says is online, scanning s = t, t + 0.25, ... (every
    interval bound in BEHAVIOUR is an integer, so a first online time after t is on that grid when t is)."""
    for k in range(int(4 * 2 * row["finish_time"]) + 1):
        if reference_online(row, t + k / 4):
            return t + k / 4
    return np.inf


def test_next_online_is_the_first_time_fedscale_is_active_says_online(traces):
    devices = FedScaleDevices(*traces, seed=2)
    ids = np.arange(40)
    keys = [sorted(BEHAVIOUR)[reference_row(i, 4, 2, 1)] for i in ids.tolist()]
    for t in np.concatenate([np.arange(0.0, 210.0, 2.25), [5.0, 5.25, 40.0, 40.25, 99.75, 1e6 + 12.5]]):
        per_row = {k: reference_next_online(BEHAVIOUR[k], t) for k in BEHAVIOUR}
        assert devices.next_online(ids, t).tolist() == [per_row[k] for k in keys], t
    # by hand: row 1 (online [10, 40] of 100 s) at t = 50 is back at 110; row 2 ([0, 5] and [80, 100]) at 6: 80
    assert reference_next_online(BEHAVIOUR[1], 50.0) == 110.0 and reference_next_online(BEHAVIOUR[2], 6.0) == 80.0
    assert FedScaleDevices(traces[0]).next_online(ids[:2], 7.5).tolist() == [7.5, 7.5]  # no behaviour: always online


def test_clients_offline_at_selection_are_logged_each_round(tmp_path):
    """``clock/offline_at_selection``: the clients the fixed-size sampler drew and skipped as offline, counted by hand
    from the documented rejection sampling (tests/datamodules/test_cohorts.py's reference) over the clients online
    at each round's start: t = 0 (everyone), t = 9.0625 and 18.125 (row-2 clients offline over (5, 20))."""
    from tests.datamodules.test_cohorts import reference_online_cohort

    row_of = {i: sorted(TWO_BEHAVIOURS)[reference_row(i, 2, 3, 1)] for i in range(6)}
    dm, record = _run_data(tmp_path), _RoundMetrics()
    trainer = FederatedTrainer(max_epochs=3, callbacks=[FedAvg(), record], **quiet_trainer_kwargs(tmp_path))
    trainer.fit(LinearRegression(), datamodule=dm)
    expected = []
    for r, t in enumerate((0.0, 9.0625, 18.125)):
        online = {c for c in range(6) if reference_online(TWO_BEHAVIOURS[row_of[c]], t)}
        expected.append(reference_online_cohort(0, r, 6, 3, online)[1])
    assert [m["clock/offline_at_selection"] for m in record.rounds] == expected
    assert expected[0] == 0 and sum(expected) > 0  # the case this test is about


def _poisson_offline_dm(tmp_path, cohort_sampling="poisson", **kwargs):
    """Four clients on behaviour row 2 alone (offline over (5, 20) of each 1,000 s), Poisson cohorts of rate 2/4."""
    cap, beh = tmp_path / "cap", tmp_path / "beh"
    cap.write_bytes(pickle.dumps(ONE_DEVICE))
    beh.write_bytes(pickle.dumps({2: TWO_BEHAVIOURS[2]}))
    x, y = regression_data(n=40)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2, batch_size=5,
                             cohort_sampling=cohort_sampling, device_model=FedScaleDevices(cap, beh), **kwargs)
    dm.setup()
    return dm


def test_a_round_nobody_could_be_asked_in_waits_until_a_drawn_client_is_back(tmp_path):
    """At t = 10 every client is offline until 20. A Poisson round whose sample (u_i < 1/2, the documented per-client
    draws) is not empty asks nobody: it lasts 20 − 10 = 10 s, or D = 3 s with a deadline; an empty sample has nobody
    to wait for: 0 s (as every round before this change)."""
    sampled = {r: np.flatnonzero(np.random.default_rng([0, 0x9015, r]).random(4) < 0.5).tolist() for r in range(40)}
    asked = next(r for r in range(40) if 0 < len(sampled[r]) < 4)
    nobody = next(r for r in range(40) if not sampled[r])
    for deadline, seconds in ((None, 10.0), (3.0, 3.0)):
        dm = _poisson_offline_dm(tmp_path, round_deadline=deadline)
        part = dm.simulated_time
        part.clock.load_state_dict({"elapsed_seconds": 10.0, "rounds": asked})
        selection = dm.select_cohort(asked)
        assert selection.cohort.size == 0 and sorted(selection.offline_ids.tolist()) == sampled[asked]
        _, plan = part.start_round(dm, selection, asked, 32, 32)
        assert plan.round_seconds == seconds and plan.metrics()["clock/offline_at_selection"] == len(sampled[asked])
        assert part.end_round(plan)["clock/elapsed_seconds"] == 10.0 + seconds
    _, plan = part.start_round(dm, dm.select_cohort(nobody), nobody, 32, 32)
    assert plan.round_seconds == 3.0  # the deadline
    dm = _poisson_offline_dm(tmp_path)
    dm.simulated_time.clock.load_state_dict({"elapsed_seconds": 10.0, "rounds": nobody})
    assert dm.simulated_time.start_round(dm, dm.select_cohort(nobody), nobody, 32, 32)[1].round_seconds == 0.0


def test_a_fixed_size_round_with_the_whole_population_offline_says_when_the_first_is_back(tmp_path):
    """Row 2 alone (offline over (5, 20)): at t = 10 the sampler asked all 4 clients; by hand the first is back at
    20 s (and at t = 1,010 at 1,020 s, the next period)."""
    dm = _poisson_offline_dm(tmp_path, cohort_sampling="fixed_size")
    for t, back in ((10.0, "20"), (1010.0, "1020")):
        with pytest.raises(RuntimeError, match=rf"none of the 4 clients is online at simulated time {t:g} s "
                                               rf"\(FedScaleDevices's availability\); the first is back at {back} s"):
            dm.select_cohort(1, time=t)


def test_a_resume_with_an_edited_trace_is_refused_naming_the_file(tmp_path):
    """The run record holds each trace's SHA-256 (computed here with hashlib from the bytes written) and path; a
    resume after the file was edited is refused, the line naming the file; the same files record the same."""
    import hashlib

    from tests.helpers import federated_fit

    dm = _run_data(tmp_path)
    cap, beh = tmp_path / "client_device_capacity", tmp_path / "client_behave_trace"
    record = dm.run_config()
    assert record["device_model.capacity_sha256"] == f"{hashlib.sha256(cap.read_bytes()).hexdigest()} {cap}"
    assert record["device_model.behaviour_sha256"] == f"{hashlib.sha256(beh.read_bytes()).hexdigest()} {beh}"
    assert "device_model/capacity_sha256" not in dm.settings()  # the run record only, not the HParams
    assert FedScaleDevices(cap, beh, seed=3).run_settings() == dm.device_model.run_settings()
    federated_fit(tmp_path, LinearRegression(), dm, FedAvg(), 1, ckpt_dir=tmp_path / "ckpt")
    ckpt = str(tmp_path / "ckpt" / "last.ckpt")
    old = hashlib.sha256(cap.read_bytes()).hexdigest()
    cap.write_bytes(pickle.dumps({1: {"computation": 30.0, "communication": 8.0}}))  # _run_data writes ONE_DEVICE
    edited = FedScaleDevices(cap, beh, seed=3)
    new = hashlib.sha256(cap.read_bytes()).hexdigest()
    x, y = regression_data(n=60)
    data = TensorDataset(torch.tensor(x), torch.tensor(y))
    again = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3,
                                batch_size=5, seed=0, device_model=edited)
    with pytest.raises(ValueError, match=rf"device_model.capacity_sha256: '{old} {cap}' -> '{new} {cap}'"):
        federated_fit(tmp_path, LinearRegression(), again, FedAvg(), 2, ckpt_path=ckpt)
    # a checkpoint written before the hashes were recorded: they cannot be checked, a warning, not a refusal
    saved = torch.load(ckpt, weights_only=True)
    for key in ("device_model.capacity_sha256", "device_model.behaviour_sha256"):
        del saved["lightning_fed"]["run_config"][key]
    torch.save(saved, tmp_path / "older.ckpt")
    with pytest.warns(UserWarning, match=r"written before these settings were recorded, so they cannot be checked: "
                                         r"device_model.behaviour_sha256 \(now '[0-9a-f]{64} .+'\), "
                                         r"device_model.capacity_sha256"):
        federated_fit(tmp_path, LinearRegression(), again, FedAvg(), 2, ckpt_path=str(tmp_path / "older.ckpt"))
