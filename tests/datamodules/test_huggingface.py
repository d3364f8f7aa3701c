"""Hugging Face datasets as tensors (#40.4): every fixed-shape column kind converted from its Arrow buffers gives the
torch formatter's tensors, dtypes and values (the formatter is the independent reference), without the formatter's
per-element recursion; what the formatter does not give as one tensor keeps the DataLoader."""

from __future__ import annotations

import re

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch
from datasets.formatting.torch_formatter import TorchFormatter
from PIL import Image

from lightning_fed.datamodules.huggingface import HFTensorColumns, fixed_shape_values, ragged_column

N = 48


def _images(mode, rng):
    """N images of PIL mode ``mode`` (``Image.fromarray`` infers it from the array's dtype and channels)."""
    shape = {"L": (5, 7), "RGB": (5, 7, 3), "RGBA": (5, 7, 4), "I": (5, 7), "F": (5, 7)}[mode]
    if mode == "I":
        arrays = rng.integers(-9, 70000, (N, *shape), dtype=np.int32)
    elif mode == "F":
        arrays = rng.normal(size=(N, *shape)).astype(np.float32)
    else:
        arrays = rng.integers(0, 256, (N, *shape), dtype=np.uint8)
    images = [Image.fromarray(a) for a in arrays]
    assert images[0].mode == mode
    return images


