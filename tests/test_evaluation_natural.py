"""Natural per-client evaluation splits: LEAF FEMNIST (each writer's test samples) and TFF Stack Overflow (each
user's test examples), from files written in the real on-disk formats; expected indices computed from the files."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FederatedDataModule
from lightning_fed.datamodules.partitioners.dirichlet import DirichletPartitioner
from lightning_fed.datamodules.partitioners.iid import IIDPartitioner
from lightning_fed.datamodules.tasks.emnist import EMNISTDataModule
from lightning_fed.datamodules.tasks.stackoverflow import StackOverflowNWPDataModule, StackOverflowTagDataModule
from lightning_fed.evaluation import FederatedEvaluation
from lightning_fed.models.emnist import EMNISTCNN
from lightning_fed.models.stackoverflow import StackOverflowNWP, StackOverflowTagLR
from tests.datamodules.tasks.test_emnist import make_torchvision_emnist
from tests.datamodules.tasks.test_stackoverflow import random_rows, write_tff_sqlite

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]

# LEAF FEMNIST: train samples per writer; test files (sorted by name) with their writers and sample counts.
# f0001_40 has no test samples; f0999_99 has test samples but no train samples.
LEAF_TRAIN = {"f0003_12": 7, "f0001_40": 5, "f0100_03": 9, "f0002_22": 4}
LEAF_TRAIN_FILES = [["f0003_12", "f0001_40"], ["f0100_03", "f0002_22"]]
LEAF_TEST_FILES = [[("f0100_03", 2), ("f0999_99", 2)], [("f0003_12", 3), ("f0002_22", 1)]]


def write_leaf(root: Path, seed: int = 0) -> Path:
    """LEAF's femnist layout: {root}/train/*.json, {root}/test/*.json; x in [0, 1], 1 = background."""
    rng = np.random.default_rng(seed)
    for part, files in (("train", [[(u, LEAF_TRAIN[u]) for u in g] for g in LEAF_TRAIN_FILES]),
                        ("test", LEAF_TEST_FILES)):
        (root / part).mkdir(parents=True)
        for k, users in enumerate(files):
            blob = {"users": [], "num_samples": [], "user_data": {}}
            for u, n in users:
                blob["users"].append(u)
                blob["num_samples"].append(n)
                blob["user_data"][u] = {"x": (rng.integers(0, 256, size=(n, 784)) / 255.0).tolist(),
                                        "y": rng.integers(0, 62, size=n).tolist()}
            (root / part / f"all_data_{k}_niid_1_keep_0_{part}_9.json").write_text(json.dumps(blob))
    return root


