"""CallableDeviceModel (issue #53 item 1c) and the checks of what a device model gives (devices/base.py)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.checks import ArgumentError
from lightning_fed.datamodules.devices import CallableDeviceModel, DeviceProfiles


def two_phones(ids):
    return {"seconds_per_sample": np.where(ids % 2 == 0, 0.01, 0.05), "download_bytes_per_s": 1e6,
            "upload_bytes_per_s": np.full(len(ids), 1e5), "latency_s": 0.2}


def test_a_dict_or_profiles_from_the_function():
    p = CallableDeviceModel(two_phones).profiles(np.array([0, 3]))
    assert p.seconds_per_sample.tolist() == [0.01, 0.05] and p.download_bytes_per_s.tolist() == [1e6, 1e6]
    assert p.latency_s.tolist() == [0.2, 0.2]
    same = CallableDeviceModel(lambda ids: DeviceProfiles(*(np.ones(len(ids)),) * 4)).profiles(np.array([1]))
    assert same == DeviceProfiles(*(np.ones(1),) * 4)


def test_recorded_by_the_functions_import_path():
    model = CallableDeviceModel(two_phones)
    assert repr(model) == f"CallableDeviceModel(function={__name__}.two_phones)"
    assert model.settings() == {"function": two_phones}


@pytest.mark.parametrize("result, message", [
    ({"seconds_per_sample": 0.1}, r"missing \['download_bytes_per_s', 'upload_bytes_per_s', 'latency_s'\]"),
    (dict(two_phones(np.arange(2)), speed=1), r"unknown \['speed'\]"),
    (dict(two_phones(np.arange(2)), upload_bytes_per_s=0.0), "`upload_bytes_per_s` must be numbers > 0"),
    (dict(two_phones(np.arange(2)), latency_s=np.nan), "`latency_s` must be finite numbers >= 0, got nan"),
    (dict(two_phones(np.arange(2)), seconds_per_sample=np.ones(3)), r"`seconds_per_sample` must have shape \(2,\)"),
    ([1, 2], "must give a DeviceProfiles or a dict"),
])
def test_a_malformed_result_is_refused_naming_the_field(result, message):
    with pytest.raises(ArgumentError, match=message):
        CallableDeviceModel(lambda ids: result).profiles(np.arange(2))


def test_not_a_callable():
    with pytest.raises(ArgumentError, match="`function` must be a callable"):
        CallableDeviceModel(3)
