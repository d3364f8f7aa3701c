"""ResNets for the CIFAR tasks: ResNet-18 with group norm (Reddi et al. 2021) and the DAWNBench ResNet-9.

Sources
-------
* Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Sec. 5: "For CIFAR-10 and CIFAR-100, we
  train ResNet-18 (replacing batch norm with group norm (Hsieh et al., 2019))". The paper does not give
  the number of groups; the TFF code behind it (google-research/federated, ``optimization``) uses
  2 groups, hence ``num_groups=2``. Inputs are the 24x24 crops of App. C.
* ResNet-9: D. Page's DAWNBench CIFAR-10 entry ("How to train your ResNet", Myrtle.ai, 2018).

Batch norm keeps running statistics that federated averaging handles badly (Hsieh et al. 2019), so both
models use group norm by default; nothing federated lives here (client model + client optimiser only).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from lightning_fed.checks import ArgumentError, check_choice, check_positive, check_positive_int
from lightning_fed.models.classifier import Classifier

__all__ = ["ResNet18GN", "ResNet9"]

_NORMS = ("group", "batch")


def _check(num_classes, lr, norm, num_groups) -> None:
    check_positive_int("num_classes", num_classes)
    check_positive("lr", lr)
    check_choice("norm", norm, _NORMS)
    if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 1 or 64 % num_groups:
        raise ArgumentError(f"`num_groups` must be an integer >= 1 dividing 64 (e.g. 1, 2, 4, ..., 64), got "
                            f"{num_groups!r}.")


def _norm_factory(norm: str, num_groups: int):
    """``channels -> norm module``; a ``partial`` (not a closure) so models stay picklable."""
    if norm == "batch":
        return nn.BatchNorm2d
    return functools.partial(nn.GroupNorm, num_groups)


class ResNet18GN(Classifier):
    """ResNet-18 with group norm and a CIFAR stem (Reddi et al. 2021's CIFAR-10/100 model).

    torchvision's ``resnet18(num_classes=...)`` with every ``BatchNorm2d`` replaced by
    ``GroupNorm(num_groups, C)`` and the ImageNet stem (7x7 conv, stride 2, then 3x3 max-pool) replaced
    by a 3x3 conv, stride 1, no max-pool. 11,173,962 parameters for 10 classes (torchvision's 11,181,642
    minus 7,680 for the smaller first convolution), 11,220,132 for 100.

    Args:
        num_classes: number of classes (10 for CIFAR-10, 100 for CIFAR-100).
        lr: client SGD learning rate (Reddi et al. tune it per task; see the example configs).
        num_groups: groups of every group norm (default 2; must divide 64).
        norm: ``"group"`` (default) or ``"batch"`` (torchvision's BatchNorm2d, for comparisons).

    Shapes:
        input ``x``: ``[B, 3, H, W]`` float (24x24 crops or full 32x32 images; any ``H, W >= 8``);
        labels ``y``: ``[B]`` long; :meth:`forward` returns logits ``[B, num_classes]``.

    Raises:
        ArgumentError (a ValueError): ``num_classes`` not an int ≥ 1, ``lr`` not finite and > 0, an unknown
            ``norm``, or ``num_groups`` not dividing 64.

    Example::

        >>> import torch
        >>> model = ResNet18GN()
        >>> model(torch.zeros(1, 3, 24, 24)).shape, sum(p.numel() for p in model.parameters())
        (torch.Size([1, 10]), 11173962)
        >>> ResNet18GN(num_groups=3)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `num_groups` must be an integer >= 1 dividing 64 (e.g. 1, 2, 4, ..., 64), got 3.
    """

    def __init__(self, num_classes: int = 10, lr: float = 0.1, num_groups: int = 2, norm: str = "group") -> None:
        super().__init__()
        _check(num_classes, lr, norm, num_groups)
        self.save_hyperparameters()
        from torchvision.models import resnet18

        net = resnet18(weights=None, num_classes=num_classes, norm_layer=_norm_factory(norm, num_groups))
        net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        net.maxpool = nn.Identity()
        self.net = net
        self.init_metrics(num_classes)


def _conv_norm(c_in: int, c_out: int, norm, pool: bool = False) -> nn.Sequential:
    layers = [nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False), norm(c_out), nn.ReLU(inplace=True)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class _Residual(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class ResNet9(Classifier):
    """The DAWNBench ResNet-9 (D. Page, "How to train your ResNet", 2018), group norm by default::

        prep:   conv(3, 64)                                     (conv = 3x3 conv, no bias, norm, ReLU)
        layer1: conv(64, 128) - maxpool2 + residual(conv(128, 128) - conv(128, 128))
        layer2: conv(128, 256) - maxpool2
        layer3: conv(256, 512) - maxpool2 + residual(conv(512, 512) - conv(512, 512))
        head:   global max-pool - flatten - Linear(512, num_classes, bias=False) - x0.125

    6,573,120 parameters for 10 classes (6,568,000 + 512 * num_classes).

    Args:
        num_classes: number of classes.
        lr: client SGD learning rate.
        num_groups: groups of every group norm (default 2; must divide 64).
        norm: ``"group"`` (default) or ``"batch"`` (the original DAWNBench model).

    Shapes:
        input ``[B, 3, H, W]`` (``H, W >= 8``, e.g. 24 or 32) -> logits ``[B, num_classes]``.

    Raises:
        ValueError: as :class:`ResNet18GN`.

    Example::

        >>> import torch
        >>> model = ResNet9()
        >>> model(torch.zeros(1, 3, 32, 32)).shape, sum(p.numel() for p in model.parameters())
        (torch.Size([1, 10]), 6573120)
    """

    def __init__(self, num_classes: int = 10, lr: float = 0.1, num_groups: int = 2, norm: str = "group") -> None:
        super().__init__()
        _check(num_classes, lr, norm, num_groups)
        self.save_hyperparameters()
        nl = _norm_factory(norm, num_groups)
        self.net = nn.Sequential(
            _conv_norm(3, 64, nl),
            _conv_norm(64, 128, nl, pool=True),
            _Residual(nn.Sequential(_conv_norm(128, 128, nl), _conv_norm(128, 128, nl))),
            _conv_norm(128, 256, nl, pool=True),
            _conv_norm(256, 512, nl, pool=True),
            _Residual(nn.Sequential(_conv_norm(512, 512, nl), _conv_norm(512, 512, nl))),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
            nn.Linear(512, num_classes, bias=False),
        )
        self.scale = 0.125
        self.init_metrics(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 3, H, W]`` images -> ``[B, num_classes]`` logits."""
        return self.net(x) * self.scale
