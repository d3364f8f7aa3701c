"""Clients spread over 2 CPU processes (gloo) end with the same weights as a single-process run."""

from __future__ import annotations

from lightning_fed.distributed import assign_clients


def test_assign_clients_balances_largest_first():
    shares = assign_clients([10, 11, 12, 13, 14], [100, 10, 60, 50, 5], world_size=2)
    # LPT: 100 -> r0; 60 -> r1; 50 -> r1 (60 < 100); 10 -> r0? loads r0=100, r1=110 -> r0; 5 -> r0 (110 vs 110: r0)
    assert shares == [[10, 11, 14], [12, 13]]
    assert assign_clients([1, 2, 3], [5, 5, 5], world_size=1) == [[1, 2, 3]]
    assert sorted(sum(assign_clients(list(range(7)), [3] * 7, 3), [])) == list(range(7))