def _kind(kind):
    """A dataset of N rows holding one column kind (and a label column)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, N)
    if kind == "nested float32 (from_dict of a 4-d array)":
        return datasets.Dataset.from_dict({"x": rng.random((N, 1, 4, 3), dtype=np.float32), "label": labels})
    if kind == "nested float64 -> float32":
        return datasets.Dataset.from_dict({"x": rng.normal(size=(N, 3, 2)) * 1e3, "label": labels})
    if kind == "nested uint8 -> int64":
        return datasets.Dataset.from_dict({"x": rng.integers(0, 256, (N, 6, 6), dtype=np.uint8), "label": labels})
    if kind == "nested bool":
        return datasets.Dataset.from_dict({"x": rng.random((N, 2, 2)) > 0.5, "label": labels})
    if kind == "large_list and fixed_size_list":
        values = rng.normal(size=(N, 3, 4)).astype(np.float32)
        inner = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), 4)
        outer = pa.LargeListArray.from_arrays(pa.array(np.arange(0, 3 * N + 1, 3), pa.int64()), inner)
        return datasets.Dataset(datasets.table.InMemoryTable(pa.table({"x": outer, "label": labels})))
    if kind == "Array2D float64":
        features = datasets.Features({"x": datasets.Array2D((4, 5), "float64"), "label": datasets.Value("int64")})
        return datasets.Dataset.from_dict({"x": rng.normal(size=(N, 4, 5)), "label": labels}, features=features)
    if kind == "Array3D uint8":
        features = datasets.Features({"x": datasets.Array3D((2, 3, 4), "uint8"), "label": datasets.Value("int64")})
        return datasets.Dataset.from_dict({"x": rng.integers(0, 256, (N, 2, 3, 4), dtype=np.uint8),
                                           "label": labels}, features=features)
    if kind.startswith("Image "):
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
        return datasets.Dataset.from_dict({"image": _images(kind.split()[1], rng), "label": labels},
                                          features=features)
    if kind == "scalar labels":
        return datasets.Dataset.from_dict({
            "label": labels, "small": labels.astype(np.uint8), "weight": rng.normal(size=N),
            "flag": rng.random(N) > 0.5, "half": rng.normal(size=N).astype(np.float16),
        }, features=datasets.Features({"label": datasets.ClassLabel(num_classes=10), "small": datasets.Value("uint8"),
                                       "weight": datasets.Value("float64"), "flag": datasets.Value("bool"),
                                       "half": datasets.Value("float16")}))
    raise AssertionError(kind)


KINDS = ["nested float32 (from_dict of a 4-d array)", "nested float64 -> float32", "nested uint8 -> int64",
         "nested bool", "large_list and fixed_size_list", "Array2D float64", "Array3D uint8", "Image L", "Image RGB",
         "Image RGBA", "Image I", "Image F", "scalar labels"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_column_kind_equals_the_torch_formatter_without_its_recursion(kind, monkeypatch):
    ds = _kind(kind).with_format("torch")
    selection = ds.shuffle(seed=3).select(range(5, 40))  # an indices mapping: only its rows, in its order
    references = [ds[:], selection[:]]  # the reference: the torch formatter itself
    assert all(isinstance(v, torch.Tensor) for ref in references for v in ref.values())

    def refuse(self, data_struct):
        raise AssertionError("the torch formatter's per-element recursion was used")

    monkeypatch.setattr(TorchFormatter, "recursive_tensorize", refuse)
    for dataset, reference in zip([ds, selection], references):
        columns = HFTensorColumns.from_dataset(dataset)
        assert columns is not None and list(columns.columns) == list(reference)
        index = torch.tensor([3, 0, 3])  # a batch first (plain PNGs: decoded when a batch first holds them)
        batch = columns.get_batch(index)
        assert all(torch.equal(batch[name], reference[name][index]) for name in reference)
        for name, expected in reference.items():
            got = columns.columns[name]
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            assert torch.equal(got, expected), name
            assert got.is_contiguous()
    if kind == "Image L":  # what the torch format gives for a grey PNG: [N, 1, H, W] uint8, as for RGB [N, 3, H, W]
        assert references[0]["image"].dtype == torch.uint8 and references[0]["image"].shape == (N, 1, 5, 7)


def _encoded(image, fmt="PNG", **save):
    import io

    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return {"bytes": buffer.getvalue(), "path": None}


def _text_chunk():
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text("Comment", "a tEXt chunk")
    return info


def test_images_that_pils_png_decoder_alone_would_give_differently_are_decoded_by_decode_example():
    """Plain 8-bit PNGs (and interlaced, truncated ones), a PNG with an EXIF orientation (PIL transposes it), a
    palette, a transparency chunk, 16-bit samples, a JPEG, and a feature with a mode all give the torch format's
    values."""
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)
    rotated = Image.Image.getexif(Image.new("L", (1, 1)))
    rotated[0x0112] = 6  # orientation: rotate 90°
    png = {
        "plain": [_encoded(Image.fromarray(pixels)) for _ in range(3)],
        "interlaced": [_encoded(Image.fromarray(pixels), interlace=1)] * 2,
        "exif orientation": [_encoded(Image.fromarray(pixels), exif=rotated.tobytes())] * 2,
        "palette": [_encoded(Image.fromarray(pixels).convert("P"))] * 2,
        "transparency": [_encoded(Image.fromarray(pixels[..., 0]), transparency=7)] * 2,
        "text chunk": [_encoded(Image.fromarray(pixels), pnginfo=_text_chunk())] * 2,
        "truncated": [_encoded(Image.fromarray(pixels))] * 2,
        "16 bit": [_encoded(Image.fromarray(pixels[..., 0].astype(np.uint16) * 200))] * 2,
        "jpeg": [_encoded(Image.fromarray(pixels), "JPEG")] * 2,
    }
    png["truncated"] = [{"bytes": png["truncated"][0]["bytes"][:-12], "path": None}] * 2  # no IEND: PIL reads it
    for case, images in png.items():
        for feature in (datasets.Image(), datasets.Image(mode="L")):
            ds = datasets.Dataset.from_dict({"image": images}, features=datasets.Features({"image": feature}))
            ds = ds.with_format("torch")
            expected = ds[:]["image"]
            got = HFTensorColumns.from_dataset(ds).columns["image"]
            assert got.dtype == expected.dtype and torch.equal(got, expected), (case, feature.mode)
    assert tuple(HFTensorColumns.from_dataset(datasets.Dataset.from_dict(
        {"image": png["exif orientation"]}, features=datasets.Features({"image": datasets.Image()})
    ).with_format("torch")).columns["image"].shape) == (2, 3, 6, 4)  # transposed, as PIL gives it


def _pil_pixels(images):
    """The images (PNG dicts) as PIL decodes them, ``[n, C, H, W]``: the reference."""
    import io

    arrays = [np.asarray(Image.open(io.BytesIO(image["bytes"]))) for image in images]
    return torch.from_numpy(np.stack([a[:, :, None] if a.ndim == 2 else a for a in arrays]).transpose(0, 3, 1, 2))


def _count_decodes(monkeypatch):
    calls = []
    decode = datasets.Image.decode_example
    monkeypatch.setattr(datasets.Image, "decode_example", lambda self, *a, **k: calls.append(1) or decode(self, *a, **k))
    return calls


def test_images_are_decoded_by_datasets_once_into_its_cache_next_to_the_dataset_files(tmp_path, monkeypatch):
    """#52 3a: every image is decoded by the feature's decode_example (no PNG decoding of ours) into a column that
    ``Dataset.map`` writes next to the dataset's files; a later run (the dataset loaded again) reads it instead of
    decoding (decode_example: the first image only, for the shape); a corrupt row fails the batches holding it in
    both runs; a changed dataset saved over it (another fingerprint) gets a column of its own, not the old one."""
    ds = _kind("Image RGB")
    images = ds.with_format("arrow")[:].column("image").to_pylist()
    images[3] = {"bytes": _damaged(images[3]["bytes"], "crc"), "path": None}
    where = tmp_path / "saved"
    datasets.Dataset.from_dict({"image": images, "label": ds["label"]}, features=ds.features).save_to_disk(str(where))
    good = [i for i in range(N) if i != 3]
    expected = _pil_pixels([images[i] for i in good])
    calls = _count_decodes(monkeypatch)
    for run, decodes in (("first", N + 1), ("later", 1)):
        calls.clear()
        columns = HFTensorColumns.from_dataset(datasets.load_from_disk(str(where)).with_format("torch"))
        assert torch.equal(columns.get_batch(torch.tensor(good))["image"], expected), run
        assert len(calls) == decodes, run
        assert len(list(where.glob("cache-*.arrow"))) == 1, run
        with pytest.raises(OSError) as raised:
            columns.get_batch(torch.tensor([0, 3]))
        assert "Image column 'image', row 3." in raised.value.__notes__, run
    changed = list(images)
    changed[5] = _encoded(Image.fromarray(255 - _pil_pixels([images[5]])[0].permute(1, 2, 0).numpy()))
    del columns
    datasets.Dataset.from_dict({"image": changed, "label": ds["label"]}, features=ds.features).save_to_disk(str(where))
    columns = HFTensorColumns.from_dataset(datasets.load_from_disk(str(where)).with_format("torch"))
    assert torch.equal(columns.get_batch(torch.tensor([5, 6]))["image"], _pil_pixels([changed[5], changed[6]]))
    assert len(list(where.glob("cache-*.arrow"))) == 2


def test_a_dataset_in_a_read_only_folder_has_its_images_decoded_in_memory_with_a_warning(tmp_path, monkeypatch):
    """A dataset saved where the decoded column cannot be written (a read-only mount, e.g. a shared data folder):
    ``map`` cannot write its cache file, so the images are decoded in memory, the same pixels as PIL's, with a
    warning naming the folder; nothing is written there."""
    import subprocess

    from helpers import tmpfs

    ds = _kind("Image RGB")
    expected = _pil_pixels(ds.with_format("arrow")[:].column("image").to_pylist())
    with tmpfs(tmp_path / "shared", "size=4m") as shared:
        ds.save_to_disk(str(shared / "ds"))
        remounted = subprocess.run(["mount", "-o", "remount,ro", str(shared)], capture_output=True, text=True)
        if remounted.returncode != 0:
            pytest.skip(f"needs `mount -o remount,ro`: {remounted.stderr.strip()}")
        with pytest.warns(UserWarning, match=re.escape(f"could not write the decoded column next to the dataset's "
                                                       f"files in {shared / 'ds'}")):
            columns = HFTensorColumns.from_dataset(datasets.load_from_disk(str(shared / "ds")).with_format("torch"))
        assert torch.equal(columns.columns["image"], expected)
        assert not list((shared / "ds").glob("cache-*.arrow"))
        del columns


def test_an_in_memory_dataset_s_images_are_decoded_in_memory_by_datasets_at_each_conversion(tmp_path, monkeypatch):
    """A dataset without files (``Dataset.from_dict``): every image by decode_example, each time; nothing written
    to datasets' cache directory."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    ds = _kind("Image L")
    expected = _pil_pixels(ds.with_format("arrow")[:].column("image").to_pylist())
    calls = _count_decodes(monkeypatch)
    for _ in range(2):
        calls.clear()
        assert torch.equal(HFTensorColumns.from_dataset(ds.with_format("torch")).columns["image"], expected)
        assert len(calls) == N + 1
    assert not (tmp_path / "hf-cache").exists() or not any((tmp_path / "hf-cache").rglob("*.arrow"))


