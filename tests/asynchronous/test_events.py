"""Dispatch draws and report times (the clock's time pieces), by hand."""

from __future__ import annotations

import numpy as np

from lightning_fed.asynchronous import draw_client, report_times
from lightning_fed.datamodules.devices import DeviceModel, DeviceProfiles, ParametricDeviceModel


def test_draw_is_keyed_by_seed_and_dispatch_index_and_uniform_over_idle_clients():
    # the same (seed, k) gives the same client whatever was drawn before; other keys differ somewhere
    assert [draw_client(3, k, 50, ()) for k in range(20)] == [draw_client(3, k, 50, ()) for k in range(20)]
    assert [draw_client(3, k, 50, ()) for k in range(20)] != [draw_client(4, k, 50, ()) for k in range(20)]
    # with 0..7 busy out of 10, only 8 and 9 are ever drawn, about equally often
    drawn = np.array([draw_client(0, k, 10, set(range(8))) for k in range(2000)])
    assert set(drawn.tolist()) == {8, 9}
    assert abs((drawn == 8).mean() - 0.5) < 0.05
    # an availability filter: odd clients are offline
    assert all(draw_client(1, k, 10, (), online=lambda c: c % 2 == 0) % 2 == 0 for k in range(200))


class _GoesOffline(DeviceModel):
    """0.5 s a sample, instantaneous network; client c online until 10 + c."""

    def profiles(self, ids):
        n = len(ids)
        return DeviceProfiles(np.full(n, 0.5), np.full(n, np.inf), np.full(n, np.inf), np.zeros(n))

    def online_until(self, ids, t):
        return 10.0 + np.asarray(ids, dtype=np.float64)


def test_report_time_is_download_compute_upload_after_dispatch():
    # 3 steps of 4, 4, 2 samples at 0.02 s; 5e5 bytes down at 1e6 B/s, 5e5 up at 2.5e5 B/s, latency 0.1 s each way
    devices = ParametricDeviceModel(0.02, download_bytes_per_s=1e6, upload_bytes_per_s=2.5e5, latency_s=0.1)
    ends, reports = report_times(7.0, np.array([2]), [np.array([4, 4, 2])], 5e5, 5e5, devices)
    assert reports.tolist() == [True]
    np.testing.assert_allclose(ends, [7.0 + (0.5 + 0.1) + 0.2 + (2.0 + 0.1)], rtol=1e-15)


def test_a_client_going_offline_first_reports_nothing_at_its_offline_time():
    # dispatched at t = 8: 4 samples (2 s) end at 10; client 0 is online until 10 (reports), client 1 until 11,
    # with 8 samples (4 s, end 12) it goes offline at 11
    ends, reports = report_times(8.0, np.array([0, 1]), [np.array([4]), np.array([8])], 0.0, 0.0, _GoesOffline())
    assert reports.tolist() == [True, False]
    np.testing.assert_array_equal(ends, [10.0, 11.0])


def test_report_times_are_plan_rounds_bit_for_bit():
    # issue #54's cost: report_times plans each dispatch in Python floats; the same bits as the clock's plan_round
    # (no deadline) on log-normal devices, clients of 1..5 steps, some going offline mid-way
    from lightning_fed.clock import KEPT, plan_round

    rng = np.random.default_rng(0)
    devices = ParametricDeviceModel(0.013, download_bytes_per_s=3e5, upload_bytes_per_s=1.7e5, latency_s=0.03,
                                    compute_sigma=1.1, network_sigma=0.7, slow_fraction=0.2, seed=5)

    class Leaving(ParametricDeviceModel):
        def online_until(self, ids, t):
            return t + 3.0 * rng_until[np.asarray(ids)]

    rng_until = rng.random(64)
    leaving = Leaving(**devices.settings())
    ids = rng.permutation(64)[:40]
    steps = [rng.integers(1, 33, size=rng.integers(1, 6)) for _ in ids]
    for model in (devices, leaving):
        ends, reports = report_times(12.34, ids, steps, 123457.0, 98765.0, model)
        plan = plan_round(12.34, ids, steps, 123457.0, 98765.0, model.profiles(ids),
                          online_until=model.online_until(ids, 12.34))
        kept = plan.status == KEPT
        expected = np.where(kept, 12.34 + plan.finish_s, np.maximum(model.online_until(ids, 12.34), 12.34))
        np.testing.assert_array_equal(reports, kept)
        np.testing.assert_array_equal(ends, expected)
    assert 0 < reports.sum() < len(ids)  # some went offline first
