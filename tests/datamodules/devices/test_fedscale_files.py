"""Reading FedScale's device-trace files (issue #53 item 1b): FedScale's pickled dicts (its "Device Trace File
Formats") and the same content as JSON, written here in those formats; bad files refused naming file, key and field;
a pickle that names a global never runs it; reads bounded."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from lightning_fed.datamodules.devices.fedscale_files import (
    TraceFileError, read_behaviour_trace, read_capacity_trace, read_trace,
)


class _Payload:
    def __reduce__(self):
        return (print, ("this pickle ran code",))


def test_fedscale_pickles_and_their_json_read_alike(tmp_path):
    capacity = {432802: {"computation": 162.0, "communication": 5648.109619499134}, 7: {"computation": np.float64(3.5),
                                                                                           "communication": 10}}
    behaviour = {5: {"duration": 86400, "inactive": [700, 90], "finish_time": 86400, "active": [600, 0],
                     "model": "SM-G950F"}}
    (tmp_path / "cap").write_bytes(pickle.dumps(capacity))
    (tmp_path / "beh").write_bytes(pickle.dumps(behaviour))
    (tmp_path / "cap.json").write_text(json.dumps({str(k): {f: float(v) for f, v in r.items()}
                                                   for k, r in capacity.items()}))
    (tmp_path / "beh.json").write_text(json.dumps(behaviour))
    expected_cap = {432802: (162.0, 5648.109619499134), 7: (3.5, 10.0)}
    expected_beh = {5: (86400.0, [600.0, 0.0], [700.0, 90.0])}  # as in the file; the model sorts them
    assert read_capacity_trace(tmp_path / "cap") == read_capacity_trace(tmp_path / "cap.json") == expected_cap
    assert read_behaviour_trace(tmp_path / "beh") == read_behaviour_trace(tmp_path / "beh.json") == expected_beh


@pytest.mark.parametrize("content, match", [
    (pickle.dumps([1, 2]), r"must hold a dict of client id -> row \(FedScale's format\), got list"),
    (pickle.dumps({}), r"holds no client \(an empty dict\)"),
    (b"not a pickle", r"is not a readable pickle of a dict"),
    (pickle.dumps({1: _Payload()}), r"global builtins\.print is not allowed"),
    (pickle.dumps({7: {"computation": 1.0}}), r"client 7 has no 'communication'"),
    (pickle.dumps({7: [1.0, 2.0]}), r"client 7 must map to a dict, got list"),
    (pickle.dumps({7: {"computation": "fast", "communication": 1.0}}), r"client 7 'computation' must be a finite "
                                                                        r"number >= 0, got 'fast'"),
    (pickle.dumps({7: {"computation": 1.0, "communication": 0.0}}), r"client 7 'communication' must be a finite "
                                                                      r"number > 0, got 0.0"),
    (pickle.dumps({7: {"computation": 1.0, "communication": 2.0}, "7": {"computation": 1.0, "communication": 2.0}}),
     "names a client twice"),
])
def test_bad_capacity_files_are_refused_naming_file_and_key(tmp_path, capsys, content, match):
    path = tmp_path / "client_device_capacity"
    path.write_bytes(content)
    with pytest.raises(TraceFileError, match=match) as info:
        read_capacity_trace(path)
    assert str(path) in str(info.value) and "capacity trace" in str(info.value)
    assert "ran code" not in capsys.readouterr().out  # the pickle's code never ran


@pytest.mark.parametrize("row, match", [
    ({"active": [1], "inactive": [2]}, "client 1 has no 'finish_time'"),
    ({"finish_time": 0, "active": [1], "inactive": [2]}, "client 1 'finish_time' must be a finite number > 0"),
    ({"finish_time": 9, "active": [], "inactive": []}, "client 1 'active' must be a non-empty list of seconds"),
    ({"finish_time": 9, "active": 3, "inactive": [4]}, "client 1 'active' must be a non-empty list of seconds"),
    ({"finish_time": 9, "active": [1, 3], "inactive": [2]}, "client 1 has 2 'active' but 1 'inactive' times"),
    ({"finish_time": 9, "active": [1, 5], "inactive": [2, 4]}, r"client 1 interval 1 ends before it starts "
                                                               r"\(active=5.0, inactive=4.0\)"),
    ({"finish_time": 9, "active": [-1], "inactive": [2]}, r"client 1 'active\[0\]' must be a finite number >= 0"),
])
def test_bad_behaviour_files_are_refused_naming_file_key_and_field(tmp_path, row, match):
    path = tmp_path / "client_behave_trace"
    path.write_bytes(pickle.dumps({1: row}))
    with pytest.raises(TraceFileError, match=match) as info:
        read_behaviour_trace(path)
    assert str(path) in str(info.value) and "behaviour trace" in str(info.value)


def test_reads_are_bounded_and_a_missing_file_named(tmp_path):
    path = tmp_path / "client_device_capacity"
    path.write_bytes(pickle.dumps({1: {"computation": 1.0, "communication": 2.0}}))
    with pytest.raises(TraceFileError, match=rf"capacity trace '{path}' is \d+ bytes, over the limit max_bytes=10"):
        read_capacity_trace(path, max_bytes=10)
    with pytest.raises(TraceFileError, match="trace '.*missing': no such file"):
        read_trace(tmp_path / "missing")
    bad_json = tmp_path / "t.json"
    bad_json.write_text("{1: 2}")
    with pytest.raises(TraceFileError, match=r"t\.json' is not a readable JSON"):
        read_trace(bad_json)