def test_images_of_different_dtypes_are_not_held_and_leave_no_cache_file(tmp_path):
    grey, wide = _images("L", np.random.default_rng(0))[:3], _images("I", np.random.default_rng(0))[:1]
    where = tmp_path / "mixed"
    datasets.Dataset.from_dict({"image": grey + wide}, features=datasets.Features({"image": datasets.Image()})
                               ).save_to_disk(str(where))
    ds = datasets.load_from_disk(str(where)).with_format("torch")
    assert isinstance(ds[:]["image"], list) and HFTensorColumns.from_dataset(ds) is None
    assert not list(where.glob("cache-*")) and not list(where.glob("tmp*"))


def _chunk(kind, data):
    """A PNG chunk: length, type, data, CRC."""
    import zlib

    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def _damaged(png, damage):
    """``png`` (one IDAT chunk, after IHDR) damaged: a byte of the IDAT data changed under the old CRC, or with a
    right CRC: image data that is no zlib stream, a row's filter byte out of range, a gAMA chunk too short."""
    import zlib

    at = png.index(b"IDAT") - 4
    length = int.from_bytes(png[at : at + 4], "big")
    idat, rest = png[at + 8 : at + 8 + length], png[at + 12 + length :]
    if damage == "crc":
        return png[: at + 8] + bytes([idat[0] ^ 1]) + png[at + 9 :]
    if damage == "zlib stream":
        return png[:at] + _chunk(b"IDAT", b"\x11" + idat[1:]) + rest
    if damage == "filter byte":
        return png[:at] + _chunk(b"IDAT", zlib.compress(b"\x07" + zlib.decompress(idat)[1:])) + rest
    assert damage == "gAMA too short"
    return png[:33] + _chunk(b"gAMA", b"\0\0") + png[33:]


