"""GroupedNaturalIdPartitioner: group_size natural ids per client, Flower's remainder modes."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.datamodules import GroupedNaturalIdPartitioner

IDS = np.array(["b", "a", "c", "d", "e", "a", "b", "e"])  # sorted ids: a(1,5) b(0,6) c(2) d(3) e(4,7)


@pytest.mark.parametrize(
    "mode, expected, names",
    [
        ("allow-smaller", [[1, 5, 0, 6], [2, 3], [4, 7]], [("a", "b"), ("c", "d"), ("e",)]),
        ("allow-bigger", [[1, 5, 0, 6], [2, 3, 4, 7]], [("a", "b"), ("c", "d", "e")]),
        ("drop-remainder", [[1, 5, 0, 6], [2, 3]], [("a", "b"), ("c", "d")]),
    ],
)
def test_hand_computed_groups(mode, expected, names):
    p = GroupedNaturalIdPartitioner(2, mode=mode).partition(len(IDS), ids=IDS)
    assert [p.client_indices(c).tolist() for c in range(p.num_clients)] == expected
    assert list(p.client_names) == names


def test_strict_and_group_size_one_is_the_natural_partition():
    from lightning_fed.datamodules import NaturalIdPartitioner

    a = GroupedNaturalIdPartitioner(1, mode="strict").partition(len(IDS), ids=IDS)
    b = NaturalIdPartitioner().partition(len(IDS), ids=IDS)
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.offsets, b.offsets)
    with pytest.raises(ValueError, match="not a multiple of `group_size`=2"):
        GroupedNaturalIdPartitioner(2, mode="strict").partition(len(IDS), ids=IDS)
    with pytest.raises(ValueError, match="fewer than `group_size`=9"):
        GroupedNaturalIdPartitioner(9, mode="allow-bigger").partition(len(IDS), ids=IDS)
    assert GroupedNaturalIdPartitioner(9).partition(len(IDS), ids=IDS).num_clients == 1


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(group_size=0), ValueError, "group_size"),
        (dict(group_size="2"), TypeError, "group_size"),
        (dict(group_size=2, mode="drop-reminder"), ValueError, "mode.*'drop-remainder'"),
        (dict(group_size=2, id_column=""), ValueError, "id_column"),
    ],
)
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        GroupedNaturalIdPartitioner(**kwargs)


def test_ids_errors_are_the_natural_ones():
    with pytest.raises(ValueError, match="every sample needs a client id"):
        GroupedNaturalIdPartitioner(2).partition(3, ids=["a", None, "b"])
