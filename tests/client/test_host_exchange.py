"""Ranks on one host exchange their packed updates through /dev/shm (issue #33.4): the segments (alternating
parity, growth, no room, removal) in one process, and over two gloo processes the same updates bit for bit as the
process group's all_gather, with the exchange used, and every rank falling back when one rank does not write."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from lightning_fed.client.distributed import pack_updates, unpack_updates
from lightning_fed.client.host_exchange import HostExchange

from client.test_distributed_gather import _free_port, assert_same, make_update


def _roundtrip(writer: HostExchange, reader: HostExchange, updates) -> tuple[int, int]:
    packed = pack_updates(updates, [(9, "timed out")])
    parity, generation = writer.write(packed)
    got, failures = unpack_updates(reader.read(writer.rank, parity, generation, packed.total_bytes),
                                   len(packed.meta), torch.device("cpu"))
    assert_same(got, updates)
    assert failures == [(9, "timed out")]
    return parity, generation


def test_segments_alternate_grow_and_are_removed(tmp_path):
    writer, reader = HostExchange("t", 0, str(tmp_path)), HostExchange("t", 1, str(tmp_path))
    small = [make_update(1), make_update(2)]
    assert _roundtrip(writer, reader, small) == (0, 1)
    assert _roundtrip(writer, reader, small) == (1, 2)
    assert _roundtrip(writer, reader, small) == (0, 1)  # segment 0 reused: it fits
    big = [make_update(3)]
    big[0].delta.append(torch.randn(400_000))  # 1.6 MB > the 1 MiB first segment: a new, larger file
    assert _roundtrip(writer, reader, big) == (1, 3)
    assert _roundtrip(writer, reader, small) == (0, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t-r0-p0-g1", "t-r0-p1-g3"]  # the old p1 file is gone
    assert os.path.getsize(tmp_path / "t-r0-p1-g3") == 2 * (1 << 20)  # max(need, 2 × old)
    writer.close()
    reader.close()
    assert list(tmp_path.iterdir()) == []


def test_files_are_unlinked_once_every_peer_has_mapped_them(tmp_path):
    """settle(): a file is unlinked at the gather after the one in which every rank wrote (so every peer mapped it);
    the segments keep working through the mappings; after a gather where some rank did not write, the file stays."""
    writer, reader = HostExchange("t", 0, str(tmp_path)), HostExchange("t", 1, str(tmp_path))
    files = lambda: sorted(p.name for p in tmp_path.iterdir())  # noqa: E731
    updates = [make_update(1)]
    writer.write(pack_updates(updates, []))  # gather 1: p0-g1 created, but rank 1 did not write: no peer mapped it
    writer.settle(everyone_wrote=False)
    assert files() == ["t-r0-p0-g1"]
    writer.write(pack_updates(updates, []))  # gather 2: p1-g2, read by the peer
    writer.settle(everyone_wrote=True)
    reader.read(0, 1, 2, pack_updates(updates, []).total_bytes)
    assert files() == ["t-r0-p0-g1", "t-r0-p1-g2"]
    assert _roundtrip(writer, reader, updates) == (0, 1)  # gather 3: p0-g1 reused and read now
    writer.settle(everyone_wrote=True)
    assert files() == ["t-r0-p0-g1"]  # p1-g2 was mapped in gather 2: gone; p0-g1 mapped now: at the next gather
    assert _roundtrip(writer, reader, [make_update(2)]) == (1, 2)  # through the mappings alone
    writer.settle(everyone_wrote=True)
    assert files() == []
    assert _roundtrip(writer, reader, [make_update(3)]) == (0, 1)
    writer.close()
    reader.close()


def test_write_without_room_returns_none(tmp_path):
    exchange = HostExchange("t", 0, str(tmp_path / "missing"))  # os.open fails: as a full /dev/shm would
    assert exchange.write(pack_updates([make_update(1)], [])) is None
    exchange.close()


SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch, torch.distributed as dist
    from client.test_distributed_gather import assert_same, make_update
    from lightning_fed.client.distributed import gather_updates
    from lightning_fed.client.host_exchange import close_host_exchanges, host_exchange

    rank, port, shm = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    enabled = shm == "on" or (shm == "rank0" and rank == 0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=2)
    cohort = [6, 0, 3, 8, 1, 5]
    mine = {{0: [6, 3, 1], 1: [0, 8]}}[rank]
    for round_idx in range(4):
        def update(c):
            u = make_update(c + 10 * round_idx)
            u.client_id = c
            if round_idx == 2 and c == 8:  # rank 1 grows its segment
                u.delta.append(torch.randn(600_000, generator=torch.Generator().manual_seed(c)))
            return u
        failures = [] if rank == 0 else [(5, f"error: round {{round_idx}}")]
        got, got_failures = gather_updates([update(c) for c in mine], failures, cohort, torch.device("cpu"),
                                           shared_memory=enabled)
        assert_same(got, [update(c) for c in [6, 0, 3, 8, 1]])
        assert got_failures == [(5, f"error: round {{round_idx}}")]
    used = host_exchange() is not None and host_exchange()._calls == 4
    prefix = host_exchange().prefix if host_exchange() is not None else "none"
    close_host_exchanges()
    dist.destroy_process_group()
    print("ok", rank, "wrote its segment every round:", used, "prefix:", prefix)
    """
)


def _run(tmp_path, shm: str) -> list[str]:
    script = tmp_path / "exchange.py"
    script.write_text(SCRIPT.format(tests=str(Path(__file__).parent.parent)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, shm], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"ok {rank}" in out, out
    return outputs


def test_two_processes_exchange_through_shared_memory_bit_exact(tmp_path):
    outputs = _run(tmp_path, "on")
    assert all("wrote its segment every round: True" in out for out in outputs), outputs
    # this run's segments removed (matched by its own prefix: tests in other processes may hold theirs meanwhile)
    prefixes = {out.split("prefix: ")[1].split()[0] for out in outputs}
    assert len(prefixes) == 1 and prefixes != {"none"}, outputs
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(prefixes.pop() + "-")]


def test_one_rank_without_shared_memory_falls_back_on_every_rank(tmp_path):
    outputs = _run(tmp_path, "rank0")  # rank 0 writes its segment, rank 1 does not: every round all_gathers
    assert "every round: True" in outputs[0] and "every round: False" in outputs[1], outputs