@pytest.mark.parametrize("damage", ["crc", "zlib stream", "filter byte", "gAMA too short"])
def test_plain_pngs_are_decoded_when_a_batch_first_holds_them_and_a_corrupt_one_fails_as_in_the_formatter(damage):
    """An Image column is decoded once; reading the column's names decodes nothing more. A corrupt PNG fails the
    batch holding it with the torch format's error, noting the column and row, and neither the set-up nor batches
    without it (on
    c5be2f2, libpng through torchvision ended the process with a segmentation fault); a PNG whose image data is
    whole but whose chunks ``Image.open`` refuses (a gAMA chunk too short) is refused as the torch format does."""
    ds = _kind("Image L")
    images = ds.with_format("arrow")[:].column("image").to_pylist()
    png = images[7]["bytes"]
    images[7] = {"bytes": _damaged(png, damage), "path": None}
    ds = datasets.Dataset.from_dict({"image": images, "label": ds["label"]}, features=ds.features)
    ds = ds.with_format("torch")
    reference = ds.select([i for i in range(N) if i != 7])[:]["image"]
    with pytest.raises(Exception) as formatter:
        ds[7]
    columns = HFTensorColumns.from_dataset(ds)
    assert list(columns.columns) == ["image", "label"] and columns.nbytes == N * 35 + N * 8
    assert torch.equal(columns.get_batch(torch.tensor([8, 0, 6]))["image"], reference[[7, 0, 6]])
    with pytest.raises(type(formatter.value)) as raised:
        columns.get_batch(torch.tensor([3, 7]))
    assert str(raised.value) == str(formatter.value) and "Image column 'image', row 7." in raised.value.__notes__
    assert torch.equal(columns.get_batch(torch.tensor([3]))["image"], reference[[3]])
    with pytest.raises(type(formatter.value)):
        columns.columns["image"]


def test_a_selection_of_formatted_columns_converts_only_those():
    ds = _kind("Array3D uint8").with_format("torch", columns=["x"])
    columns = HFTensorColumns.from_dataset(ds)
    assert list(columns.columns) == ["x"] and torch.equal(columns.columns["x"], ds[:]["x"])


@pytest.mark.parametrize("column", [
    [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0]]] * 4,  # ragged at the inner level only
    [[1.0, 2.0], [3.0]] * 4,                             # ragged rows
    [f"text {i}" for i in range(8)],                     # text
])
def test_columns_the_formatter_gives_as_lists_or_text_are_not_held(column):
    assert HFTensorColumns.from_dataset(datasets.Dataset.from_dict({"x": column}).with_format("torch")) is None


def test_images_of_different_sizes_are_not_held_and_undecoded_images_neither():
    images = [Image.new("L", (4, 4)), Image.new("L", (4, 5))]
    features = datasets.Features({"image": datasets.Image()})
    ds = datasets.Dataset.from_dict({"image": images}, features=features).with_format("torch")
    assert isinstance(ds[:]["image"], list) and HFTensorColumns.from_dataset(ds) is None
    raw = datasets.Dataset.from_dict({"image": images[:1]}, features=features).cast_column(
        "image", datasets.Image(decode=False)).with_format("torch")
    assert HFTensorColumns.from_dataset(raw) is None


def test_nulls_and_format_arguments_go_through_the_formatter_as_before():
    with_nulls = datasets.Dataset.from_dict({"x": [1.5, None, 2.5], "y": [[1, 2], [3, 4], [5, 6]]}).with_format("torch")
    columns = HFTensorColumns.from_dataset(with_nulls)
    expected = with_nulls[:]
    assert torch.equal(columns.columns["y"], expected["y"])
    assert torch.allclose(columns.columns["x"], expected["x"], equal_nan=True) and columns.columns["x"].isnan()[1]
    half = datasets.Dataset.from_dict({"x": [[1.0, 2.0], [3.0, 4.0]]}).with_format("torch", dtype=torch.float16)
    assert HFTensorColumns.from_dataset(half).columns["x"].dtype == torch.float16 == half[:]["x"].dtype


def test_the_size_limit_is_checked_before_converting():
    ds = _kind("nested float32 (from_dict of a 4-d array)").with_format("torch")
    nbytes = N * 12 * 4 + N * 8
    assert HFTensorColumns.from_dataset(ds, limit=nbytes).nbytes == nbytes
    assert HFTensorColumns.from_dataset(ds, limit=nbytes - 1) is None


def test_fixed_shape_values_follow_slices_and_refuse_nulls():
    array = pa.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]).slice(1, 2)
    values, shape = fixed_shape_values(array)
    assert shape == (2, 2) and values.to_numpy().tolist() == list(range(4, 12))
    assert fixed_shape_values(pa.array([[1, 2], None])) is None
    assert fixed_shape_values(pa.array([[1, None], [3, 4]])) is None
    assert fixed_shape_values(pa.array([[], []])) is None


def test_the_old_import_path_still_works():
    from lightning_fed.datamodules import federated, huggingface

    assert federated.HFTensorColumns is huggingface.HFTensorColumns
    assert federated.ragged_column is ragged_column


