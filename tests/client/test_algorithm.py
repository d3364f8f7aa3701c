"""lightning_fed.client.algorithm: the client-half protocol's helpers (the protocol end to end is in
tests/algorithms/, e.g. test_fedprox.py)."""

from __future__ import annotations

import pytest
import torch

from lightning_fed.callbacks import FedAvg, SCAFFOLD
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


def test_dispatch_only_marks_the_client_halves_step_without_halves():
    """#41: the server optimizer has no per-step hook any more; the runner's ClientAlgorithmSteps is skipped by the
    lean step and the vectorized executor when the run has no client half."""
    from lightning.pytorch.callbacks import Callback

    from lightning_fed.client.runner import ClientAlgorithmSteps

    assert type(FedAvg()).on_before_optimizer_step is Callback.on_before_optimizer_step
    assert type(SCAFFOLD()).on_before_optimizer_step is Callback.on_before_optimizer_step
    assert dispatch_only(ClientAlgorithmSteps())  # outside a fit: no halves
