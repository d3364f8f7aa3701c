"""TwoHeadMLP (issue #55 item 5, the FedRoD row of the personalised-breadth table): Fed-LAMB's MNIST MLP with a
personal head beside its output layer, the model shape FedRoD needs (Chen & Chao, ICLR 2022: one body, a generic and
a personal head, the personalised logits their sum)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_fed.checks import ArgumentError
from lightning_fed.models.mnist import MNISTMLP
from lightning_fed.models.two_heads import TwoHeadMLP


@pytest.mark.parametrize("seed", [0, 7])
def test_starts_from_the_mlps_weights_and_leaves_the_generator_as_the_mlp_does(seed):
    """Under one seed the body and the generic head are MNISTMLP's ``net.1`` and ``net.4`` bit for bit, the personal
    head is all 0, and torch's generator is where MNISTMLP leaves it (the FedRoD row starts where the MLP rows do)."""
    torch.manual_seed(seed)
    mlp = MNISTMLP(hidden=200, dropout=0.0, lr=0.05)
    after_mlp = torch.rand(4)
    torch.manual_seed(seed)
    model = TwoHeadMLP(hidden=200, dropout=0.0, lr=0.05)
    after_model = torch.rand(4)
    assert torch.equal(after_mlp, after_model)
    assert [n for n, _ in model.named_parameters()] == ["body.1.weight", "body.1.bias", "head.weight", "head.bias",
                                                        "personal_head.weight", "personal_head.bias"]
    for mine, theirs in ((model.body[1], mlp.net[1]), (model.head, mlp.net[4])):
        assert torch.equal(mine.weight, theirs.weight) and torch.equal(mine.bias, theirs.bias)
    assert not model.personal_head.weight.any() and not model.personal_head.bias.any()
    assert sum(p.numel() for p in model.parameters()) == 159_010 + 200 * 10 + 10 == 161_020
    assert dict(model.hparams) == {"in_features": 784, "hidden": 200, "dropout": 0.0, "num_classes": 10, "lr": 0.05}


def test_logits_are_the_sum_of_both_heads_on_the_hidden_features():
    """forward(x) = head(z) + personal_head(z), z = relu(W1·flatten(x) + b1): a NumPy transcription in float64 with
    a non-zero personal head."""
    torch.manual_seed(1)
    model = TwoHeadMLP(hidden=6, dropout=0.0).eval()
    with torch.no_grad():
        model.personal_head.weight.normal_()
        model.personal_head.bias.normal_()
    x = torch.randn(5, 1, 28, 28)
    w = {n: p.detach().double().numpy() for n, p in model.named_parameters()}
    z = np.maximum(x.reshape(5, -1).double().numpy() @ w["body.1.weight"].T + w["body.1.bias"], 0.0)
    want = z @ w["head.weight"].T + w["head.bias"] + z @ w["personal_head.weight"].T + w["personal_head.bias"]
    np.testing.assert_allclose(model(x).detach().double().numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,name", [({"hidden": 0}, "`hidden`"), ({"dropout": 1.0}, "`dropout`"),
                                         ({"num_classes": 0}, "`num_classes`"), ({"lr": 0}, "`lr`")])
def test_bad_arguments_are_refused_by_name(kwargs, name):
    with pytest.raises(ArgumentError, match=name):
        TwoHeadMLP(**kwargs)