def test_read_column_gives_the_numpy_format_values_and_dtypes_from_arrow(monkeypatch):
    """Labels and natural ids are read from the Arrow buffer (the numpy format read them row by row: 1.4 s of the
    set-up for 6,000 rows), with the dtypes and values the numpy format gives, also for a selection."""
    from datasets.formatting.np_formatter import NumpyFormatter

    from lightning_fed.datamodules.huggingface import read_column

    rng = np.random.default_rng(1)
    ds = datasets.Dataset.from_dict({
        "label": rng.integers(0, 10, N), "small": rng.integers(0, 9, N).astype(np.uint8), "w": rng.normal(size=N),
        "flag": rng.random(N) > 0.5, "user": [f"u{i % 7}" for i in range(N)], "gap": [None] + list(range(N - 1)),
    }, features=datasets.Features({"label": datasets.ClassLabel(num_classes=10), "small": datasets.Value("uint8"),
                                   "w": datasets.Value("float64"), "flag": datasets.Value("bool"),
                                   "user": datasets.Value("string"), "gap": datasets.Value("int64")}))
    for dataset in (ds, ds.shuffle(seed=2).select(range(3, 30))):
        expected = {name: np.asarray(dataset.with_format("numpy")[name]) for name in dataset.column_names}
        fast = ["label", "small", "w", "flag"]
        with monkeypatch.context() as patch:
            patch.setattr(NumpyFormatter, "format_row", lambda *a: pytest.fail("read row by row"))
            got = {name: read_column(dataset, name) for name in fast}
        got.update({name: read_column(dataset, name) for name in ("user", "gap")})  # text, nulls: as before
        for name, value in expected.items():
            assert got[name].dtype == value.dtype and np.array_equal(got[name], value, equal_nan=name == "gap"), name
    with pytest.raises(KeyError):
        read_column(ds, "writer")


@pytest.mark.parametrize("kind", ["nested float32 (from_dict of a 4-d array)", "Array3D uint8", "Image L"])
def test_a_data_module_sets_up_and_batches_without_formatting_a_row(kind, monkeypatch):
    """The whole path of a Hugging Face train_dataset, labels for a label-skew partition included, reads Arrow
    buffers: neither the numpy format row by row (labels) nor the torch formatter's recursion (client batches)."""
    from datasets.formatting.np_formatter import NumpyFormatter

    from lightning_fed.datamodules import FederatedDataModule, ShardPartitioner

    ds = _kind(kind)
    reference = ds.with_format("torch")[:]
    monkeypatch.setattr(NumpyFormatter, "format_row", lambda *a: pytest.fail("labels read row by row"))
    monkeypatch.setattr(TorchFormatter, "recursive_tensorize", lambda *a: pytest.fail("the formatter's recursion"))
    dm = FederatedDataModule(ds, partitioner=ShardPartitioner(num_clients=4, shards_per_client=2), batch_size=5,
                             clients_per_round=2)
    dm.setup()
    dm.check_local_work()
    assert sorted(np.concatenate([dm.client_indices(c) for c in range(4)]).tolist()) == list(range(N))
    for batch, index in zip(dm.client_dataloader(1, 0), dm.client_batches(1, 0)):
        assert all(torch.equal(batch[name], reference[name][torch.from_numpy(index)]) for name in reference)


def test_ragged_column_names_the_rows_also_when_an_inner_level_is_ragged():
    rows = [[[1, 2], [3, 4]]] * 6
    rows[4] = [[1, 2], [3]]
    ds = datasets.Dataset.from_dict({"ok": [[[0, 0], [0, 0]]] * 6, "x": rows, "t": ["a"] * 6})
    assert ragged_column(ds) == ("x", 1, 4, 2, 0)
    assert ragged_column(ds.select([4, 5])) == ("x", 1, 0, 2, 0)
    assert ragged_column(ds.select([0, 5])) is None


# ---------------------------------------------------------------- dict batches: batch_columns and the hint
class _TupleRegression:
    """A module written for (x, y) tuples (``x, y = batch``) and the same one reading dict batches by name."""

    @staticmethod
    def make(tuples: bool):
        import lightning as L

        class Regression(L.LightningModule):
            def __init__(self):
                super().__init__()
                torch.manual_seed(0)
                self.linear = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                x, y = batch if tuples else (batch["x"], batch["y"])
                return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)

            def validation_step(self, batch, batch_idx):
                self.log("val_loss", self.training_step(batch, batch_idx))

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Regression()


def _regression_hf(n=40):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return datasets.Dataset.from_dict({"x": x, "y": x @ np.float32([1, -2, 0.5]), "user": np.arange(n) % 4})


