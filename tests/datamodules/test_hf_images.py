"""An Image column of a Hugging Face train_dataset in a federated fit (#52 3): each image decoded by ``datasets``
(the feature's ``decode_example``) when a client batch first holds it, the decoded rows kept in ``datasets``' cache
at the end of the fit and read back by later runs. The reference for the pixels is PIL itself (``Image.open``), for
the batches the torch format with a ``DataLoader``'s collation."""

from __future__ import annotations

import io

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

from lightning_fed.datamodules.huggingface import HFTensorColumns

ROWS = 16  # row i: user i mod 4 (NaturalIdPartitioner: 4 clients of 4 rows)


def _png(value, size=(4, 4)):
    buffer = io.BytesIO()
    Image.fromarray(np.full(size[::-1], value, dtype=np.uint8)).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def _saved(where, images):
    features = datasets.Features({"image": datasets.Image(), "y": datasets.Value("float32"),
                                  "user": datasets.Value("int64")})
    datasets.Dataset.from_dict({"image": images, "y": [float(i % 3) for i in range(len(images))],
                                "user": [i % 4 for i in range(len(images))]}, features=features).save_to_disk(where)


class _Pixels(__import__("lightning").LightningModule):
    """A scalar weight trained on the mean pixel of each batch: its final value depends on every pixel read."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def training_step(self, batch, batch_idx):
        return ((self.w - batch["image"].double().mean() / 255) ** 2).float()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path, where, seed):
    """One round, 1 of 4 clients: returns (the trained weight, the rows its client batches held)."""
    from helpers import quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner

    dm = FederatedDataModule(datasets.load_from_disk(str(where)), partitioner=NaturalIdPartitioner("user"),
                             clients_per_round=1, batch_size=2, seed=seed)
    model = _Pixels()
    FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path)).fit(model, datamodule=dm)
    rows = {int(r) for c in dm.sample_clients(0) for batch in dm.client_batches(int(c), 0) for r in batch}
    return model.w.item(), rows


def _count_decodes(monkeypatch):
    calls = []
    decode = datasets.Image.decode_example
    monkeypatch.setattr(datasets.Image, "decode_example", lambda self, *a, **k: calls.append(1) or decode(self, *a, **k))
    return calls


def test_a_fit_decodes_the_rows_its_clients_read_and_later_runs_decode_only_rows_no_run_decoded(tmp_path,
                                                                                                monkeypatch):
    """Before, a fit decoded all 16 images (and the first again, for the shape) at its first client batch; now it
    decodes the first (shape) and the 4 rows of its one client. The rows are kept in one ``cache-*.arrow`` file next
    to the dataset's files: the same fit again decodes only the first, and trains the same weight as on a
    TensorDataset of PIL's pixels; another cohort decodes only its own rows."""
    where = tmp_path / "saved"
    _saved(str(where), [_png(16 * i) for i in range(ROWS)])
    calls = _count_decodes(monkeypatch)
    first, rows = _fit(tmp_path, where, seed=0)
    assert len(rows) == 4 and len(calls) == 1 + len(rows - {0})
    assert len(list(where.glob("cache-*.arrow"))) == 1
    calls.clear()
    again, same_rows = _fit(tmp_path, where, seed=0)
    assert same_rows == rows and len(calls) == 1 and again == first  # read from the cache, the same pixels
    expected = 0.0  # the same SGD on the mean pixel of each batch, by hand from PIL's pixels (row i: 16 i)
    for batch in _batches(where, seed=0):
        pixels = np.stack([np.asarray(Image.open(io.BytesIO(_png(16 * r)["bytes"]))) for r in batch])
        expected -= 0.1 * 2 * (expected - pixels.astype(np.float64).mean() / 255)
    assert first == pytest.approx(expected, rel=1e-6)
    calls.clear()
    seed = next(s for s in range(1, 50) if _fit_rows(where, s) & rows == set())  # a cohort of another client
    _, other = _fit(tmp_path, where, seed=seed)
    assert len(calls) == 1 + len(other - {0}) and not other & rows
    assert len(list(where.glob("cache-*.arrow"))) == 1  # the same file, now holding both clients' rows
    calls.clear()
    _fit(tmp_path, where, seed=0)
    assert len(calls) == 1  # the first image only: the first client's rows are still in the file


def _batches(where, seed):
    from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner

    dm = FederatedDataModule(datasets.load_from_disk(str(where)), partitioner=NaturalIdPartitioner("user"),
                             clients_per_round=1, batch_size=2, seed=seed)
    dm.setup()
    return [batch.tolist() for c in dm.sample_clients(0) for batch in dm.client_batches(int(c), 0)]


