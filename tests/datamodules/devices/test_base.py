"""The device-model base (issue #53, devices/base.py): the defaults a device model inherits (always online) and the
checks of the profiles a model gives (as_profiles)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.checks import ArgumentError
from lightning_fed.datamodules.devices import DeviceModel, DeviceProfiles, as_profiles


class Fixed(DeviceModel):
    def __init__(self, seconds_per_sample: float = 0.5):
        self.seconds_per_sample = seconds_per_sample

    def profiles(self, client_ids):
        return as_profiles({"seconds_per_sample": self.seconds_per_sample, "download_bytes_per_s": 1.0,
                            "upload_bytes_per_s": 1.0, "latency_s": 0.0}, len(client_ids))


def two_phones(ids):
    return {"seconds_per_sample": np.where(ids % 2 == 0, 0.01, 0.05), "download_bytes_per_s": 1e6,
            "upload_bytes_per_s": np.full(len(ids), 1e5), "latency_s": 0.2}


def test_the_defaults_always_online_settings_from_the_constructor():
    model = Fixed(0.25)
    ids = np.array([3, 1_000_000])
    assert model.is_online(ids, 1e9).tolist() == [True, True] and model.online_until(ids, 7.0).tolist() == [np.inf] * 2
    assert not model.has_availability and model.settings() == {"seconds_per_sample": 0.25}
    assert repr(model) == "Fixed(seconds_per_sample=0.25)" and model.setup(10) is None
    expected = DeviceProfiles(np.full(2, 0.25), np.ones(2), np.ones(2), np.zeros(2))
    assert all(np.array_equal(a, b) for a, b in zip(model.profiles(ids), expected))

    class Traces(Fixed):
        def is_online(self, client_ids, t):
            return client_ids % 2 == 0

    assert Traces().has_availability
    with pytest.raises(NotImplementedError, match="DeviceModel must implement profiles"):
        DeviceModel().profiles(ids)


@pytest.mark.parametrize("result, message", [
    ({"seconds_per_sample": 0.1}, r"missing \['download_bytes_per_s', 'upload_bytes_per_s', 'latency_s'\]"),
    (dict(two_phones(np.arange(2)), speed=1), r"unknown \['speed'\]"),
    (dict(two_phones(np.arange(2)), upload_bytes_per_s=0.0), "`upload_bytes_per_s` must be numbers > 0"),
    (dict(two_phones(np.arange(2)), latency_s=np.nan), "`latency_s` must be finite numbers >= 0, got nan"),
    (dict(two_phones(np.arange(2)), seconds_per_sample=np.ones(3)), r"`seconds_per_sample` must have shape \(2,\)"),
    ([1, 2], "must give a DeviceProfiles or a dict"),
])
def test_a_malformed_profile_is_refused_naming_the_field(result, message):
    with pytest.raises(ArgumentError, match=message):
        as_profiles(result, 2)