def _fit(tmp_path, module, trainer_kwargs=None, dataset=None, **data):
    from helpers import quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    dataset = _regression_hf() if dataset is None else dataset
    dm = FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
                             batch_size=5, **data)
    trainer = FederatedTrainer(max_epochs=2, **quiet_trainer_kwargs(tmp_path), **(trainer_kwargs or {}))
    trainer.fit(module, datamodule=dm)
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_batch_columns_gives_tuples_of_those_columns_in_every_loader(monkeypatch):
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner, huggingface

    hf = _regression_hf()
    dm = FederatedDataModule(hf, val_dataset=_regression_hf(12), partitioner=IIDPartitioner(num_clients=4, seed=0),
                             clients_per_round=2, batch_size=5, batch_columns=["y", "x"], eval_batch_size=5)
    plain = FederatedDataModule(hf, val_dataset=_regression_hf(12), partitioner=IIDPartitioner(num_clients=4, seed=0),
                                clients_per_round=2, batch_size=5, eval_batch_size=5)
    dm.setup(), plain.setup()
    loaders = [lambda m: m.client_dataloader(1, 0), lambda m: m.train_dataloader(), lambda m: m.val_dataloader()]
    for loader in loaders:
        for tup, dic in zip(loader(dm), loader(plain), strict=True):
            assert isinstance(tup, tuple) and len(tup) == 2
            assert torch.equal(tup[0], dic["y"]) and torch.equal(tup[1], dic["x"])
    monkeypatch.setattr(huggingface, "HF_TENSOR_LIMIT_BYTES", 0)  # the DataLoader path: the same tuples
    dm.data_source._hf_columns = None  # the columns are read again, now through a DataLoader
    for tup, dic in zip(dm.client_dataloader(1, 0), plain.client_dataloader(1, 0), strict=True):
        assert torch.equal(tup[0], dic["y"]) and torch.equal(tup[1], dic["x"])


def test_a_module_written_for_tuples_trains_with_batch_columns_as_the_dict_one_does(tmp_path):
    by_name = _fit(tmp_path, _TupleRegression.make(tuples=False))
    as_tuples = _fit(tmp_path, _TupleRegression.make(tuples=True), batch_columns=("x", "y"))
    assert torch.equal(by_name, as_tuples)


def test_batch_columns_reach_federated_and_personalized_evaluation(tmp_path):
    """Federated evaluation on held-out client data and its personalized steps read the same tuples: a tuple
    module evaluates as the dict one does."""
    from helpers import quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    metrics = []
    for tuples in (False, True):
        dm = FederatedDataModule(_regression_hf(), partitioner=IIDPartitioner(num_clients=4, seed=0),
                                 clients_per_round=2, batch_size=5, eval_clients_per_round=2, eval_fraction=0.25,
                                 eval_local_steps=1, batch_columns=("x", "y") if tuples else None)
        trainer = FederatedTrainer(max_epochs=1, **quiet_trainer_kwargs(tmp_path))
        trainer.fit(_TupleRegression.make(tuples), datamodule=dm)
        metrics.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("fed_")})
    assert "fed_val_loss/weighted" in metrics[0] and "fed_personalized_val_loss/mean" in metrics[0]
    assert metrics[0] == metrics[1]


def test_a_module_reading_dict_batches_as_tuples_gets_a_hint_naming_the_columns(tmp_path):
    """``x, y = batch`` on a dict batch unpacks the column names: the error says so and how to fix it, under the
    default policy (the run stops: every client failed alike) and under on_client_failure="raise" (the original
    error, with the hint as a note)."""
    hint = (r"batches of the Hugging Face train_dataset are dicts of columns \['x', 'y'\], not tuples: "
            r"index them by name in training_step \(batch\['x'\]\), or pass batch_columns=\('x', 'y'\)")
    two_columns = _regression_hf().remove_columns("user")
    with pytest.raises(RuntimeError, match=r"linear\(\): argument 'input' .* must be Tensor, not str \(hint: " + hint):
        _fit(tmp_path, _TupleRegression.make(tuples=True), dataset=two_columns)
    with pytest.raises(TypeError, match="must be Tensor, not str") as raised:
        _fit(tmp_path, _TupleRegression.make(tuples=True), trainer_kwargs={"on_client_failure": "raise"},
             dataset=two_columns)
    assert re.match("Hint: " + hint, raised.value.__notes__[-1])


def test_the_vectorized_executor_gives_the_dict_batch_hint_too(tmp_path):
    """The same hint when the cohort trains under VectorizedExecutor: the default policy (its sequential retry
    isolates the clients) and on_client_failure="raise" (the original error raised from the vmapped round, with the
    hint as a note)."""
    from lightning_fed import VectorizedExecutor

    hint = r"batches of the Hugging Face train_dataset are dicts of columns \['x', 'y'\], not tuples"
    two_columns = _regression_hf().remove_columns("user")
    with pytest.raises(RuntimeError, match=r"\(hint: " + hint):
        _fit(tmp_path, _TupleRegression.make(tuples=True), trainer_kwargs={"client_executor": VectorizedExecutor()},
             dataset=two_columns)
    with pytest.raises(TypeError, match="must be Tensor, not str") as raised:
        _fit(tmp_path, _TupleRegression.make(tuples=True), dataset=two_columns,
             trainer_kwargs={"client_executor": VectorizedExecutor(), "on_client_failure": "raise"})
    assert re.match("Hint: " + hint, raised.value.__notes__[-1])


