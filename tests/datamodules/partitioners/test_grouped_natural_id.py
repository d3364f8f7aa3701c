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
        # Flower's np.array_split: the leftover id goes to the first group (this expectation changed in #31 item 18;
        # it was [[1, 5, 0, 6], [2, 3, 4, 7]], the leftover given to the last group)
        ("allow-bigger", [[1, 5, 0, 6, 2], [3, 4, 7]], [("a", "b", "c"), ("d", "e")]),
        ("drop-remainder", [[1, 5, 0, 6], [2, 3]], [("a", "b"), ("c", "d")]),
    ],
)
def test_hand_computed_groups(mode, expected, names):
    p = GroupedNaturalIdPartitioner(2, mode=mode).partition(len(IDS), ids=IDS)
    assert [p.client_indices(c).tolist() for c in range(p.num_clients)] == expected
    assert list(p.client_names) == names


@pytest.mark.parametrize("num_ids, group_size", [(7, 2), (11, 3), (5, 3), (10, 4), (13, 4), (9, 3), (2, 2)])
def test_allow_bigger_is_flowers_array_split(num_ids, group_size):
    """``allow-bigger`` gives the leftover ids one each to the first groups, as Flower's
    ``np.array_split(unique_ids, U // group_size)``: 7 ids in pairs -> [3, 2, 2], 11 in threes -> [4, 4, 3]."""
    names = [f"u{i:02d}" for i in range(num_ids)]  # sort order = this order
    ids = np.array(names * 2)  # every id has two samples: positions i and num_ids + i
    p = GroupedNaturalIdPartitioner(group_size, mode="allow-bigger").partition(len(ids), ids=ids)
    flower = np.array_split(np.array(names), num_ids // group_size)
    assert [list(c) for c in p.client_names] == [g.tolist() for g in flower]
    expected = [[i for name in g for i in (names.index(name), num_ids + names.index(name))] for g in flower]
    assert [p.client_indices(c).tolist() for c in range(p.num_clients)] == expected
    if (num_ids, group_size) == (7, 2):
        assert [len(c) for c in p.client_names] == [3, 2, 2]
    if (num_ids, group_size) == (11, 3):
        assert [len(c) for c in p.client_names] == [4, 4, 3]


@pytest.mark.parametrize("mode", ["allow-smaller", "drop-remainder", "strict"])
@pytest.mark.parametrize("num_ids, group_size", [(7, 2), (11, 3), (2, 3), (12, 4), (10, 2)])
def test_other_modes_match_flower(mode, num_ids, group_size):
    """The other modes as Flower computes them: ``allow-smaller`` splits the first ``U // g * g`` ids into equal groups
    and appends the ``r`` leftover ids as one last group (a single group when ``U < g``); ``drop-reminder`` (our
    ``drop-remainder``) drops them; ``strict`` refuses ``r > 0``."""
    names = [f"u{i:02d}" for i in range(num_ids)]
    full, rest = divmod(num_ids, group_size)
    part = GroupedNaturalIdPartitioner(group_size, mode=mode)
    if (mode == "strict" and rest) or (mode != "allow-smaller" and full == 0):
        with pytest.raises(ValueError, match="group_size"):
            part.partition(num_ids, ids=np.array(names))
        return
    p = part.partition(num_ids, ids=np.array(names))
    if mode == "allow-smaller" and full == 0:
        flower = [np.array(names)]
    else:
        flower = np.array_split(np.array(names[: full * group_size]), full)
        if mode == "allow-smaller" and rest:
            flower.append(np.array(names[-rest:]))
    assert [list(c) for c in p.client_names] == [g.tolist() for g in flower]


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
