"""A short federated fit on a Hugging Face ``datasets.Dataset`` against the same fit on a ``TensorDataset`` holding the
same data, set-up included (issue #40.4; per-round speed: #32; images decoded by ``datasets``: #52 3a).

One kind of Hugging Face column per row of the report, each with a scalar label column (``label``, int64):

  nested  — ``Dataset.from_dict({"image": float32 array [n, 1, 28, 28], ...})``: Arrow nested lists, three levels
            (how a dataset made from NumPy arrays looks);
  array3d — the same images as an ``Array3D((1, 28, 28), "float32")`` feature;
  image   — the same images as uint8 pixels in an ``Image`` feature (PNG-encoded, as a dataset from the Hub or
            ``load_dataset("imagefolder")`` holds them; labels a ``ClassLabel``), in memory (``Dataset.from_dict``):
            each decoded by ``datasets`` when a client batch first holds it (a client's images together, when its
            loader starts), in memory, in every run;
  image-disk — the same ``Image`` dataset written once with ``save_to_disk`` (before the repeats, to a temporary
            folder) and read with ``load_from_disk``: variant ``hf`` is a first run (the decoded images that
            ``datasets`` caches next to the files removed before it), ``hf-cached`` a later run of the same fit
            (reading the images the run before it decoded and kept at its end).

Against ``tensor``: a ``TensorDataset(images, labels)`` of what the torch format gives for that kind (float32
``[n, 1, 28, 28]``, or uint8 for ``image``), same partition, cohorts, batches and model, so the weights are the same.
Each (kind, variant) runs in a fresh process with one torch thread, interleaved ``--repeats`` times (tensor, hf,
then hf, tensor, ... per kind: the order alternates). Reported, as medians over repeats: ``build`` (making the dataset from the NumPy arrays:
``Dataset.from_dict``, PNG encoding for ``image``; the user's data preparation, not part of the fit), ``set-up``
(``trainer.fit`` called → first round starts), ``round 0`` (holds the one-off conversion of the Hugging Face
columns to tensors, at the first client's batches; for ``image``, the decoding of round 0's clients' images: later
rounds decode those of clients not sampled before; the images decoded are kept at the end of ``fit``), ``round``
(median of the later rounds), ``fit`` (the whole
``trainer.fit``: set-up + all rounds) and ``fit ×`` (the median over repeats of the Hugging Face fit over the
TensorDataset fit of the same repeat, which ran next to it: the target is ≤ 1.5), ``cpu`` (the process CPU time of
``trainer.fit``, ``time.process_time``: less moved by other processes than wall time) and ``cpu ×`` (its paired ratio),
with the 1-minute load average (``os.getloadavg()``) before and after: the machine may be shared.

Workload: ``--samples`` (6,000) Fashion-MNIST-sized images (uniform random pixels, numpy seed 0), 10 classes,
``--clients`` (100) IID clients, ``--cohort`` (10) per round, 1 local epoch, batch ``--batch`` (20), ``--rounds``
(4) rounds, client SGD, the small MLP 784-256-10.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hf_datasets.py                        # all kinds, 3 repeats
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hf_datasets.py --kinds image --repeats 5
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hf_datasets.py --variants tensor hf hf-arrow   # + the per-batch
                                                                                  # DataLoader path (before #32)

``hf-arrow`` reads the Hugging Face dataset through a ``DataLoader`` (one Arrow read and formatting per batch;
forced with ``huggingface.HF_TENSOR_LIMIT_BYTES = 0``).

``--decoders`` instead measures the PNG decoders themselves (no fit), on ``--samples`` of the same images as the
``Image`` feature stores them (``encode_example``: PIL's PNG): the CPU time per image (``time.thread_time``, the
fastest of ``--repeats`` passes) of ``decode_example`` (the package's path, ``hf_images.image_array``: PIL through
``datasets``, as ``[C, H, W]``), ``pil-png`` (PIL alone: ``Image.open(..., formats=["PNG"])``, ``load``,
``tobytes``; what is left of PIL without ``datasets``' steps) and ``torchvision`` (``torchvision.io.decode_png``,
``ImageReadMode.UNCHANGED``); whether each gives ``decode_example``'s pixels for grey, RGB and RGBA images; and what
each does with two corrupt PNGs — ``bad-crc`` (an image-data chunk whose checksum is wrong, its data intact) and
``short`` (image data for half the rows, checksum right) — torchvision's run in a fresh process, as a crash ends it:
``decodes``, ``raises <error>`` or ``killed by signal <n>``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hf_datasets.py --decoders decode_example pil-png torchvision
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Optional, Sequence

KINDS = ("nested", "array3d", "image", "image-disk")
DECODERS = ("decode_example", "pil-png", "torchvision")
CORRUPTIONS = ("bad-crc", "short")
VARIANTS = ("tensor", "hf", "hf-cached", "hf-arrow")
FIELDS = ("build", "setup", "round0", "round", "fit", "cpu")


def make_data(kind: str, variant: str, samples: int, data_dir: Optional[str] = None):
    """The training dataset of ``variant`` for ``kind`` (see the module docstring; ``image-disk``: read from
    ``data_dir``, where :func:`save_images` wrote it)."""
    import numpy as np
    import torch
    from torch.utils.data import TensorDataset

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (samples, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, samples)
    images = (pixels / np.float32(255)).astype(np.float32)[:, None]  # [n, 1, 28, 28] float32
    if variant == "tensor":
        x = torch.from_numpy(pixels[:, None].copy()) if kind.startswith("image") else torch.from_numpy(images)
        return TensorDataset(x, torch.from_numpy(labels))
    import datasets

    if kind == "image-disk":
        return datasets.load_from_disk(data_dir)
    if kind == "nested":
        return datasets.Dataset.from_dict({"image": images, "label": labels})
    if kind == "array3d":
        features = datasets.Features({"image": datasets.Array3D((1, 28, 28), "float32"),
                                      "label": datasets.Value("int64")})
        return datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    from PIL import Image

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    return datasets.Dataset.from_dict({"image": [Image.fromarray(p) for p in pixels], "label": labels},
                                      features=features)


def save_images(samples: int, data_dir: str) -> None:
    """Write the ``image`` dataset to ``data_dir`` with ``save_to_disk`` (the ``image-disk`` kind's files)."""
    import datasets

    datasets.disable_progress_bars()
    make_data("image", "hf", samples).save_to_disk(data_dir)


def _prepare_cache(kind: str, variant: str, args: argparse.Namespace) -> None:
    """``image-disk``: remove the decoded images ``datasets`` cached next to the files before a first run (``hf``,
    ``hf-arrow``); before a later run (``hf-cached``) when no run left them, run the same fit once, untimed."""
    import glob

    if kind != "image-disk" or variant == "tensor":
        return
    cached = glob.glob(os.path.join(args.data_dir, "cache-*.arrow"))
    if variant != "hf-cached":
        for path in cached:
            os.remove(path)
    elif not cached:
        _fit(kind, variant, args)


def run_once(kind: str, variant: str, args: argparse.Namespace) -> dict:
    """One fit in this process: ``{"build", "setup", "round0", "round", "fit"}`` in seconds (``round``: the median
    of rounds 1..), and the trained weights' sum (the same for every variant of a kind)."""
    import torch

    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    try:
        from lightning_fed.datamodules import huggingface as limits
    except ImportError:  # before #40.4 (to measure a commit before it with this script)
        from lightning_fed.datamodules import federated as limits
    torch.set_num_threads(1)
    _prepare_cache(kind, variant, args)
    limit = limits.HF_TENSOR_LIMIT_BYTES
    if variant == "hf-arrow":
        limits.HF_TENSOR_LIMIT_BYTES = 0
    try:
        return _fit(kind, variant, args)
    finally:
        limits.HF_TENSOR_LIMIT_BYTES = limit


def _fit(kind: str, variant: str, args: argparse.Namespace) -> dict:
    import lightning as L
    import torch
    import torch.nn.functional as F
    from lightning.pytorch.callbacks import Callback

    from lightning_fed import FederatedTrainer
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    start = time.perf_counter()
    data = make_data(kind, variant, args.samples, args.data_dir)
    build = time.perf_counter() - start

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                           torch.nn.Linear(256, 10))

        def training_step(self, batch, batch_idx):
            x, y = (batch["image"], batch["label"]) if isinstance(batch, dict) else batch
            x = x.float() / 255 if x.dtype == torch.uint8 else x
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Clock(Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []
            self.ends: list[float] = []

        def on_train_epoch_start(self, trainer, module):
            self.starts.append(time.perf_counter())

        def on_train_epoch_end(self, trainer, module):
            self.ends.append(time.perf_counter())

    clock, model = Clock(), MLP()
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=args.clients, seed=0),
                             clients_per_round=args.cohort, batch_size=args.batch, local_epochs=1)
    trainer = FederatedTrainer(max_epochs=args.rounds, logger=False, enable_checkpointing=False,
                               enable_progress_bar=False, enable_model_summary=False, callbacks=[clock])
    start, cpu = time.perf_counter(), time.process_time()
    trainer.fit(model, datamodule=dm)
    fit, cpu = time.perf_counter() - start, time.process_time() - cpu
    rounds = [e - s for s, e in zip(clock.starts, clock.ends)]
    return {"build": build, "setup": clock.starts[0] - start, "round0": rounds[0],
            "round": statistics.median(rounds[1:]) if len(rounds) > 1 else float("nan"), "fit": fit, "cpu": cpu,
            "weights": float(sum(p.detach().double().sum() for p in model.parameters()))}