def leaf_test_truth(root: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Re-read the test JSON files: the writer, pixels (0 = background, uint8) and label of every test sample, in
    the order of the sorted files."""
    owners, pixels, labels = [], [], []
    for path in sorted((root / "test").glob("*.json")):
        blob = json.loads(path.read_text())
        for u in blob["users"]:
            x = np.asarray(blob["user_data"][u]["x"])
            owners += [u] * len(x)
            pixels.append(np.rint((1.0 - x) * 255).astype(np.uint8).reshape(-1, 28, 28))
            labels += blob["user_data"][u]["y"]
    return owners, np.concatenate(pixels), np.asarray(labels)


# ------------------------------------------------------------------------------------------------ EMNIST / FEMNIST
def test_femnist_eval_indices_are_each_writers_test_samples(tmp_path):
    root = write_leaf(tmp_path / "leaf")
    dm = EMNISTDataModule(leaf_path=root, clients_per_round=2, eval_clients_per_round="all")
    dm.setup("fit")
    owners, pixels, labels = leaf_test_truth(root)
    writers = sorted(LEAF_TRAIN)  # client c = the c-th train writer by name
    assert dm.client_eval_dataset is dm.test_dataset and len(dm.test_dataset) == 8
    for c, w in enumerate(writers):
        expected = [j for j, o in enumerate(owners) if o == w]
        idx = dm.client_eval_indices(c)
        assert idx.tolist() == expected
        assert torch.equal(dm.test_dataset.data[torch.from_numpy(idx)], torch.from_numpy(pixels[expected]))
        assert dm.test_dataset.targets[torch.from_numpy(idx)].tolist() == labels[expected].tolist()
    # f0001_40 (client 0) has no test samples: never evaluated; f0999_99's samples belong to no client
    assert dm.eval_client_ids().tolist() == [1, 2, 3]
    assert dm.select_eval_clients(0).tolist() == [1, 2, 3]
    assert sum(len(dm.client_eval_indices(c)) for c in range(4)) == 6
    # the training side is unchanged: each client trains on all its train samples
    assert dm.partition.sizes().tolist() == [LEAF_TRAIN[w] for w in writers]


def test_femnist_eval_batches_are_sliced_test_samples(tmp_path):
    root = write_leaf(tmp_path / "leaf")
    dm = EMNISTDataModule(leaf_path=root, clients_per_round=2, eval_clients_per_round=2, eval_batch_size=2)
    dm.setup("fit")
    batches = list(dm.client_eval_dataloader(2))  # f0003_12: 3 test samples -> batches of 2 and 1
    idx = dm.client_eval_indices(2)
    assert [len(b[0]) for b in batches] == [2, 1]
    x = torch.cat([b[0] for b in batches])
    assert torch.equal(x, dm.test_dataset.data[torch.from_numpy(idx)].float().div(255).unsqueeze(1))
    assert len(dm.select_eval_clients(5)) == 2 and set(dm.select_eval_clients(5).tolist()) <= {1, 2, 3}


def test_emnist_without_a_natural_split_needs_eval_fraction(tmp_path):
    make_torchvision_emnist(tmp_path / "data", n_train=60, n_test=20)
    iid = IIDPartitioner(num_clients=4)
    with pytest.raises(ValueError, match="no natural per-client split.*no writer ids.*`eval_fraction`"):
        EMNISTDataModule(data_dir=tmp_path / "data", partitioner=iid, eval_clients_per_round="all")
    root = write_leaf(tmp_path / "leaf")
    with pytest.raises(ValueError, match="partitioner.*`eval_fraction`"):  # LEAF train data, another partitioner
        EMNISTDataModule(leaf_path=root, partitioner=iid, clients_per_round=2, eval_clients_per_round=2)
    # #40: with the per-writer split, eval_fraction replaces the writers' LEAF test samples (held out of train)
    dm = EMNISTDataModule(leaf_path=root, clients_per_round=2, eval_clients_per_round=2, eval_fraction=0.5)
    dm.setup("fit")
    assert dm.client_eval_dataset is dm.train_dataset and dm.eval_client_ids().size > 0
    with pytest.raises(ValueError, match="`eval_clients_per_round`"):
        EMNISTDataModule(data_dir=tmp_path / "data", partitioner=iid, eval_clients_per_round=0, eval_fraction=0.2)
    # torchvision EMNIST with eval_fraction: each client's share split (the generic split, seeded)
    dm = EMNISTDataModule(data_dir=tmp_path / "data", partitioner=iid, clients_per_round=2,
                          eval_clients_per_round="all", eval_fraction=0.25)
    dm.setup("fit")
    assert dm.natural_eval_split() is None and dm.client_eval_dataset is dm.train_dataset
    held = np.concatenate([dm.client_eval_indices(c) for c in range(4)])
    train = np.concatenate([dm.client_indices(c) for c in range(4)])
    assert [len(dm.client_eval_indices(c)) for c in range(4)] == [3, 3, 3, 3]  # floor(0.25 * 15) each
    assert sorted(np.concatenate([held, train]).tolist()) == list(range(60))
    # LEAF data with a Dirichlet partitioner and eval_fraction: no natural split either
    dm = EMNISTDataModule(leaf_path=root, clients_per_round=2, eval_clients_per_round="all", eval_fraction=0.25,
                          partitioner=DirichletPartitioner(num_clients=2, alpha=1.0, min_partition_size=3))
    dm.setup("fit")
    assert dm.natural_eval_split() is None and dm.client_eval_dataset is dm.train_dataset


def _femnist_expected(model, dm) -> dict[str, np.ndarray]:
    """Per-client val_loss / val_acc of the global model on each writer's test samples, by hand."""
    model.eval()
    out = {"val_loss": [], "val_acc": [], "n": []}
    with torch.no_grad():
        for c in dm.eval_client_ids().tolist():
            idx = torch.from_numpy(dm.client_eval_indices(c))
            x = dm.test_dataset.data[idx].double().div(255).unsqueeze(1).float()
            y = dm.test_dataset.targets[idx]
            logits = model(x)
            out["val_loss"].append(F.cross_entropy(logits, y).item())
            out["val_acc"].append((logits.argmax(1) == y).double().mean().item())
            out["n"].append(len(idx))
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def test_femnist_one_round_logs_fed_metrics_over_all_writers(tmp_path):
    root = write_leaf(tmp_path / "leaf")
    dm = EMNISTDataModule(leaf_path=root, clients_per_round=2, batch_size=4, eval_clients_per_round="all")
    torch.manual_seed(0)
    model = EMNISTCNN(lr=0.05)
    trainer = FederatedTrainer(max_epochs=1, check_val_every_n_epoch=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    metrics = trainer.callback_metrics
    expected = _femnist_expected(model, dm)
    fed = next(cb for cb in trainer.callbacks if isinstance(cb, FederatedEvaluation)).last
    assert fed.client_ids.tolist() == [1, 2, 3] and fed.samples.tolist() == [1, 3, 2]
    assert metrics["fed_eval_clients"].item() == 3
    for name in ("val_loss", "val_acc"):
        v, n = expected[name], expected["n"]
        np.testing.assert_allclose(fed.metrics[name], v, rtol=1e-5, atol=1e-6)
        worst = v.max() if name == "val_loss" else v.min()  # ceil(0.1 * 3) = 1 worst client
        want = {"weighted": (n * v).sum() / n.sum(), "mean": v.mean(), "p10": np.percentile(v, 10),
                "p50": np.median(v), "p90": np.percentile(v, 90), "worst10": worst}
        for stat, value in want.items():
            assert metrics[f"fed_{name}/{stat}"].item() == pytest.approx(value, rel=1e-5, abs=1e-6)
    # weighted over all writers' test samples = the mean over the 6 test samples of train writers
    assert metrics["fed_val_loss/weighted"].item() == pytest.approx(expected["val_loss"] @ expected["n"] / 6, rel=1e-5)


# ------------------------------------------------------------------------------------------------ Stack Overflow
def sqlite_truth(db: Path) -> tuple[list[str], list[str]]:
    """Straight from the SQLite file: the sorted distinct train users and the user of every test example (rowid
    order)."""
    con = sqlite3.connect(db)
    try:
        train = sorted({r[0] for r in con.execute("SELECT client_id FROM examples WHERE split_name = 'train'")})
        test = [r[0] for r in con.execute(
            "SELECT client_id FROM examples WHERE split_name = 'test' ORDER BY rowid")]
    finally:
        con.close()
    return train, test


def _so_dm(task, db, data_dir, **kw):
    common = dict(sqlite_path=str(db), data_dir=str(data_dir), vocab_size=15, max_examples_per_client=7,
                  num_eval_samples=9, clients_per_round=2, batch_size=3, seed=3, eval_clients_per_round="all")
    common.update(kw)
    if task == "nwp":
        return StackOverflowNWPDataModule(sequence_length=6, **common)
    return StackOverflowTagDataModule(num_tags=5, **common)


@pytest.mark.parametrize("task", ["nwp", "tag"])
@pytest.mark.parametrize("cache", [True, False])
def test_stackoverflow_eval_indices_are_each_users_test_examples(tmp_path, task, cache):
    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows())
    users, test_users = sqlite_truth(db)
    without_test = [u for u in users if u not in set(test_users)]
    test_only = [u for u in set(test_users) if u not in set(users)]
    assert without_test and test_only  # the file covers both cases
    for attempt in range(1 + int(cache)):  # with the cache: built, then loaded from it
        dm = _so_dm(task, db, tmp_path, cache=cache)
        dm.setup("fit")
        assert dm.client_eval_dataset is dm.test_dataset and len(dm.test_dataset) == len(test_users)
        assert bool(dm.test_dataset._files) == cache  # memory-mapped from the cache folder
        assert dm.num_clients == len(users)
        for c, u in enumerate(users):
            assert dm.client_eval_indices(c).tolist() == [j for j, t in enumerate(test_users) if t == u]
        eligible = [c for c, u in enumerate(users) if u not in without_test]
        assert dm.eval_client_ids().tolist() == eligible == dm.select_eval_clients(0).tolist()
        covered = sum(len(dm.client_eval_indices(c)) for c in range(dm.num_clients))
        assert covered == sum(t in set(users) for t in test_users)  # test-only users' examples: no client
        c = max(eligible, key=lambda k: len(dm.client_eval_indices(k)))
        idx = dm.client_eval_indices(c)
        got = [torch.cat(parts) for parts in zip(*dm.client_eval_dataloader(c))]
        for a, b in zip(got, dm.test_dataset.get_batch(torch.from_numpy(idx))):
            assert torch.equal(a, b)
        # the grouping kept with the data (cache files or in-memory build) = the generic grouping of the ids
        assert dm._test_groups is not None
        _, generic = FederatedDataModule.natural_eval_partition(dm)
        _, kept = dm.natural_eval_partition()
        assert np.array_equal(generic.indices, kept.indices) and np.array_equal(generic.offsets, kept.offsets)
        _, lists = dm.natural_eval_indices()
        assert [g.tolist() for g in lists] == [dm.client_eval_indices(c).tolist() for c in range(dm.num_clients)]
    if cache:
        (folder,) = (tmp_path / "stackoverflow").glob(f"{task}-*")  # reused, not rebuilt
        order = np.load(folder / "test_client_order.npy")
        offsets = np.load(folder / "test_client_offsets.npy")
        assert order.dtype == offsets.dtype == np.int64 and offsets.tolist()[0] == 0
        assert [order[offsets[c]:offsets[c + 1]].tolist() for c in range(len(users))] == [
            [j for j, t in enumerate(test_users) if t == u] for u in users]


def test_stackoverflow_grouping_across_chunks(tmp_path, monkeypatch):
    import lightning_fed.datamodules.tasks.stackoverflow.cache as so

    monkeypatch.setattr(so, "_CHUNK_ROWS", 5)  # the counting sort's chunks split every user's test examples
    monkeypatch.setattr(so, "_COPY_ELEMS", 3)
    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows(seed=1, n=600))
    users, test_users = sqlite_truth(db)
    dm = _so_dm("tag", db, tmp_path, cache=True)
    dm.setup("fit")
    for c, u in enumerate(users):
        assert dm.client_eval_indices(c).tolist() == [j for j, t in enumerate(test_users) if t == u]


