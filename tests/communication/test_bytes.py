"""Bytes counted (issue #56 item 1): each round's bytes down (x_t over the federated parameters that travel, and the
buffers) and up (each Δ_i as encoded, the buffers, the extras' tensors), against counts made by hand from the model's
shapes and dtypes: a plain model, a frozen encoder (LoRA-style: only the trainable head travels), FedPer (the kept
head travels neither way), SCAFFOLD (Δc_i travels up too), top-k encoding, and the totals across a resume."""

from __future__ import annotations

import csv

import lightning as L
import pytest
from lightning.pytorch.loggers import CSVLogger
import torch
from torch.utils.data import TensorDataset

from helpers import (CHECKPOINT_DIR_REUSED, FrozenEncoder, LinearRegression, federated_fit, quiet_trainer_kwargs,
                     regression_data)
from lightning_fed import FederatedTrainer
from lightning_fed.algorithms.fedper import FedPerClient
from lightning_fed.callbacks import SCAFFOLD, FedAvg
from lightning_fed.communication import QSGD, Compression, TopK
from lightning_fed.communication.bytes import planned_bytes
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

ROUNDS, COHORT = 2, 3


def datamodule(clients_per_round=COHORT, num_clients=6):
    x, y = regression_data(n=36, d=3, seed=1)
    return FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                               partitioner=IIDPartitioner(num_clients=num_clients, seed=0),
                               clients_per_round=clients_per_round, batch_size=6)


def comm(trainer):
    return trainer.fit_loop.communication.round_metrics()


def expect(down_per_client, up_per_client, rounds=ROUNDS, cohort=COHORT):
    return {"round_bytes_down": cohort * down_per_client, "round_bytes_up": cohort * up_per_client,
            "total_bytes_down": rounds * cohort * down_per_client,
            "total_bytes_up": rounds * cohort * up_per_client}


def test_56_every_federated_parameter_travels_both_ways_raw(tmp_path):
    # LinearRegression(3): weight [1, 3] + bias [1], float64: 4 × 8 = 32 bytes each way per client
    trainer = federated_fit(tmp_path, LinearRegression(), datamodule(), FedAvg(), ROUNDS, logger=CSVLogger(tmp_path))
    assert comm(trainer) == expect(32, 32)
    with open(next(tmp_path.rglob("metrics.csv"))) as f:  # logged at each round's step, beside the round metrics
        rows = [{k: float(v) for k, v in r.items() if k.endswith(("bytes_down", "bytes_up")) or k == "step"}
                for r in csv.DictReader(f)]
    assert rows == [{"step": float(t), **expect(32, 32, rounds=t + 1)} for t in range(ROUNDS)]
    ledger = trainer.fit_loop.communication
    assert ledger.total_bytes_up == 192 and len(ledger.round_client_bytes_up) == COHORT
    assert set(ledger.round_client_bytes_up.values()) == {32} and sum(ledger.client_bytes_up.values()) == 192


@pytest.mark.filterwarnings("ignore:You passed in a `val_dataloader`:UserWarning")
def test_56_a_frozen_encoder_does_not_travel(tmp_path):
    # FrozenEncoder: encoder Linear(3, 6) frozen (24 entries, not sent); head Linear(6, 1) = 7 float64 entries: 56 bytes
    trainer = federated_fit(tmp_path, FrozenEncoder(), datamodule(), FedAvg(), ROUNDS)
    assert comm(trainer) == expect(56, 56)


class TwoLayer(LinearRegression):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).double()


@pytest.mark.filterwarnings("ignore:The client half.s. FedPerClient give each client a personal model")
def test_56_fedper_head_kept_on_the_client_travels_neither_way(tmp_path):
    # body Linear(3, 2): 6 + 2 = 8 float64 entries = 64 bytes; the head Linear(2, 1) (3 entries) stays local
    trainer = federated_fit(tmp_path, TwoLayer(), datamodule(), FedAvg(), ROUNDS,
                            client_algorithms=[FedPerClient(head=["linear.1"])])
    assert comm(trainer) == expect(64, 64)


def test_56_scaffold_uploads_its_control_variate_delta_too(tmp_path):
    # (x, c) down and (Δy_i, Δc_i) up (Karimireddy et al. 2020, Alg. 1, l. 5 and 14): c and Δc_i have 4 entries in
    # the control's dtype (float64 for float64 parameters): 32 + 32 bytes each way
    trainer = federated_fit(tmp_path, LinearRegression(), datamodule(), SCAFFOLD(), ROUNDS)
    assert comm(trainer) == expect(64, 64)


def test_56_top_k_uploads_k_values_and_k_int32_indices(tmp_path):
    # k = 2 float64 values (16 bytes) + 2 int32 indices (8 bytes) = 24 bytes up; 32 bytes down
    trainer = federated_fit(tmp_path, LinearRegression(), datamodule(), FedAvg(), ROUNDS,
                            client_algorithms=[Compression(TopK(k=2))])
    assert comm(trainer) == expect(32, 24)


@pytest.mark.filterwarnings(CHECKPOINT_DIR_REUSED, "ignore:Be aware that when using `ckpt_path`:UserWarning")
def test_56_the_totals_carry_over_a_resume(tmp_path):
    full = federated_fit(tmp_path / "a", LinearRegression(), datamodule(), FedAvg(), 3)
    first = federated_fit(tmp_path / "b", LinearRegression(), datamodule(), FedAvg(), 2, ckpt_dir=tmp_path / "ckpt")
    assert first.fit_loop.communication.total_bytes_up == 2 * COHORT * 32
    resumed = federated_fit(tmp_path / "b", LinearRegression(), datamodule(), FedAvg(), 3,
                            ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert comm(resumed) == comm(full) == expect(32, 32, rounds=3)
    assert resumed.fit_loop.communication.client_bytes_up == full.fit_loop.communication.client_bytes_up


class Planned(L.Callback):
    """What a clock would read once the round has started (x_t snapshot): planned_bytes of the client runner."""

    def __init__(self):
        self.planned = {}

    def on_client_start(self, trainer, pl_module, client_id, round_idx):
        self.planned.setdefault(round_idx, planned_bytes(trainer.fit_loop.client_runner))


@pytest.mark.parametrize("half, up", [(None, 32), (Compression(TopK(k=2)), 24), (Compression(QSGD(levels=3)), 6)])
def test_56_the_bytes_planned_at_the_round_start_are_those_counted(tmp_path, half, up):
    # QSGD(3) on 4 entries: 32 + 4·(1 + 2) bits = 44 bits: 6 bytes
    planned = Planned()
    trainer = FederatedTrainer(max_epochs=ROUNDS, callbacks=[FedAvg(), planned], **quiet_trainer_kwargs(tmp_path),
                               client_algorithms=[half] if half else None)
    trainer.fit(LinearRegression(), datamodule=datamodule())
    assert planned.planned == {t: (32, up) for t in range(ROUNDS)}
    assert set(trainer.fit_loop.communication.round_client_bytes_up.values()) == {up}
