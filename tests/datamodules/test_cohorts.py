"""The cohort sampler, one part of FederatedDataModule (#40 item 1): its checks, its settings report, its draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.datamodules.cohorts import COHORT_SAMPLINGS, CohortSampler


def test_settings_report_and_repr():
    sampler = CohortSampler(clients_per_round=4, cohort_sampling="poisson", client_dropout=0.25)
    assert sampler.settings() == {"clients_per_round": 4, "cohort_sampling": "poisson", "client_dropout": 0.25,
                                  "over_selection": 0.0}
    assert set(CohortSampler.run_settings) == set(sampler.settings())
    assert repr(sampler).startswith("CohortSampler(clients_per_round=4, cohort_sampling='poisson'")


@pytest.mark.parametrize("kwargs, match", [
    ({"clients_per_round": 0}, "`clients_per_round` must be a positive integer"),
    ({"client_dropout": 1.0}, r"`client_dropout` must be a probability in \[0, 1\)"),
    ({"over_selection": -1}, "`over_selection` must be a finite number >= 0"),
    ({"cohort_sampling": "uniform"}, "`cohort_sampling` must be one of"),
    ({"cohort_sampling": "poisson", "over_selection": 0.5}, "needs cohort_sampling='fixed_size'"),
    ({"cohort_sampling": "sweep_then_uniform", "over_selection": 0.5}, "needs cohort_sampling='fixed_size'"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CohortSampler(**kwargs)


def test_population_check_names_the_sizes():
    with pytest.raises(ValueError, match=r"`clients_per_round` \(5\) must not exceed the number of clients \(4\)"):
        CohortSampler(clients_per_round=5).check_population(4)


@pytest.mark.parametrize("sampling", COHORT_SAMPLINGS)
def test_the_data_module_draws_the_samplers_cohorts(sampling):
    """The data module composes the sampler: its cohorts are the sampler's, its attributes the sampler's settings."""
    dm = FederatedDataModule(TensorDataset(torch.zeros(60, 1)), partitioner=IIDPartitioner(30), clients_per_round=4,
                             cohort_sampling=sampling, client_dropout=0.2, seed=5)
    dm.setup()
    sampler = CohortSampler(4, sampling, 0.2, seed=5)
    assert dm.cohorts.settings() == sampler.settings() and dm.cohort_sampling == sampling
    for r in range(12):
        a, b = dm.select_cohort(r), sampler.select(r, 30)
        assert np.array_equal(a.cohort, b.cohort) and np.array_equal(a.candidates, b.candidates)
    assert dm.sweep_rounds == sampler.sweep_rounds(30) == (8 if sampling == "sweep_then_uniform" else 0)


def test_run_record_names_come_from_the_parts():
    """The checkpoint's run record and its names are the parts' reports (no list of data-module settings in
    checkpoint.py), in the order and with the names checkpoints were written with before #40."""
    from lightning_fed.checkpoint import RUN_CONFIG_NAMES

    assert RUN_CONFIG_NAMES == ("partitioner", "partition", "seed", "clients_per_round", "data_order", "drop_last",
                                "client_dropout", "over_selection", "cohort_sampling", "local_work", "server_optimizer",
                                "client_algorithms")
    dm = FederatedDataModule(TensorDataset(torch.zeros(8, 1)), partitioner=IIDPartitioner(4), clients_per_round=2,
                             cohort_sampling="poisson", seed=3)
    assert dm.run_config() == {"seed": 3, "clients_per_round": 2, "data_order": "reshuffle", "drop_last": False,
                               "client_dropout": 0.0, "over_selection": 0.0, "cohort_sampling": "poisson"}
    assert dm.settings()["eval_fraction"] is None and dm.settings()["cohort_sampling"] == "poisson"


def test_record_defaults_come_from_the_parts():
    """A checkpoint from before ``cohort_sampling`` was recorded compares as "fixed_size": the default is the
    sampler's, not a list in checkpoint.py."""
    from lightning_fed.checkpoint import _RECORD_DEFAULTS

    assert FederatedDataModule.record_defaults() == {"cohort_sampling": "fixed_size"}
    assert _RECORD_DEFAULTS["cohort_sampling"] == "fixed_size"