def _fit_rows(where, seed):
    return {r for batch in _batches(where, seed) for r in batch}


def test_lazily_decoded_images_of_other_shapes_batch_as_a_data_loader_does():
    """A row decoded to another shape than the first: a batch of it alone is that image (as the torch format and
    ``default_collate`` give it); a batch mixing shapes fails with ``default_collate``'s own error; the others are
    PIL's pixels; reading the whole column names the odd row."""
    images = [_png(10), _png(20, size=(4, 5)), _png(30), _png(40)]
    ds = datasets.Dataset.from_dict({"image": images}, features=datasets.Features({"image": datasets.Image()}))
    ds = ds.with_format("torch")
    columns = HFTensorColumns.from_dataset(ds, lazy_images=True)
    assert torch.equal(columns.get_batch(torch.tensor([1]))["image"], default_collate([ds[1]["image"]]))
    assert torch.equal(columns.get_batch(torch.tensor([3, 0]))["image"],
                       default_collate([ds[3]["image"], ds[0]["image"]]))
    with pytest.raises(RuntimeError) as collated:
        default_collate([ds[0]["image"], ds[1]["image"]])
    with pytest.raises(RuntimeError) as raised:
        columns.get_batch(torch.tensor([0, 1]))
    assert str(raised.value) == str(collated.value)
    with pytest.raises(ValueError, match=r"Image column 'image': 1 row\(s\) decoded to another shape .* row 1: "
                                         r"torch.uint8 \[1, 5, 4\], the others torch.uint8 \[1, 4, 4\]"):
        columns.columns["image"]


def _client_loader(images, seed=0):
    """An in-memory dataset of ``images`` (row i: user i mod 4), its data module set up, a client without row 0
    (decoded at the conversion, for the shape): ``(the torch-formatted dataset, the client's round-0 batches, its
    loader)``."""
    from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner

    features = datasets.Features({"image": datasets.Image(), "user": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": images, "user": [i % 4 for i in range(len(images))]}, features=features)
    dm = FederatedDataModule(ds, partitioner=NaturalIdPartitioner("user"), clients_per_round=1, batch_size=2,
                             seed=seed)
    dm.setup()
    cid = next(c for c in range(4) if 0 not in {int(r) for b in dm.client_batches(c, 0) for r in b})
    return ds.with_format("torch"), [b.tolist() for b in dm.client_batches(cid, 0)], dm.client_dataloader(cid, 0)


def _collated(ds, batch):
    return default_collate([ds[r]["image"] for r in batch])


def test_a_client_s_images_are_decoded_together_when_its_loader_starts(monkeypatch):
    """The rows of all a client's batches are decoded when its loader yields the first (one Arrow take and one loop
    over decode_example, not one per batch between training steps; before, only the first batch's 2 of the 4 rows),
    each once; the batches are the torch format's rows collated as a DataLoader does."""
    ds, batches, loader = _client_loader([_png(16 * i) for i in range(ROWS)])
    rows = {r for batch in batches for r in batch}
    assert len(batches) == 2 and len(rows) == 4
    calls = _count_decodes(monkeypatch)
    taken = iter(loader)
    first = next(taken)
    assert len(calls) == len(rows)
    taken = [first, *taken]
    assert len(calls) == len(rows)
    for batch, got in zip(batches, taken, strict=True):
        assert torch.equal(got["image"], _collated(ds, batch))


def test_an_image_that_cannot_be_decoded_fails_the_batch_holding_it_not_the_client_s_first_batch():
    """Decoding a client's rows ahead does not move the error of a truncated PNG: the first batch is trained, the
    batch holding it raises the torch format's error noting the column and row, in every loader that reaches it."""
    images = [_png(16 * i) for i in range(ROWS)]
    _, batches, _ = _client_loader(images)
    bad = batches[1][0]
    images[bad] = {"bytes": images[bad]["bytes"][:-20], "path": None}  # IHDR whole, image data cut
    ds, batches, loader = _client_loader(images)
    with pytest.raises(Exception) as formatter:
        ds[bad]
    for _ in range(2):
        taken = iter(loader)
        assert torch.equal(next(taken)["image"], _collated(ds, batches[0]))
        with pytest.raises(type(formatter.value)) as raised:
            next(taken)
        assert str(raised.value) == str(formatter.value)
        assert f"Image column 'image', row {bad}." in raised.value.__notes__
