"""CIFAR-10/100 data modules, the Pachinko partitioner and the CIFAR ResNets.

The fake CIFAR files are written in the REAL python-pickle layout torchvision reads
(``cifar-10-batches-py/data_batch_1..5``, ``test_batch``, ``batches.meta``; ``cifar-100-python/train``,
``test``, ``meta`` with ``fine_labels`` / ``coarse_labels``; ``data`` uint8 ``[N, 3072]`` in CHW row-major
order) and read back by torchvision's own reader. Their md5s differ from torchvision's, so the data
modules are given ``check_md5=False`` (documented option; one test checks the md5 path rejects them).
"""

from __future__ import annotations

import pickle
import pytest
import torch
from torch import nn
from lightning_fed.models.resnet import ResNet9, ResNet18GN
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*self.trainer. reference is not registered.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]


# ---------------------------------------------------------------------------------------------- models
@pytest.mark.parametrize("cls", [ResNet18GN, ResNet9])
@pytest.mark.parametrize("size", [24, 32])
def test_model_shapes(cls, size):
    model = cls(num_classes=100).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, size, size)).shape == (2, 100)


def _count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_resnet18gn_structure_and_count():
    from torchvision.models import resnet18

    model = ResNet18GN(num_classes=10)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    gns = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(gns) == 20 and all(g.num_groups == 2 for g in gns)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert model.net.conv1.kernel_size == (3, 3) and model.net.conv1.stride == (1, 1)
    # torchvision's ImageNet resnet18 minus the 7x7 -> 3x3 first conv (GN and BN have the same 2*C params)
    ref = _count(resnet18(num_classes=10))
    assert ref == 11_181_642
    assert _count(model) == ref - 3 * 64 * (49 - 9) == 11_173_962
    assert _count(ResNet18GN(num_classes=100)) == 11_173_962 + 90 * 513
    clone = pickle.loads(pickle.dumps(model))  # no closures inside (spawned DDP workers pickle the model)
    assert _count(clone) == _count(model)


def test_resnet9_count_and_training_step():
    convs = 3 * 64 + 64 * 128 + 2 * 128 * 128 + 128 * 256 + 256 * 512 + 2 * 512 * 512
    norms = 2 * (64 + 128 + 128 + 128 + 256 + 512 + 512 + 512)
    assert _count(ResNet9(num_classes=10)) == convs * 9 + norms + 512 * 10 == 6_573_120
    bn = ResNet9(norm="batch")
    assert any(isinstance(m, nn.BatchNorm2d) for m in bn.modules())
    model = ResNet18GN(num_classes=10, lr=0.05)
    opt = model.configure_optimizers()
    assert isinstance(opt, torch.optim.SGD) and opt.param_groups[0]["lr"] == 0.05
    loss = model.training_step((torch.randn(2, 3, 24, 24), torch.tensor([1, 2])), 0)
    assert loss.ndim == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("kwargs, match", [({"num_classes": 0}, "num_classes"), ({"lr": 0.0}, "lr"),
                                           ({"norm": "layer"}, "norm"), ({"num_groups": 3}, "num_groups")])
def test_model_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResNet18GN(**kwargs)
