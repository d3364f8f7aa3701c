"""The data source, one part of FederatedDataModule (#40 item 1): the datasets, labels and ids read without decoding
samples, the set-up checks, the batch format of Hugging Face datasets; on a TensorDataset and on a real
``datasets.Dataset.from_dict``."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from lightning_fed.datamodules import DataSource, FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.huggingface import HFTensorColumns


def _tensors(n=12):
    return TensorDataset(torch.arange(n * 2, dtype=torch.float32).reshape(n, 2), torch.arange(n) % 3)


def _hf(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return datasets.Dataset.from_dict({
        "image": rng.normal(size=(n, 2, 3)).astype(np.float32),  # nested lists, fixed shape
        "digit": rng.integers(0, 4, n),
        "user": np.repeat(np.arange(n // 3), 3),
    })


class _Targets(torch.utils.data.Dataset):
    """A torchvision-style dataset: labels in ``targets``, decoding a sample is an error."""

    def __init__(self, targets, writer=None):
        self.targets = targets
        if writer is not None:
            self.writer = writer

    def __len__(self):
        return 6

    def __getitem__(self, i):
        raise AssertionError("labels and ids must be read without decoding samples")


# ------------------------------------------------------------------ labels and ids
def test_labels_are_read_from_labels_then_targets_then_the_label_column():
    assert DataSource(_Targets(torch.tensor([0, 1, 2, 0, 1, 2])), labels=[5, 4, 3, 2, 1, 0]).read_labels(
        needed_by="X").tolist() == [5, 4, 3, 2, 1, 0]
    labels = DataSource(_Targets(torch.tensor([0, 1, 2, 0, 1, 2]))).read_labels(needed_by="X")
    assert isinstance(labels, np.ndarray) and labels.tolist() == [0, 1, 2, 0, 1, 2]
    hf = _hf()
    source = DataSource(hf, label_column="digit")
    source.setup()
    np.testing.assert_array_equal(source.read_labels(needed_by="X"), np.asarray(hf["digit"]))
    names = DataSource(_Targets(["cat", "dog", "cat", "owl", "dog", "cat"])).read_labels(needed_by="X")
    assert names.dtype.kind == "U"  # text class names pass; the partitioner encodes them


def test_missing_labels_are_optional_or_an_error_naming_who_needs_them():
    source = DataSource(_tensors())
    assert source.read_labels() is None
    with pytest.raises(ValueError, match=r"ShardPartitioner needs labels: pass `labels=`, .*`targets`.*"
                                         r"`label_column` \(now 'label'\)"):
        source.read_labels(needed_by="ShardPartitioner")
    hf = DataSource(_hf())  # no "label" column: the default label_column names nothing
    hf.setup()
    with pytest.raises(ValueError, match=r"`label_column` \(now 'label'\)"):
        hf.read_labels(needed_by="DirichletPartitioner")


@pytest.mark.parametrize("labels, match", [
    (np.zeros(5, dtype=np.int64), r"`labels` must have shape \[12\] \(one per training sample\), got \(5,\)"),
    (np.zeros((12, 2), dtype=np.int64), r"`labels` must have shape \[12\] .*got \(12, 2\)"),
    (np.linspace(0, 1, 12), "`labels` must be integer class indices or text / object class names, got dtype "
                            "float64"),
])
def test_malformed_labels_are_refused_by_name_when_needed_and_ignored_when_optional(labels, match):
    source = DataSource(_tensors(), labels=labels)
    with pytest.raises(ValueError, match=match):
        source.read_labels(needed_by="DirichletPartitioner")
    assert source.read_labels() is None


def test_ids_are_read_from_a_column_or_an_attribute_and_a_missing_one_is_named():
    hf = _hf()
    source = DataSource(hf)
    source.setup()
    np.testing.assert_array_equal(source.read_column("user"), np.asarray(hf["user"]))
    with pytest.raises(ValueError, match=r"`id_column` 'writer' is not a column of the dataset; columns: "
                                         r"\['image', 'digit', 'user'\]"):
        source.read_column("writer")
    ids = DataSource(_Targets([0] * 6, writer=torch.tensor([3, 3, 1, 1, 2, 2]))).read_column("writer")
    assert isinstance(ids, np.ndarray) and ids.tolist() == [3, 3, 1, 1, 2, 2]
    with pytest.raises(ValueError, match=r"`id_column` 'writer' is not an attribute of TensorDataset; .*"
                                         r"`dataset.writer`"):
        DataSource(_tensors()).read_column("writer")


# ------------------------------------------------------------------ set-up
def test_setup_loads_once_keeps_given_splits_and_gives_hugging_face_the_torch_format():
    calls = []

    def load():
        calls.append(1)
        return _hf(), _hf(6, seed=1), _hf(6, seed=2)

    given_val = _tensors(6)
    source = DataSource(val_dataset=given_val)
    source.setup(load)
    assert len(calls) == 1 and source.val_dataset is given_val  # a given split wins over the loaded one
    assert source.train_dataset.format["type"] == "torch" and source.test_dataset.format["type"] == "torch"
    train = source.train_dataset
    source.setup(load)  # a train_dataset: nothing loaded again
    assert len(calls) == 1 and source.train_dataset is train
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        DataSource().setup()


def test_setup_refuses_datasets_that_are_not_map_style_naming_them():
    splits = datasets.DatasetDict({"train": _hf(), "test": _hf(6)})
    with pytest.raises(TypeError, match=r"`train_dataset` is a Hugging Face DatasetDict with splits \['test', "
                                        r"'train'\]; select one split, e.g. `dataset\['test'\]`"):
        DataSource(splits).setup()
    with pytest.raises(TypeError, match="`val_dataset` is an iterable \\(streaming\\) IterableDataset"):
        DataSource(_tensors(), val_dataset=_hf().to_iterable_dataset()).setup()
    with pytest.raises(TypeError, match=r"`test_dataset` is a dict with keys \['x'\]; pass one dataset"):
        DataSource(_tensors(), test_dataset={"x": _tensors()}).setup()


def test_batch_columns_are_checked_against_every_hugging_face_split():
    with pytest.raises(ValueError, match="`batch_columns` must be None .* got 'image'"):
        DataSource(_hf(), batch_columns="image")
    with pytest.raises(ValueError, match=r"`batch_columns` names \['label'\], not columns of `train_dataset`'s "
                                         r"batches; its columns: \['image', 'digit', 'user'\]"):
        DataSource(_hf(), batch_columns=("image", "label")).setup()
    with pytest.raises(ValueError, match="`batch_columns` names \\['digit'\\], not columns of `val_dataset`'s"):
        DataSource(_hf(), val_dataset=_hf(6).remove_columns("digit"), batch_columns=("image", "digit")).setup()
    with pytest.raises(ValueError, match=r"`batch_columns` \('x',\) names Hugging Face columns, but "
                                         r"`train_dataset` is a TensorDataset"):
        DataSource(_tensors(), batch_columns=("x",)).setup()
    DataSource(_hf(), val_dataset=_tensors(), batch_columns=("image", "digit")).setup()  # a torch val set: tuples


def test_a_ragged_hugging_face_column_is_refused_by_check_collatable():
    ragged = datasets.Dataset.from_dict({"tokens": [[1, 2, 3], [4], [5, 6]], "label": [0, 1, 0]})
    source = DataSource(ragged)
    source.setup()
    with pytest.raises(ValueError, match=r"column 'tokens' is ragged: .* from 1 \(row 1\) to 3 \(row 0\)"):
        source.check_collatable()
    DataSource(_tensors()).check_collatable()  # torch datasets: the loader collates them


# ------------------------------------------------------------------ batches
def test_tensor_columns_slice_the_same_batches_as_a_data_loader_once_per_train_dataset():
    source = DataSource(_hf(), batch_columns=("image", "digit"))
    source.setup()
    columns = source.tensor_columns()
    assert isinstance(columns, HFTensorColumns) and source.tensor_columns() is columns  # converted once
    index = torch.tensor([4, 0, 7])
    loader = DataLoader(Subset(source.train_dataset, index.tolist()), batch_size=3,
                        collate_fn=source.collate_fn(source.train_dataset))
    (x, y), = list(loader)
    sliced = columns.get_batch(index)
    assert isinstance(sliced, tuple) and torch.equal(sliced[0], x) and torch.equal(sliced[1], y)
    assert x.shape == (3, 2, 3)
    source.train_dataset = source.train_dataset.select(range(6))  # e.g. a wrapper set after setup
    assert source.tensor_columns() is not columns and len(source.tensor_columns().columns["image"]) == 6
    assert DataSource(_tensors()).tensor_columns() is None
    assert source.collate_fn(_tensors()) is None and DataSource(_hf()).collate_fn(_hf()) is None


def test_batch_hint_names_the_columns_of_dict_batches_only():
    error = TypeError("linear(): argument 'input' (position 1) must be Tensor, not str")
    source = DataSource(_hf())
    source.setup()
    assert "dicts of columns ['image', 'digit', 'user']" in source.batch_hint(error)
    assert source.batch_hint(ValueError("other")) is None
    with_tuples = DataSource(_hf(), batch_columns=("image", "digit"))
    with_tuples.setup()
    assert with_tuples.batch_hint(error) is None and DataSource(_tensors()).batch_hint(error) is None


# ------------------------------------------------------------------ in the data module
def test_the_data_module_reads_and_writes_its_datasets_through_the_source_and_reports_no_new_setting():
    dm = FederatedDataModule(_hf(), partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
                             label_column="digit", batch_columns=["image", "digit"], labels=None)
    assert isinstance(dm.data_source, DataSource) and dm.data_source.batch_columns == ("image", "digit")
    assert repr(dm.data_source) == ("DataSource(train_dataset=Dataset, val_dataset=NoneType, test_dataset=NoneType, "
                                    "label_column='digit', batch_columns=('image', 'digit'))")
    assert dm.label_column == "digit" and dm.labels is None
    dm.setup()
    assert dm.train_dataset is dm.data_source.train_dataset and dm.train_dataset.format["type"] == "torch"
    np.testing.assert_array_equal(dm.partition.labels, np.asarray(_hf()["digit"]))  # read from "digit"
    wrapper = Subset(dm.train_dataset, range(12))
    dm.train_dataset = wrapper  # tasks and attacks replace it after setup
    assert dm.data_source.train_dataset is wrapper and dm.collate_fn(dm.val_dataset) is None
    assert not {"label_column", "labels", "batch_columns", "train_dataset"} & set(dm.settings())
    assert "label_column" not in FederatedDataModule.run_setting_names()


def test_49_a_users_own_datasets_module_does_not_break_a_data_module_on_tensors(tmp_path, monkeypatch):
    """Before: a `datasets.py` of the user's first on sys.path was taken for Hugging Face's (looked up by name in
    sys.modules), and `setup` of every data module failed with "module 'datasets' has no attribute 'DatasetDict'".
    The user's module is imported from its file as `datasets` (what `import datasets` does with it first on
    sys.path). 12 samples, IIDPartitioner(3): 3 clients of 4 samples, client 1's 2 batches of 2 hold its own rows."""
    import importlib.util
    import sys

    from lightning_fed.datamodules.huggingface import hf_datasets

    (tmp_path / "datasets.py").write_text('WHO = "mine"\nclass Dataset:\n    pass\n')
    spec = importlib.util.spec_from_file_location("datasets", tmp_path / "datasets.py")
    users_own = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(users_own)
    monkeypatch.setitem(sys.modules, "datasets", users_own)
    monkeypatch.syspath_prepend(str(tmp_path))
    import datasets

    x, y = torch.arange(24, dtype=torch.float32).reshape(12, 2), torch.arange(12) % 3
    dm = FederatedDataModule(TensorDataset(x, y), val_dataset=TensorDataset(x[:4], y[:4]),
                             partitioner=IIDPartitioner(3, seed=0), clients_per_round=2, batch_size=2)
    dm.setup("fit")
    idx = dm.client_indices(1)
    batches = list(dm.client_dataloader(1, 0))
    got = torch.cat([b[0] for b in batches])
    assert sorted(got[:, 0].div(2).long().tolist()) == sorted(idx.tolist()), (got, idx)
    assert (datasets.WHO, hf_datasets(), dm.num_clients, len(idx), len(batches),
            len(next(iter(dm.val_dataloader()))[0])) == ("mine", None, 3, 4, 2, 4)
