"""CallableDeviceModel (issue #53 item 1c)."""

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
    assert all(np.array_equal(a, np.ones(1)) for a in same)


def test_recorded_by_the_functions_import_path():
    model = CallableDeviceModel(two_phones)
    assert repr(model) == f"CallableDeviceModel(function={__name__}.two_phones)"
    assert model.settings() == {"function": two_phones}


def test_a_malformed_result_is_refused_naming_the_function():
    with pytest.raises(ArgumentError, match=r"CallableDeviceModel's function .*<lambda>: `latency_s` must be finite"):
        CallableDeviceModel(lambda ids: dict(two_phones(ids), latency_s=-1.0)).profiles(np.arange(2))


def test_not_a_callable():
    with pytest.raises(ArgumentError, match="`function` must be a callable"):
        CallableDeviceModel(3)
