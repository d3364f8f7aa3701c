"""NaturalIdPartitioner: None/NaN ids and ids mixing kinds get one clear error naming ``ids`` (issue #16 items 7,
13) instead of a NumPy TypeError -- or, for ``[7, "7"]``, a silent merge of two clients into one."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_fed.datamodules.partitioners.natural_id import NaturalIdPartitioner


def test_text_ids_partition_by_sorted_id():
    p = NaturalIdPartitioner().partition(5, ids=["u2", "u1", "u2", "u3", "u1"])
    assert p.client_names.tolist() == ["u1", "u2", "u3"]
    assert [p.client_indices(c).tolist() for c in range(3)] == [[1, 4], [0, 2], [3]]


def test_int_and_text_ids_are_not_merged():
    # before: np.asarray([7, "7", 8]) == ["7", "7", "8"] -> 2 clients, samples 0 and 1 silently merged
    with pytest.raises(TypeError, match=r"`ids` \(column 'client_id'\) mix kinds of ids \(number 7 at sample 0, "
                                        r"text '7' at sample 1\)"):
        NaturalIdPartitioner().partition(3, ids=[7, "7", 8])


@pytest.mark.parametrize("ids", [["a", None, "b"], [1, None, 2], np.array(["a", None, "b"], dtype=object)])
def test_none_id_is_refused(ids):
    with pytest.raises(ValueError, match=r"`ids` \(column 'client_id'\) hold None at sample 1 \(1 such samples\)"):
        NaturalIdPartitioner().partition(3, ids=ids)


def test_mixed_object_array_is_refused():
    with pytest.raises(TypeError, match="mix kinds of ids"):
        NaturalIdPartitioner("writer").partition(3, ids=np.array([1, "x", 2], dtype=object))


def test_nan_id_is_refused_with_its_position():
    with pytest.raises(ValueError, match="NaN .*first at sample 2"):
        NaturalIdPartitioner().partition(3, ids=np.array([1.0, 2.0, np.nan]))
    with pytest.raises(ValueError, match=r"NaN \(first at sample 0\)"):
        NaturalIdPartitioner().partition(2, ids=[float("nan"), 1.0])


def test_homogeneous_ids_unchanged():
    p = NaturalIdPartitioner().partition(4, ids=[3, 1, 3, 2])
    assert p.client_names.tolist() == [1, 2, 3]
    p = NaturalIdPartitioner().partition(3, ids=np.array(["b", "a", "b"], dtype=object))
    assert p.client_names.tolist() == ["a", "b"]


# ----------------------------------------------------------------------------------- NaturalId
def test_natural_id_groups_by_sorted_unique_id():
    ids = np.array(["bob", "al", "bob", "cy", "al", "bob"])
    p = NaturalIdPartitioner().partition(len(ids), ids=ids)
    np.testing.assert_array_equal(p.client_names, ["al", "bob", "cy"])
    assert [p.client_indices(c).tolist() for c in range(3)] == [[1, 4], [0, 2, 5], [3]]


def test_natural_id_million_clients():
    rng = np.random.default_rng(0)
    n = 2_000_000
    distinct = rng.choice(10**9, size=1_000_000, replace=False)  # 1,000,000 distinct ids, each used >= once
    ids = rng.permutation(distinct[np.concatenate([np.arange(1_000_000), rng.integers(0, 1_000_000, n - 1_000_000)])])
    p = NaturalIdPartitioner("user").partition(n, ids=ids)
    uniq, counts = np.unique(ids, return_counts=True)
    assert p.num_clients == len(uniq) == 1_000_000
    np.testing.assert_array_equal(p.client_names, uniq)
    np.testing.assert_array_equal(p.sizes(), counts)
    np.testing.assert_array_equal(np.sort(p.indices), np.arange(n))
    # every sample sits in the client of its id
    owner = np.repeat(np.arange(p.num_clients), p.sizes())
    np.testing.assert_array_equal(ids[p.indices], p.client_names[owner])


def test_natural_id_errors():
    with pytest.raises(ValueError, match="requires `ids`"):
        NaturalIdPartitioner().partition(5)
    with pytest.raises(ValueError, match="id_column"):
        NaturalIdPartitioner("")
    with pytest.raises(TypeError, match="id_column"):
        NaturalIdPartitioner(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ids"):
        NaturalIdPartitioner().partition(4, ids=np.arange(3))
    with pytest.raises(ValueError, match="NaN"):
        NaturalIdPartitioner().partition(2, ids=np.array([1.0, np.nan]))
