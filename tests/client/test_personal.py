"""lightning_fed.client.personal: the parts a client keeps local, selected by name, type or predicate, and the
per-client state sized by them (the methods end to end: tests/algorithms/test_fedbn.py, test_fedper.py,
test_fedrep.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_fed.client.personal import LocalParts, select_parts


def _net():
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_select_by_name_type_and_predicate():
    net = _net()
    assert select_parts(net, names=["0.bias"]) == ([1], [])
    assert select_parts(net, types=[nn.BatchNorm1d]) == ([2, 3], [0, 1, 2])
    assert select_parts(net, predicate=lambda name, t: name.endswith("weight") and t.ndim == 2) == ([0, 4], [])
    assert select_parts(net, names=["2"], types=[nn.BatchNorm1d]) == ([2, 3, 4, 5], [0, 1, 2])


def test_state_is_sized_by_what_is_kept_and_the_update_is_zero_there():
    net = _net()
    half = LocalParts(names=["2"], types=[nn.BatchNorm1d])
    half.setup(net)
    assert half.state_dim(10**6) == 4 * 2 + 2 + 4 + 4 + 4 + 4 + 1  # head W, b; BN γ, β; mean, var, count
    before = [t.detach().clone() for t in list(net.parameters()) + list(net.buffers())]
    half.start(net, None, None)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
        net[1].num_batches_tracked += 3
    _, state = half.finish(net, None)
    assert state.shape == (half.state_dim(0),) and state[-1].item() == 3
    after = list(net.parameters()) + list(net.buffers())
    for i, (a, b) in enumerate(zip(before, after)):
        kept = i in (2, 3, 4, 5, 6, 7, 8)  # BN γ, β, head W, b; BN buffers
        assert torch.equal(a, b) == kept
    half.start(net, None, state)  # the next round: the client's own values come back
    assert torch.equal(net[2].bias, before[5] + 1) and net[1].num_batches_tracked.item() == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"names": [1]}, "`names` must be a list"), ({"types": ["BatchNorm2d"]}, "`types` must be a list of module"),
    ({"predicate": 3}, "`predicate` must be callable"),
])
def test_bad_selections_are_refused(kwargs, match):
    with pytest.raises(TypeError, match=match):
        LocalParts(**kwargs)
