"""HostSyncCounter (lightning_fed/client/host_sync.py): counts exactly the ops that read a tensor's value on the host,
and changes nothing else."""

from __future__ import annotations

import torch

from lightning_fed.client.host_sync import HostSyncCounter


def test_counts_each_way_of_reading_a_value_on_the_host_once():
    x = torch.arange(4.0, requires_grad=True)
    with HostSyncCounter() as counter:
        y = (x * 2).sum()
        y.backward()  # the graph, the gradient: no value read on the host
        assert counter.count == 0
        values = [y.item(), float(y), int(y), bool(y)]
        assert counter.count == 4
        if x.grad[1] > 0:  # a Python branch on a tensor
            values.append("branch")
        assert counter.count == 5
        x.detach().cpu()  # a copy to the CPU (here no copy): not counted
        assert counter.count == 5
    assert values == [12.0, 12.0, 12, True, "branch"]
    assert torch.equal(x.grad, torch.full((4,), 2.0))


def test_counting_again_adds_and_results_are_unchanged():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 8, generator=g)
    counter = HostSyncCounter()
    with counter:
        inside = torch.linalg.matrix_norm(a @ a.T)
        float(inside)
    with counter:
        a.max().item()
    assert counter.count == 2
    assert torch.equal(inside, torch.linalg.matrix_norm(a @ a.T))
