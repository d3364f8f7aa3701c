"""server/fit_checks.py: the server optimizer's own checks before any client trains, as functions of what they check
(issue #52 moved them out of callbacks/server_optimizer.py's hooks): each one called directly, without a fit."""

from __future__ import annotations

import lightning
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed import FederatedTrainer
from lightning_fed.algorithms import ScaffoldControl
from lightning_fed.client import ClientAlgorithm
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.aggregators import Krum, WeightedMean
from lightning_fed.server.fit_checks import (check_cohort, check_federated_trainer, check_own_chain, frozen_positions,
                                             local_parameter_ids)


def test_a_ready_made_methods_own_chain_is_kept_by_identity_and_anything_else_refused_naming_it():
    own = [ScaffoldControl()]
    check_own_chain("SCAFFOLD", own, own)  # the very same stages: fine
    check_own_chain("SCAFFOLD", own, list(own))  # another list holding them: fine
    check_own_chain("FedAvg", None, [WeightedMean()])  # no chain of its own: any chain is fine
    message = (r"^SCAFFOLD aggregates in its own way \(its aggregator chain is \[ScaffoldControl\]\), so another "
               r"`aggregators` chain cannot be used; use them with a server optimizer that takes the default "
               r"aggregation\.$")
    for replaced in ([ScaffoldControl()], None, [], [own[0], WeightedMean()]):  # equal type, none, shorter, longer
        with pytest.raises(ValueError, match=message):
            check_own_chain("SCAFFOLD", own, replaced)


def test_only_a_trainer_with_the_federated_loop_is_accepted(tmp_path):
    quiet = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, default_root_dir=tmp_path)
    with pytest.raises(RuntimeError, match=r"^FedAdam is a server optimizer: it needs lightning_fed\.FederatedTrainer, "
                                           r"but Trainer trains centrally and would ignore it\."):
        check_federated_trainer("FedAdam", lightning.Trainer(**quiet))
    check_federated_trainer("FedAdam", FederatedTrainer(**quiet))


def test_the_chains_cohort_checks_get_the_data_modules_clients_per_round():
    data = TensorDataset(torch.zeros(12, 1), torch.zeros(12))
    krum = Krum(num_malicious_clients=1)  # needs K > 2f + 2 = 4 reporting clients
    seen = []
    check_cohort([seen.append, krum.check_cohort],
                 FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=5))
    assert seen == [5] and isinstance(seen[0], int)
    with pytest.raises(ValueError, match=r"`clients_per_round`=4 is too small for Krum"):
        check_cohort([krum.check_cohort],
                     FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=4))
    check_cohort([seen.append], None)  # no data module (or none with a cohort size): nothing to check
    assert seen == [5]


class _KeepsLocal(ClientAlgorithm):
    """A client half that keeps the parameters at ``positions`` on the clients (as LocalParts does once set up)."""

    def __init__(self, positions):
        self.positions = positions

    def local_parameters(self):
        return list(self.positions)


def test_local_parameter_ids_are_those_the_halves_keep_and_positions_past_the_model_are_skipped():
    params = [torch.zeros(2), torch.zeros(3), torch.zeros(1), torch.zeros(4)]
    ids = local_parameter_ids(params, [_KeepsLocal([3, 9]), ClientAlgorithm(), _KeepsLocal([1, 3])])
    assert ids == {id(params[1]), id(params[3])}
    assert local_parameter_ids(params, []) == set()


def test_frozen_positions_are_the_untrained_and_the_local_ones_and_all_frozen_is_refused():
    params = [torch.zeros(1) for _ in range(5)]
    trained = [True, False, True, True, False]
    local = {id(params[2])}
    assert frozen_positions("DPFedAvg", params, trained, local) == [1, 2, 4]  # not trained: 1, 4; kept local: 2
    assert frozen_positions("DPFedAvg", params, [True] * 5, set()) == []
    with pytest.raises(ValueError, match=r"^DPFedAvg adds DP noise, but no parameter is trained and shared \(all "
                                         r"frozen or kept local by a client half\)\.$"):
        frozen_positions("DPFedAvg", params[:2], [True, False], {id(params[0])})