def test_stackoverflow_eval_arguments_are_checked(tmp_path):
    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows())
    with pytest.raises(ValueError, match="`eval_clients_per_round`"):
        _so_dm("nwp", db, tmp_path, eval_clients_per_round=0)
    with pytest.raises(ValueError, match="`eval_local_steps`"):
        _so_dm("tag", db, tmp_path, eval_local_steps=-1)
    with pytest.raises(ValueError, match="need federated evaluation"):
        _so_dm("tag", db, tmp_path, eval_clients_per_round=None, eval_csv=str(tmp_path / "x.csv"))
    dm = _so_dm("nwp", db, tmp_path, eval_clients_per_round=100, cache=False)
    with pytest.raises(ValueError, match="must not exceed the number of clients with evaluation data"):
        dm.setup("fit")


def test_stackoverflow_tag_one_round_logs_fed_metrics_over_all_users(tmp_path):
    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows())
    dm = _so_dm("tag", db, tmp_path, cache=True, eval_batch_size=4)
    torch.manual_seed(0)
    model = StackOverflowTagLR(vocab_size=15, num_tags=5, lr=0.5)
    trainer = FederatedTrainer(max_epochs=1, check_val_every_n_epoch=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    metrics = trainer.callback_metrics
    clients = dm.eval_client_ids()
    losses, sizes = [], []
    model.eval()
    with torch.no_grad():
        for c in clients.tolist():
            x, y = dm.test_dataset.get_batch(torch.from_numpy(dm.client_eval_indices(c)))
            # mean BCE over the client's examples and tags (its batches' means weighted by batch size)
            losses.append(F.binary_cross_entropy_with_logits(model(x).double(), y.double()).item())
            sizes.append(len(y))
    v, n = np.asarray(losses), np.asarray(sizes, dtype=np.float64)
    assert metrics["fed_eval_clients"].item() == len(clients)
    # per client, the logged torchmetrics value covers that client's examples only (not the central validation's
    # accumulated state: the first client used to include it)
    fed = next(cb for cb in trainer.callbacks if isinstance(cb, FederatedEvaluation)).last
    assert fed.client_ids.tolist() == clients.tolist() and fed.samples.tolist() == sizes
    np.testing.assert_allclose(fed.metrics["val_loss"], v, rtol=1e-5)
    assert metrics["fed_val_loss/weighted"].item() == pytest.approx((n * v).sum() / n.sum(), rel=1e-5)
    assert metrics["fed_val_loss/mean"].item() == pytest.approx(v.mean(), rel=1e-5)
    assert metrics["fed_val_loss/p50"].item() == pytest.approx(np.median(v), rel=1e-5)
    assert metrics["fed_val_loss/worst10"].item() == pytest.approx(np.sort(v)[-int(np.ceil(0.1 * v.size)):].mean(),
                                                                   rel=1e-5)
    assert "fed_val_recall_at_5/weighted" in metrics


def test_stackoverflow_nwp_one_round_with_personalized_eval(tmp_path):
    db = write_tff_sqlite(tmp_path / "so.sqlite", random_rows())
    dm = _so_dm("nwp", db, tmp_path, cache=False, eval_clients_per_round=3, eval_local_steps=1,
                eval_csv=str(tmp_path / "eval.csv"))
    model = StackOverflowNWP(vocab_size=15, embedding_dim=4, hidden_size=8, lr=0.1)
    trainer = FederatedTrainer(max_epochs=1, check_val_every_n_epoch=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    metrics = trainer.callback_metrics
    assert metrics["fed_eval_clients"].item() == 3
    assert {"fed_val_loss/weighted", "fed_val_acc/weighted", "fed_personalized_val_loss/weighted"} <= set(metrics)
    rows = (tmp_path / "eval.csv").read_text().splitlines()
    assert len(rows) == 4  # header + one row per evaluation client
    for row in rows[1:]:
        _, cid, samples = row.split(",")[:3]
        assert int(samples) == len(dm.client_eval_indices(int(cid))) > 0


# ---------------------------------------------------------------------------------------------- issue #31, item 15
class _NaturalSplit(FederatedDataModule):
    """A natural per-client evaluation split (``test`` samples tagged with their client's natural id) and no
    ``val_dataset``."""

    def __init__(self, test, test_ids, **kwargs):
        super().__init__(**kwargs)
        self._test, self._test_ids = test, test_ids

    def natural_eval_split(self):
        return self._test, self._test_ids


def test_natural_split_without_val_dataset_runs_federated_evaluation(tmp_path):
    """Item 15: with a natural per-client evaluation split and no ``val_dataset``, federated evaluation runs (the
    validation loop is not skipped for want of a central loader); its per-client losses match NumPy, and the central
    ``val_loss`` is over the union of the clients' evaluation data."""
    from helpers import LinearRegression, regression_data
    from lightning_fed.datamodules import NaturalIdPartitioner
    from torch.utils.data import TensorDataset

    x, y = regression_data(n=40, seed=0)
    ids = np.repeat(np.array([10, 20, 30, 40]), 10)
    train = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    train.client_id = ids
    tx, ty = regression_data(n=9, seed=1)
    test_ids = np.array([20, 10, 20, 30, 99, 10, 20, 30, 30])  # 99 is nobody's: never evaluated; 40 has no test data
    dm = _NaturalSplit(TensorDataset(torch.from_numpy(tx), torch.from_numpy(ty)), test_ids, train_dataset=train,
                       partitioner=NaturalIdPartitioner("client_id"), clients_per_round=2, batch_size=5,
                       eval_clients_per_round="all", eval_batch_size=2)
    model = LinearRegression()
    trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
    trainer.fit(model, datamodule=dm)
    last = next(cb for cb in trainer.callbacks if isinstance(cb, FederatedEvaluation)).last
    assert last is not None and last.client_ids.tolist() == [0, 1, 2]
    w = model.linear.weight.detach().numpy().ravel()
    b = float(model.linear.bias.detach())
    mse = [np.mean((tx[test_ids == i] @ w + b - ty[test_ids == i]) ** 2) for i in (10, 20, 30)]
    assert last.samples.tolist() == [2, 3, 3]
    np.testing.assert_allclose(last.metrics["val_loss"], mse, rtol=1e-9)
    assert float(trainer.callback_metrics["fed_eval_clients"]) == 3
    known = test_ids != 99
    central = np.mean((tx[known] @ w + b - ty[known]) ** 2)
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(central, rel=1e-9)
