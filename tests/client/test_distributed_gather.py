"""The round's updates gathered over ranks as tensors, not pickles (issue #33.4): the packing round trip, the
gather over 1 and 2 gloo processes against the updates themselves, and 2 processes equal to 1 for SCAFFOLD (tensor
extras: ``extras["delta_control"]`` and ``extras["client_state/0"]``)."""

from __future__ import annotations

import collections
import dataclasses
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lightning_fed.client.distributed import _Slot, gather_updates, pack_updates, unpack_updates
from lightning_fed.client.update import ClientUpdate

Pair = collections.namedtuple("Pair", "first second")


def make_update(client_id: int) -> ClientUpdate:
    """A client update with tensors of mixed dtypes, shapes and layouts, nested tensor and non-tensor extras
    (deterministic in ``client_id``)."""
    g = torch.Generator().manual_seed(client_id)
    conv = torch.randn(4, 3, 2, 2, generator=g).contiguous(memory_format=torch.channels_last)
    odd = torch.randn(3, 5, generator=g, dtype=torch.float64)
    odd[0, 0] = float("nan")
    odd[1, 1] = -0.0
    odd[2, 2] = float("-inf")
    return ClientUpdate(
        client_id=client_id,
        delta=[conv, torch.randn(7, generator=g), torch.randn(5, 3, generator=g).T, torch.tensor(2.5)],
        num_samples=10 + client_id, num_steps=3, loss=0.125 * client_id, client_lr=0.05,
        buffers=[torch.arange(client_id + 1, dtype=torch.int64), torch.tensor([True, False, True])],
        extras={
            "delta_control": [odd, torch.randn(2, generator=g).to(torch.bfloat16)],
            "client_state/0": torch.randn(9, generator=g, dtype=torch.float16),
            "nested": {"pair": Pair(torch.randint(0, 255, (6,), generator=g, dtype=torch.uint8), "label"),
                       "empty": torch.empty(0, 3), "complex": torch.randn(3, generator=g, dtype=torch.complex64)},
            "expanded": torch.ones(1).expand(4),  # overlapping strides: pickled, not packed
            "note": f"client {client_id}", "count": client_id, "nothing": None,
        },
        client_lrs=[0.05, 0.05, float("nan"), 0.05], loss_steps=2,
    )


def assert_same(a, b) -> None:
    """``a`` and ``b`` equal bit for bit: tensors by bytes, dtype, shape, strides, device; containers by type."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride(), a.device, a.requires_grad) == (
            b.dtype, b.shape, b.stride(), b.device, b.requires_grad)
        if a.numel():
            assert torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def test_pack_unpack_round_trip_is_bit_exact():
    updates = [make_update(3), make_update(1)]
    failures = [(5, "timed out")]
    packed = pack_updates(updates, failures)
    # the big tensors travel as bytes; the expanded tensor (overlapping) and every non-tensor stay in the pickle
    assert len(packed.slots) == 2 * 12
    assert all(slot.offset % 16 == 0 for slot, _ in packed.slots)
    assert b"client 3" in packed.meta and len(packed.meta) < 4000
    buffer = torch.full((packed.total_bytes + 5,), 0xAB, dtype=torch.uint8)  # padding is never read
    packed.write(buffer)
    got, got_failures = unpack_updates(buffer, len(packed.meta), torch.device("cpu"))
    assert got_failures == failures
    assert_same(got, updates)
    # own storage per tensor (a stored client state must not keep the whole round's buffer alive)
    delta = got[0].delta[1]
    assert delta.untyped_storage().nbytes() == delta.numel() * delta.element_size()
    assert delta.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()


def test_pack_refuses_a_short_buffer():
    packed = pack_updates([make_update(0)], [])
    with pytest.raises(ValueError, match="at least"):
        packed.write(torch.empty(packed.total_bytes - 1, dtype=torch.uint8))


def test_slot_size():
    assert _Slot(0, torch.float64, (3, 5), (5, 1), False).nbytes == 120
    assert _Slot(16, torch.bfloat16, (0, 4), (4, 1), False).nbytes == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gather_in_one_process_returns_cohort_order(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        updates = [make_update(4), make_update(9), make_update(2)]
        got, failures = gather_updates(updates, [(7, "b"), (1, "a")], [9, 1, 4, 7, 2], torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert [u.client_id for u in got] == [9, 4, 2]
    assert failures == [(1, "a"), (7, "b")]
    assert_same(got, [updates[1], updates[0], updates[2]])


GATHER_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch, torch.distributed as dist
    from client.test_distributed_gather import assert_same, make_update
    from lightning_fed.client.distributed import gather_updates

    rank, port = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=2)
    cohort = [6, 0, 3, 8, 1, 5]
    mine = {{0: [6, 3, 1], 1: [0, 8]}}[rank]  # client 5 fails on rank 1; rank 1 sends fewer bytes
    failures = [] if rank == 0 else [(5, "error: boom")]
    got, got_failures = gather_updates([make_update(c) for c in mine], failures, cohort, torch.device("cpu"))
    assert_same(got, [make_update(c) for c in [6, 0, 3, 8, 1]])
    assert got_failures == [(5, "error: boom")]
    dist.destroy_process_group()
    print("ok", rank)
    """
)


