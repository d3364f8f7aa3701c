"""EMNISTDataModule (torchvision IDX files, LEAF FEMNIST JSON) and the EMNIST CR / AE models.

The torchvision files are written in the real on-disk format (uncompressed big-endian IDX, magic 2051 / 2049,
names ``emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte`` under ``EMNIST/raw``) and read back by
torchvision's own ``EMNIST`` reader; the LEAF files follow LEAF's femnist JSON layout.
"""

from __future__ import annotations

import pytest
import torch
from lightning_fed.models.emnist import EMNISTCNN, EMNISTAutoencoder
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:.*LightningCLI.s args parameter.*"),
]


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_cnn_shapes_and_parameter_count():
    model = EMNISTCNN()
    conv1 = 1 * 32 * 3 * 3 + 32
    conv2 = 32 * 64 * 3 * 3 + 64
    dense = 64 * 12 * 12 * 128 + 128
    out = 128 * 62 + 62
    assert _count(model) == conv1 + conv2 + dense + out == 1_206_590
    assert model(torch.rand(5, 1, 28, 28)).shape == (5, 62)
    assert EMNISTCNN(num_classes=10)(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="`lr`"):
        EMNISTCNN(lr=0)
    with pytest.raises(ValueError, match="`num_classes`"):
        EMNISTCNN(num_classes=1)


def test_autoencoder_shapes_and_parameter_count():
    model = EMNISTAutoencoder()
    widths = [784, 1000, 500, 250, 30, 250, 500, 1000, 784]
    expected = sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))
    assert _count(model) == expected == 2_837_314  # TFF's create_autoencoder_model summary
    out = model(torch.rand(3, 784))
    assert out.shape == (3, 784) and (out > 0).all() and (out < 1).all()
    assert model(torch.rand(3, 1, 28, 28)).shape == (3, 784)
    linears = [m for m in model.net if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in linears] == widths[1:]
    code_idx = list(model.net).index(linears[3])
    assert not isinstance(model.net[code_idx + 1], torch.nn.Sigmoid)  # linear code layer
    assert sum(isinstance(m, torch.nn.Sigmoid) for m in model.net) == 7
    with pytest.raises(ValueError, match="`lr`"):
        EMNISTAutoencoder(lr=-1.0)
