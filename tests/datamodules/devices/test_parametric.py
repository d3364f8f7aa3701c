"""ParametricDeviceModel (issue #53 item 1a): constant values exactly, log-normal medians and spreads and the slow
fraction as a large sample's statistics, draws keyed by (seed, client id) alone."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.checks import ArgumentError
from lightning_fed.datamodules.devices import DeviceModel, ParametricDeviceModel


def test_constant_values_for_every_client():
    model = ParametricDeviceModel(seconds_per_sample=0.02, download_bytes_per_s=2e6, upload_bytes_per_s=float("inf"),
                                  latency_s=0.1)
    p = model.profiles(np.array([0, 5, 999_999]))
    assert p.seconds_per_sample.tolist() == [0.02] * 3 and p.download_bytes_per_s.tolist() == [2e6] * 3
    assert p.upload_bytes_per_s.tolist() == [np.inf] * 3 and p.latency_s.tolist() == [0.1] * 3
    assert all(a.dtype == np.float64 for a in p)


def test_log_normal_medians_spreads_and_the_slow_fraction():
    kwargs = dict(seconds_per_sample=0.01, download_bytes_per_s=1e6, upload_bytes_per_s=1e5, compute_sigma=0.5,
                  network_sigma=1.0, seed=3)
    ids = np.arange(3000)
    p = ParametricDeviceModel(**kwargs).profiles(ids)
    # median and sigma of the logs (standard errors about 1.25·σ/√n and σ/√(2n))
    for values, median, sigma in ((p.seconds_per_sample, 0.01, 0.5), (p.download_bytes_per_s, 1e6, 1.0),
                                  (p.upload_bytes_per_s, 1e5, 1.0)):
        logs = np.log(values / median)
        assert abs(np.median(logs)) < 4 * 1.25 * sigma / np.sqrt(3000) and abs(logs.std() - sigma) < 4 * sigma / np.sqrt(2 * 3000)
    assert abs(np.corrcoef(np.log(p.download_bytes_per_s), np.log(p.upload_bytes_per_s))[0, 1]) < 0.08
    # the same draws with 20 % slow devices: exactly those are 10 times slower, nothing else moves
    slowed = ParametricDeviceModel(**kwargs, slow_fraction=0.2, slowdown=10.0).profiles(ids)
    ratio = slowed.seconds_per_sample / p.seconds_per_sample
    assert set(np.round(ratio, 12).tolist()) == {1.0, 10.0} and abs((ratio > 1).mean() - 0.2) < 4 * 0.4 / np.sqrt(3000)
    assert np.array_equal(slowed.download_bytes_per_s, p.download_bytes_per_s)


def test_a_clients_device_depends_on_the_seed_and_its_id_only():
    model = ParametricDeviceModel(compute_sigma=1.0, network_sigma=0.3, slow_fraction=0.5, slowdown=3.0, seed=7)
    together = model.profiles(np.array([4, 1_000_000, 17]))
    alone = model.profiles(np.array([17]))
    assert [a[2] for a in together] == [a[0] for a in alone]
    again = ParametricDeviceModel(compute_sigma=1.0, network_sigma=0.3, slow_fraction=0.5, slowdown=3.0, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(together, again.profiles(np.array([4, 1_000_000, 17]))))
    other = ParametricDeviceModel(compute_sigma=1.0, network_sigma=0.3, slow_fraction=0.5, slowdown=3.0, seed=8)
    assert not np.array_equal(other.profiles(np.array([4])).seconds_per_sample, together.seconds_per_sample[:1])
    # a client's own generator, [seed, 0xDE71CE, id]: three normals, then the uniform
    rng = np.random.default_rng([7, 0xDE71CE, 17])
    z, u = rng.standard_normal(3), rng.random()
    expected = 0.01 * np.exp(z[0]) * (3.0 if u < 0.5 else 1.0)
    assert alone.seconds_per_sample[0] == pytest.approx(expected, rel=1e-15)


def test_settings_and_availability_defaults():
    model = ParametricDeviceModel(compute_sigma=0.5, seed=2)
    assert isinstance(model, DeviceModel) and not model.has_availability
    assert model.settings()["compute_sigma"] == 0.5 and model.settings()["seed"] == 2
    assert repr(model).startswith("ParametricDeviceModel(seconds_per_sample=0.01, ")
    assert model.is_online(np.array([1, 2]), 5.0).tolist() == [True, True]
    assert model.online_until(np.array([1]), 5.0).tolist() == [np.inf]


@pytest.mark.parametrize("kwargs, message", [
    (dict(seconds_per_sample=0), "`seconds_per_sample` must be a finite number > 0, got 0"),
    (dict(download_bytes_per_s=-1.0), "`download_bytes_per_s` must be a finite number > 0, got -1.0"),
    (dict(latency_s=-0.1), "`latency_s` must be a finite number >= 0, got -0.1"),
    (dict(compute_sigma=-1), "`compute_sigma` must be a finite number >= 0, got -1"),
    (dict(slow_fraction=1.0), r"`slow_fraction` must be a number in \[0, 1\), got 1.0"),
    (dict(slowdown=0.5), "`slowdown` must be a finite number >= 1, got 0.5"),
    (dict(seed=-1), "`seed` must be an integer >= 0, got -1"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ArgumentError, match=message):
        ParametricDeviceModel(**kwargs)