def test_gather_over_two_gloo_processes_is_bit_exact(tmp_path):
    script = tmp_path / "gather.py"
    script.write_text(GATHER_SCRIPT.format(tests=str(Path(__file__).parent.parent)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"ok {rank}" in out, out


TRAIN_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    torch.set_num_threads(1)
    from helpers import SmallClassifier, classification_dataset
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import SCAFFOLD
    from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule

    out, devices = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    model = SmallClassifier(dropout=0.2)
    train, val = classification_dataset(n=1000, n_val=100)
    dm = FederatedDataModule(train, val_dataset=val, partitioner=DirichletPartitioner(num_clients=10, alpha=0.5),
                             clients_per_round=5, batch_size=8)
    server = SCAFFOLD(lr=0.8)
    trainer = FederatedTrainer(
        max_epochs=3, callbacks=[server], strategy="ddp" if devices > 1 else "auto",
        accelerator="cpu", devices=devices, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )
    trainer.fit(model, datamodule=dm)
    if trainer.global_rank == 0:
        torch.save({{"state": model.state_dict(), "server": server.state_dict(), "world_size": trainer.world_size,
                    "loss": float(trainer.callback_metrics["round_train_loss"])}}, out)
    """
)


def _tensors(value, prefix=""):
    """``{path: tensor}`` of every tensor in a nested state dict."""
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    if isinstance(value, dict):
        return {k: t for key, v in value.items() for k, t in _tensors(v, f"{prefix}/{key}").items()}
    if isinstance(value, (list, tuple)):
        return {k: t for i, v in enumerate(value) for k, t in _tensors(v, f"{prefix}/{i}").items()}
    return {}


def test_scaffold_two_gloo_processes_equal_one(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT.format(tests=str(Path(__file__).parent.parent)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for devices in (1, 2):
        run = subprocess.run([sys.executable, str(script), str(tmp_path / f"w{devices}.pt"), str(devices)],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
    one = torch.load(tmp_path / "w1.pt", weights_only=True)
    two = torch.load(tmp_path / "w2.pt", weights_only=True)
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert one["loss"] == two["loss"]  # the round's client-weighted loss from the gathered updates
    for key, value in one["state"].items():
        torch.testing.assert_close(two["state"][key], value, rtol=0, atol=0)  # bit for bit
    server_one, server_two = _tensors(one["server"]), _tensors(two["server"])  # c and the clients' c_i
    assert server_one.keys() == server_two.keys() and server_one
    for key, value in server_one.items():
        torch.testing.assert_close(server_two[key], value, rtol=0, atol=0, msg=key)
