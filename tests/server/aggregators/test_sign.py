"""signSGD with majority vote (Bernstein et al., ICML 2018, Alg. 3; ICLR 2019, Alg. 1) as a reducer: the stage
against NumPy, a federated fit with sign-compressed clients against a NumPy transcription of the algorithm, and its
refusal next to a DP stage."""

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from helpers import LinearRegression, federated_fit, linear_weights, mse_grad, regression_data
from lightning_fed.callbacks import FedAvg
from lightning_fed.communication import Compression, Sign
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
from lightning_fed.server.aggregators import ClientDeltas, ClipUpdates, MajorityVote, RoundInfo


def test_56_majority_vote_equals_sign_of_summed_signs():
    rng = np.random.default_rng(0)
    deltas = rng.normal(size=(4, 7))
    deltas[:, 0] = [1.0, -1.0, 2.0, -2.0]  # a tie: 0
    x = ClientDeltas(list(range(4)), [[torch.tensor(d)] for d in deltas], torch.tensor([5.0, 1.0, 1.0, 1.0],
                                                                                       dtype=torch.float64))
    out = MajorityVote().apply(x, (), RoundInfo(0, 0, 4, 4))[0][0]
    np.testing.assert_array_equal(out.numpy(), np.sign(np.sign(deltas).sum(0)))  # unweighted: one client one vote
    assert out[0] == 0


def test_56_signsgd_with_majority_vote_equals_its_numpy_transcription(tmp_path):
    x, y = regression_data(n=36, d=3, seed=1)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=6, seed=0), clients_per_round=3, batch_size=6)
    torch.manual_seed(0)
    model = LinearRegression(lr=0.1)
    w = linear_weights(model)
    federated_fit(tmp_path, model, dm, FedAvg(lr=0.05, aggregators=[MajorityVote()]), 3,
                  client_algorithms=[Compression(Sign())])
    for t in range(3):
        votes = np.zeros_like(w)
        for cid in dm.sample_clients(t):
            local = w.copy()
            for batch in dm.client_batches(cid, t):
                local = local - 0.1 * mse_grad(local, x[batch], y[batch])
            votes += np.where(local - w < 0, -1.0, 1.0)  # the client's sign bits (0 sent as +1)
        w = w + 0.05 * np.sign(votes)
    np.testing.assert_allclose(linear_weights(model), w, rtol=0, atol=1e-12)


def test_56_majority_vote_is_refused_with_a_dp_stage(tmp_path):
    x, y = regression_data(n=12, d=3)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)),
                             partitioner=IIDPartitioner(num_clients=2, seed=0), clients_per_round=2, batch_size=6)
    with pytest.raises(ValueError, match=r"MajorityVote cannot run with the DP stage\(s\) \['ClipUpdates'\]"):
        federated_fit(tmp_path, LinearRegression(), dm, FedAvg(aggregators=[ClipUpdates(1.0), MajorityVote()]), 1)