class _TupleEvaluation:
    """Trains on dict batches by name; its validation_step and test_step read the batch as an (x, y) tuple (or fail
    otherwise, ``other_error``), the way a user's first run without ``batch_columns`` fails."""

    @staticmethod
    def make(other_error: bool = False):
        import lightning as L

        class Regression(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                return torch.nn.functional.mse_loss(self.linear(batch["x"]).squeeze(-1), batch["y"])

            def validation_step(self, batch, batch_idx):
                if other_error:
                    raise ValueError("nan loss")
                x, y = batch
                self.log("val_loss", torch.nn.functional.mse_loss(self.linear(x.float() if x.dtype else x).squeeze(-1), y))

            def test_step(self, batch, batch_idx):
                x, y = batch
                return x.dtype

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Regression()


def test_a_validation_or_test_step_reading_dict_batches_as_tuples_gets_the_hint_too(tmp_path):
    """The first failure of an HF user without batch_columns is the sanity-check validation (before any client
    trains): `AttributeError: 'str' object has no attribute 'dtype'` gets the hint as a note, naming the dataset
    the step read and the step; so do validation on the clients' held-out data, `trainer.validate` and
    `trainer.test`. Another error of the step gets none."""
    from helpers import quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    def run(method, other_error=False, sanity=2, **data):
        dm = FederatedDataModule(_regression_hf().remove_columns("user"), batch_size=5, clients_per_round=2,
                                 partitioner=IIDPartitioner(num_clients=4, seed=0), **data)
        kwargs = {**quiet_trainer_kwargs(tmp_path), "num_sanity_val_steps": sanity}
        trainer = FederatedTrainer(max_epochs=1, **kwargs)
        with pytest.raises(Exception) as raised:
            getattr(trainer, method)(_TupleEvaluation.make(other_error), datamodule=dm)
        return raised.value

    def hint(dataset, step):
        return (f"Hint: batches of the Hugging Face {dataset} are dicts of columns ['x', 'y'], not tuples: index "
                f"them by name in {step} (batch['x']), or pass batch_columns=('x', 'y') to the data module for "
                "tuples of those columns in that order.")

    error = run("fit", val_dataset=_regression_hf(10).remove_columns("user"))  # the sanity check
    assert isinstance(error, AttributeError) and str(error) == "'str' object has no attribute 'dtype'"
    assert error.__notes__ == [hint("val_dataset", "validation_step")]
    error = run("fit", sanity=0, eval_fraction=0.25)  # validation after round 0, on the clients' held-out data
    assert isinstance(error, AttributeError) and error.__notes__ == [hint("train_dataset", "validation_step")]
    error = run("validate", val_dataset=_regression_hf(10).remove_columns("user"))
    assert isinstance(error, AttributeError) and error.__notes__ == [hint("val_dataset", "validation_step")]
    error = run("test", test_dataset=_regression_hf(10).remove_columns("user"))
    assert isinstance(error, AttributeError) and error.__notes__ == [hint("test_dataset", "test_step")]
    error = run("fit", other_error=True, val_dataset=_regression_hf(10).remove_columns("user"))
    assert isinstance(error, ValueError) and not getattr(error, "__notes__", None)


def test_the_hint_is_given_for_the_tuple_reading_patterns_only():
    from lightning_fed.datamodules.huggingface import dict_batch_hint

    columns = ["image", "label"]
    for error in (TypeError("conv2d() received an invalid combination of arguments - got (str, ...) not str"),
                  AttributeError("'str' object has no attribute 'float'"), KeyError(0),
                  ValueError("too many values to unpack (expected 2)")):
        assert "batch_columns=('image', 'label')" in dict_batch_hint(error, columns), error
    for error in (TypeError("unsupported operand"), KeyError("image"), ValueError("nan loss"), RuntimeError("x")):
        assert dict_batch_hint(error, columns) is None, error


@pytest.mark.parametrize("value", ["image", [], ["x", "x"], [1, 2], {"x": 0}])
def test_bad_batch_columns_are_refused_naming_the_argument(value):
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    with pytest.raises(ValueError, match=r"`batch_columns` must be None \(dict batches\) or a non-empty sequence"):
        FederatedDataModule(_regression_hf(), partitioner=IIDPartitioner(num_clients=4), batch_columns=value)


def test_batch_columns_need_hugging_face_columns_at_setup():
    from torch.utils.data import TensorDataset

    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    dm = FederatedDataModule(_regression_hf(), partitioner=IIDPartitioner(num_clients=4), clients_per_round=2,
                             batch_columns=("x", "label"))
    with pytest.raises(ValueError, match=r"`batch_columns` names \['label'\], not columns of `train_dataset`'s "
                                         r"batches; its columns: \['x', 'y', 'user'\]"):
        dm.setup()
    tensors = TensorDataset(torch.zeros(8, 3), torch.zeros(8))
    dm = FederatedDataModule(tensors, partitioner=IIDPartitioner(num_clients=4), clients_per_round=2,
                             batch_columns=("x", "y"))
    with pytest.raises(ValueError, match="`batch_columns` .* but `train_dataset` is a TensorDataset"):
        dm.setup()


# ------------------------------------------------------------------ #49: image rows that fail in every round
class _ImageRegression(__import__("lightning").LightningModule):
    """y ≈ w·pool(image)/255 + b over a dict batch of an Image column (grey, pooled to 4×4) and a float label."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x = torch.nn.functional.adaptive_avg_pool2d(batch["image"].float(), (4, 4)).flatten(1) / 255
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), batch["y"].float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _image_rows(tmp_path, images):
    """An Image column of ``images`` (PNG dicts or None) with a label and a user column (row i: user i mod 4),
    written with ``save_to_disk`` and read back: the on-disk Arrow format."""
    rows = len(images)
    features = datasets.Features({"image": datasets.Image(), "y": datasets.Value("float32"),
                                  "user": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": images, "y": [float(i % 3) for i in range(rows)],
                                     "user": [i % 4 for i in range(rows)]}, features=features)
    where = tmp_path / f"images{len(list(tmp_path.glob('images*')))}"  # never over a mapped one
    ds.save_to_disk(str(where))
    return datasets.load_from_disk(str(where))


def _image_fit(tmp_path, dataset, rounds=1, batch_size=2, **trainer_kwargs):
    from helpers import quiet_trainer_kwargs
    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, NaturalIdPartitioner

    dm = FederatedDataModule(dataset, partitioner=NaturalIdPartitioner("user"), clients_per_round=4,
                             batch_size=batch_size)
    trainer = FederatedTrainer(max_epochs=rounds, **quiet_trainer_kwargs(tmp_path), **trainer_kwargs)
    trainer.fit(_ImageRegression(), datamodule=dm)
    return trainer


def _grey(w, h, value=0):
    return _encoded(Image.new("L", (w, h), color=value))


def test_49_none_images_are_refused_at_fit_start_naming_the_rows(tmp_path):
    """#49 part 4: before, client 1 (rows 1, 5, 9, ...) failed to collate its None image in every round and was
    dropped while the run went on."""
    images = [_grey(4, 4, i) for i in range(16)]
    images[5] = None
    with pytest.raises(ValueError, match=r"train_dataset's Image column 'image' holds 1 None image\(s\) \(row 5\), "
                                         r"which cannot be collated.*dataset.filter") as info:
        _image_fit(tmp_path, _image_rows(tmp_path, images), batch_size=1)  # even batches of one row
    assert "batch_size=1" not in str(info.value)


def test_49_images_of_different_shapes_are_refused_at_fit_start_unless_batches_hold_one_row(tmp_path):
    images = [_grey(4, 4, i) for i in range(16)]
    images[6] = _grey(4, 5)  # 5 rows high: [1, 5, 4]
    dataset = _image_rows(tmp_path, images)
    with pytest.raises(ValueError, match=r"Image column 'image' holds images of different shapes: \[1, 4, 4\] "
                                         r"\(C, H, W; row 0\) and \[1, 5, 4\] \(row 6\).*or use batch_size=1"):
        _image_fit(tmp_path, dataset)
    rgb = list(images)
    rgb[6] = _encoded(Image.new("RGB", (4, 4)))  # same size, 3 channels
    with pytest.raises(ValueError, match=r"\[1, 4, 4\] \(C, H, W; row 0\) and \[3, 4, 4\] \(row 6\)"):
        _image_fit(tmp_path, _image_rows(tmp_path, rgb))
    trainer = _image_fit(tmp_path, dataset, batch_size=1)  # a batch of one image: any shape collates
    assert trainer.callback_metrics["round_clients"] == 4 and trainer.global_step == 16


def test_49_a_corrupt_image_names_its_row_in_the_warning_and_stops_the_run_after_three_rounds(tmp_path):
    images = [_grey(4, 4, i) for i in range(16)]
    images[9] = {"bytes": _damaged(images[9]["bytes"], "crc"), "path": None}  # row 9: user 1
    dataset = _image_rows(tmp_path, images)
    with pytest.warns(UserWarning, match=r"Client 1 failed in round 0: .*\[Image column 'image', row 9\.\]; dropped"), \
            pytest.raises(RuntimeError, match=r"Round 2: client 1 failed in each of its last 3 sampled rounds \(rounds "
                                              r"0, 1, 2\), last with: .*\[Image column 'image', row 9\.\]"):
        _image_fit(tmp_path, dataset, rounds=5)
    with pytest.warns(UserWarning, match=r"End of fit after 2 round\(s\): 1 of the 4 sampled clients never trained "
                                         r".*client 1 \(sampled in 2 round\(s\); last: .*row 9"):
        trainer = _image_fit(tmp_path, dataset, rounds=2)  # two rounds: dropped twice, summarised at the end
    assert trainer.current_epoch == 2
