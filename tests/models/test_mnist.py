"""MNISTDataModule and the Fed-LAMB MNIST models (Karimi, Li, Li, Sec. 4).

The raw files are written in the real on-disk IDX format (big-endian header, magic 2051 for uint8 images /
2049 for uint8 labels, uncompressed) into torchvision's raw layout ``{data_dir}/MNIST/raw/`` and read back by
torchvision's own reader.
"""

from __future__ import annotations

import pytest
import torch
from lightning_fed.models.mnist import MNISTCNN, MNISTMLP
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]


# ------------------------------------------------------------------------------------------------ models
def test_model_shapes_and_parameter_counts():
    mlp, cnn = MNISTMLP(), MNISTCNN()
    x = torch.randn(5, 1, 28, 28)
    for model in (mlp, cnn):
        model.eval()
        assert model(x).shape == (5, 10)
    # MLP: Linear(784, 200) + Linear(200, 10)
    assert sum(p.numel() for p in mlp.parameters()) == (784 * 200 + 200) + (200 * 10 + 10) == 159_010
    # CNN: Conv(1, 10, 5) + Conv(10, 20, 5) + Linear(20*4*4 = 320, 50) + Linear(50, 10)
    conv = (1 * 5 * 5 * 10 + 10) + (10 * 5 * 5 * 20 + 20)
    fc = (320 * 50 + 50) + (50 * 10 + 10)
    assert sum(p.numel() for p in cnn.parameters()) == conv + fc == 21_840
    # the 320 and 50 cells of the paper: the flattened feature map and the hidden layer
    feats = cnn.net[:8](x)
    assert feats.shape == (5, 320)
    assert [m.out_features for m in cnn.net if isinstance(m, torch.nn.Linear)] == [50, 10]
    assert [m.out_features for m in mlp.net if isinstance(m, torch.nn.Linear)] == [200, 10]
    assert mlp.hparams.dropout == 0.5 and cnn.hparams.dropout == 0.5 and mlp.hparams.lr == 0.01
    assert isinstance(cnn.configure_optimizers(), torch.optim.SGD)


def test_dropout_is_active_only_in_training():
    torch.manual_seed(0)
    x = torch.randn(4, 1, 28, 28)
    for model in (MNISTMLP(), MNISTCNN()):
        model.eval()
        assert torch.equal(model(x), model(x))
        model.train()
        assert not torch.equal(model(x), model(x))
        no_drop = type(model)(dropout=0.0).train()
        assert torch.equal(no_drop(x), no_drop(x))


@pytest.mark.parametrize("make,match", [
    (lambda: MNISTMLP(dropout=1.0), "`dropout`"),
    (lambda: MNISTMLP(dropout=-0.1), "`dropout`"),
    (lambda: MNISTMLP(hidden=0), "`hidden`"),
    (lambda: MNISTMLP(in_features=2.5), "`in_features`"),
    (lambda: MNISTMLP(num_classes=0), "`num_classes`"),
    (lambda: MNISTMLP(lr=0), "`lr`"),
    (lambda: MNISTCNN(lr=float("nan")), "`lr`"),
    (lambda: MNISTCNN(dropout=True), "`dropout`"),
    (lambda: MNISTCNN(in_channels=0), "`in_channels`"),
    (lambda: MNISTCNN(num_classes=-1), "`num_classes`"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()
