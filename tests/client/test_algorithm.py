"""lightning_fed.client.algorithm: the client-half protocol's helpers (the protocol end to end is in
tests/algorithms/, e.g. test_fedprox.py)."""

from __future__ import annotations

import pytest
import torch

from lightning_fed.callbacks import FedAvg, FedProx, SCAFFOLD
from lightning_fed.client.algorithm import ClientAlgorithm, check_client_algorithms, dispatch_only, flat, unflat


class Scale(ClientAlgorithm):
    def __init__(self, factor: float, name: str = "x"):
        self.factor = factor
        self.name = name


def test_settings_and_repr_are_the_init_arguments():
    assert Scale(0.5).settings() == {"factor": 0.5, "name": "x"}
    assert repr(Scale(0.5)) == "Scale(factor=0.5, name='x')"
    assert ClientAlgorithm().state_dim(100) == 0 and ClientAlgorithm().finish(None, None) == ({}, None)


def test_check_client_algorithms():
    one = Scale(1.0)
    assert check_client_algorithms(None) == [] and check_client_algorithms(one) == [one]
    assert check_client_algorithms((one, one)) == [one, one]
    with pytest.raises(TypeError, match=r"`client\[1\]` must be a client algorithm .* got str"):
        check_client_algorithms([one, "FedProxClient"])


def test_flat_and_unflat_round_trip():
    like = [torch.zeros(2, 3, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)]
    vector = torch.arange(10, dtype=torch.float64)
    parts = unflat(vector, like)
    assert [p.shape for p in parts] == [(2, 3), (4,)] and torch.equal(flat(parts), vector)


def test_dispatch_only_marks_a_server_optimizer_without_client_halves():
    assert dispatch_only(FedAvg())                      # its step hook only dispatches, and there is nothing to run
    assert not dispatch_only(FedAvg(client=[Scale(1.0)]))
    assert not dispatch_only(FedProx(mu=0.1))           # its own client half
    assert not dispatch_only(SCAFFOLD())                # its own on_before_optimizer_step