def png_payloads(samples: int, mode: str = "L") -> list:
    """``samples`` of the benchmark's images (numpy seed 0; ``mode`` ``"L"``, ``"RGB"`` or ``"RGBA"``: the grey
    pixels repeated, alpha their complement) as PNG bytes, as the ``Image`` feature stores them
    (``encode_example``)."""
    import datasets
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, (samples, 28, 28), dtype=np.uint8)
    stack = {"L": lambda p: p, "RGB": lambda p: np.stack([p, p // 2, 255 - p], axis=-1),
             "RGBA": lambda p: np.stack([p, p // 2, p // 3, 255 - p], axis=-1)}[mode]
    feature = datasets.Image()
    return [feature.encode_example(Image.fromarray(stack(p), mode))["bytes"] for p in pixels]


def _decoder(name: str):
    """The decoder ``name`` (:data:`DECODERS`) as a function of PNG bytes giving a ``[C, H, W]`` uint8 array."""
    import io

    import numpy as np

    if name == "decode_example":
        import datasets

        from lightning_fed.datamodules.hf_images import image_array

        feature = datasets.Image()
        return lambda payload: image_array(feature, {"bytes": payload, "path": None})
    if name == "pil-png":
        from PIL import Image

        def pil_png(payload: bytes) -> np.ndarray:
            image = Image.open(io.BytesIO(payload), formats=["PNG"])
            image.load()
            return np.frombuffer(image.tobytes(), np.uint8).reshape(image.height, image.width, -1).transpose(2, 0, 1)

        return pil_png
    import torch
    from torchvision.io import ImageReadMode, decode_png

    return lambda payload: decode_png(torch.frombuffer(bytearray(payload), dtype=torch.uint8),
                                      ImageReadMode.UNCHANGED).numpy()


def corrupt_png(payload: bytes, corruption: str) -> bytes:
    """``payload`` (a PIL-written PNG: signature, IHDR, one IDAT, IEND) with its IDAT chunk's checksum wrong
    (``bad-crc``: the image data intact) or holding the rows of half the image (``short``: checksum right)."""
    import struct
    import zlib

    length = struct.unpack(">I", payload[33:37])[0]
    data, rest = payload[41 : 41 + length], payload[45 + length :]
    if corruption == "bad-crc":
        return payload[: 41 + length] + struct.pack(">I", zlib.crc32(b"IDAT" + data) ^ 1) + rest
    rows = zlib.decompress(data)
    data = zlib.compress(rows[: len(rows) // 2])
    return payload[:33] + struct.pack(">I", len(data)) + b"IDAT" + data + struct.pack(">I", zlib.crc32(b"IDAT" + data)) \
        + rest


def _outcome_here(name: str, corruption: str) -> str:
    """What decoder ``name`` does with a ``corruption`` of the first image, in this process: ``decodes`` or
    ``raises <error>``."""
    try:
        _decoder(name)(corrupt_png(png_payloads(1)[0], corruption))
        return "decodes"
    except Exception as error:  # noqa: BLE001 (reported)
        return f"raises {type(error).__name__}"


def _corrupt_outcome(name: str, corruption: str) -> str:
    """:func:`_outcome_here`, for ``torchvision`` in a fresh process (a crash ends it: ``killed by signal <n>``)."""
    if name != "torchvision":
        return _outcome_here(name, corruption)
    code = (f"import sys; sys.path[:0] = {[os.path.dirname(os.path.abspath(__file__)), os.getcwd()]!r}\n"
            "import warnings; warnings.simplefilter('ignore')\n"
            f"import hf_datasets; print(hf_datasets._outcome_here({name!r}, {corruption!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode < 0:
        return f"killed by signal {-done.returncode}"
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else f"exit {done.returncode}"


def decoder_report(args: argparse.Namespace) -> dict:
    """``--decoders``: ``{decoder: {"us": CPU µs an image, "same": bool, "bad-crc": outcome, "short": outcome}}``
    (see the module docstring), printed as a table."""
    import warnings

    import numpy as np

    payloads = png_payloads(args.samples)
    reference = _decoder("decode_example")
    modes = {mode: png_payloads(4, mode) for mode in ("L", "RGB", "RGBA")}
    report: dict = {}
    print(f"{args.samples} PNGs 28x28 grey as datasets' Image feature stores them; CPU time per image, fastest of "
          f"{args.repeats}; load average (1 min) {os.getloadavg()[0]:.2f}")
    print(f"{'decoder':15s} {'us/image':>9s}  {'same pixels':11s}  " + "  ".join(f"{c:18s}" for c in CORRUPTIONS))
    for name in args.decoders:
        decode = _decoder(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchvision's deprecation warning, at every call
            best = math.inf
            for _ in range(args.repeats):
                start = time.thread_time()
                for payload in payloads:
                    decode(payload)
                best = min(best, time.thread_time() - start)
            same = all(np.array_equal(decode(p), reference(p)) and decode(p).shape == reference(p).shape
                       for values in modes.values() for p in values)
        report[name] = {"us": best / len(payloads) * 1e6, "same": same,
                        **{c: _corrupt_outcome(name, c) for c in CORRUPTIONS}}
        print(f"{name:15s} {report[name]['us']:9.1f}  {str(same):11s}  "
              + "  ".join(f"{report[name][c]:18s}" for c in CORRUPTIONS))
    print(f"load average (1 min) {os.getloadavg()[0]:.2f} after")
    return report


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["tensor", "hf", "hf-cached"],
                        help="hf-cached: image-disk only (a later run, reading the decoded column datasets cached)")
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--cohort", type=int, default=10)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--in-process", action="store_true",
                        help="run every fit in this process (tests; set-up times then share warm imports)")
    parser.add_argument("--decoders", nargs="+", choices=DECODERS,
                        help="measure these PNG decoders instead of fits (see the module docstring)")
    parser.add_argument("--only", nargs=2, metavar=("KIND", "VARIANT"), help=argparse.SUPPRESS)  # internal
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)  # internal: image-disk's files
    args = parser.parse_args(argv)
    for name in ("samples", "clients", "cohort", "batch", "rounds", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.decoders:  # no fit
        return args
    if args.cohort > args.clients:
        parser.error("--cohort must be <= --clients")
    if args.clients > args.samples:
        parser.error("--clients must be <= --samples")
    if "tensor" not in args.variants:
        parser.error("--variants must include tensor (the reference)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Run the comparison; returns ``{kind: {variant: {field: median seconds}, ...}}`` and prints the table."""
    args = parse_args(argv)
    if args.decoders:
        return decoder_report(args)
    if args.only:
        print(json.dumps(run_once(args.only[0], args.only[1], args)))
        return {}
    if "image-disk" not in args.kinds:
        return _compare(args)
    import shutil
    import tempfile

    args.data_dir = tempfile.mkdtemp(prefix="hf_datasets_")
    try:
        save_images(args.samples, args.data_dir)
        return _compare(args)
    finally:
        shutil.rmtree(args.data_dir, ignore_errors=True)


def _variants(kind: str, args: argparse.Namespace) -> list:
    """The variants run for ``kind``: ``hf-cached`` only for ``image-disk`` (the others have no files to cache)."""
    return [v for v in args.variants if v != "hf-cached" or kind == "image-disk"]


def _compare(args: argparse.Namespace) -> dict:
    passed = ["--samples", str(args.samples), "--clients", str(args.clients), "--cohort", str(args.cohort),
              "--batch", str(args.batch), "--rounds", str(args.rounds)] + \
        (["--data-dir", args.data_dir] if args.data_dir else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    load_before = os.getloadavg()
    runs: dict = {kind: {variant: [] for variant in _variants(kind, args)} for kind in args.kinds}
    for repeat in range(args.repeats):
        for kind in args.kinds:
            variants = _variants(kind, args)
            for variant in variants if repeat % 2 == 0 else variants[::-1]:  # order alternated
                if args.in_process:
                    result = run_once(kind, variant, args)
                else:
                    out = subprocess.run([sys.executable, __file__, *passed, "--only", kind, variant], env=env,
                                         check=True, capture_output=True, text=True).stdout
                    result = json.loads(out.strip().splitlines()[-1])
                runs[kind][variant].append(result)
    load_after = os.getloadavg()
    print(f"{args.samples} images 28x28, {args.clients} clients, cohort {args.cohort}, batch {args.batch}, "
          f"{args.rounds} rounds, MLP 784-256-10, 1 thread, medians of {args.repeats} interleaved repeats; "
          f"load average (1/5/15 min) {'/'.join(f'{v:.2f}' for v in load_before)} before, "
          f"{'/'.join(f'{v:.2f}' for v in load_after)} after")
    print(f"{'kind':10s} {'variant':9s} {'build s':>8s} {'set-up s':>9s} {'round 0 s':>10s} {'round s':>8s} "
          f"{'fit s':>7s} {'fit x':>6s} {'cpu s':>6s} {'cpu x':>6s}  same weights")
    report: dict = {}
    for kind in args.kinds:
        report[kind] = {}
        reference = runs[kind]["tensor"][0]["weights"]
        for variant in _variants(kind, args):
            med = {f: statistics.median(r[f] for r in runs[kind][variant]) for f in FIELDS}
            report[kind][variant] = med
            # the median of the repeats' ratios: each repeat's two fits ran next to each other, at one load
            ratio = statistics.median(r["fit"] / t["fit"] for r, t in zip(runs[kind][variant], runs[kind]["tensor"]))
            cpu_ratio = statistics.median(r["cpu"] / t["cpu"] for r, t in zip(runs[kind][variant],
                                                                              runs[kind]["tensor"]))
            same = all(r["weights"] == reference for r in runs[kind][variant])
            print(f"{kind:10s} {variant:9s} {med['build']:8.3f} {med['setup']:9.3f} {med['round0']:10.3f} "
                  f"{med['round']:8.3f} {med['fit']:7.3f} {ratio:6.2f} {med['cpu']:6.3f} {cpu_ratio:6.2f}  {same}")
            med["fit_ratio"], med["cpu_ratio"], med["same_weights"] = ratio, cpu_ratio, same
    return report


if __name__ == "__main__":
    main()
