"""Small image classifiers for the FedAWARE benchmarks: (Fashion-)MNIST and CIFAR-10.

Source
------
Zeng et al., "Tackling Hybrid Heterogeneity on Federated Optimization via Gradient
Diversity Maximization" (FedAWARE), ICML 2024, arXiv:2310.02702.

* Section 5 ("Experimental setup") only says "training a CNN network on the CIFAR-10
  dataset"; Appendix C.2 runs MNIST / FashionMNIST "using the same settings as CIFAR10
  experiments". **The paper never spells out the architecture** (no layer list, no
  parameter count).
* Appendix C.1 / Fig. 4 caption give the client optimiser: plain local SGD, learning rate
  ``eta_l = 0.01``, batch size 64, 3 local epochs -- hence ``lr=0.01`` and the plain
  :class:`torch.optim.SGD` (no momentum, no weight decay) below.

Because the paper is silent, :class:`FedAwareCNN` offers three architectures (``arch``):

``"fedavg"`` (default) -- the standard FedAvg / FedLab CNN (McMahan et al., AISTATS 2017;
    FedLab ``fedlab.models.cnn.CNN_MNIST``)::

        Conv(C, 32, 5) - ReLU - MaxPool(2) - Conv(32, 64, 5) - ReLU - MaxPool(2)
        - Flatten - Linear(F, 512) - ReLU - Linear(512, num_classes)

    with **padding 0** (this is what makes the flattened size F come out as in FedLab):
    1x28x28 -> 32x24x24 -> 32x12x12 -> 64x8x8 -> 64x4x4, F = 1024 (582,026 parameters);
    3x32x32 -> 32x28x28 -> 32x14x14 -> 64x10x10 -> 64x5x5, F = 1600 (878,538 parameters).
    Deviation from FedLab's ``CNN_MNIST``: FedLab omits the ReLU after each convolution;
    we keep it, as in McMahan et al.'s description ("5x5 convolution layers ... each
    followed with 2x2 max pooling ... ReLU"). McMahan et al. used "same" padding (F = 3136
    for 28x28); we follow FedLab's valid padding (F = 1024), as requested by the project.

``"toy"`` -- the CNN the FedAWARE authors' public code actually trains on CIFAR-10
    (``ToyCifarNet`` in ``model.py`` of github.com/dunzeng/FedAWARE, selected in
    ``settings.py`` for ``-dataset cifar10``), generalised to any ``in_channels`` /
    ``image_size``, with its weight initialisation (Kaiming-normal fan_out for convs,
    N(0, 0.01) for linear weights, zero biases)::

        Conv(C, 32, 3) - ReLU - MaxPool(2) - Conv(32, 64, 3) - ReLU - MaxPool(2)
        - Conv(64, 64, 3) - ReLU - Flatten - Linear(F, 64) - ReLU - Linear(64, num_classes)

    3x32x32 -> F = 64*4*4 = 1024 (122,570 parameters); 1x28x28 -> F = 64*3*3 = 576
    (93,322 parameters).

``"mlp"`` -- what that public code actually trains on MNIST *and* FashionMNIST
    (``fedlab.models.mlp.MLP(784, 10)``; a ``CNN_FEMNIST`` line is commented out):
    ``Flatten - Linear(C*H*W, 200) - ReLU - Linear(200, 200) - ReLU - Linear(200, classes)``
    (199,210 parameters for 1x28x28). Not a CNN, but needed to reproduce the appendix
    FMNIST curves exactly.

Nothing federated lives here: the module is the *client* model + client optimiser;
aggregation is done by the federated loop / server optimiser.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from lightning_fed.models.classifier import Classifier

__all__ = ["FedAwareCNN"]

_ARCHS = ("fedavg", "toy", "mlp")
_NORMS = (None, "batch")


def _conv_out(size: int, kernel: int) -> int:
    """Spatial size after a stride-1, padding-0 convolution."""
    return size - kernel + 1


def _build_fedavg(in_channels: int, image_size: int, num_classes: int, norm: Optional[str] = None) -> nn.Sequential:
    s = _conv_out(image_size, 5) // 2
    s = _conv_out(s, 5) // 2
    if s < 1:
        raise ValueError(f"arch='fedavg' needs image_size >= 16, got {image_size}")
    # norm="batch": a BatchNorm2d after each convolution (before its ReLU); BatchNorm's initialisation draws no
    # random numbers, so the convolutions and linear layers start from the same weights as without it
    bn = (lambda c: [nn.BatchNorm2d(c)]) if norm == "batch" else (lambda c: [])
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, kernel_size=5),
        *bn(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=5),
        *bn(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * s * s, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    )


def _build_toy(in_channels: int, image_size: int, num_classes: int) -> nn.Sequential:
    s = _conv_out(image_size, 3) // 2
    s = _conv_out(s, 3) // 2
    s = _conv_out(s, 3)
    if s < 1:
        raise ValueError(f"arch='toy' needs image_size >= 18, got {image_size}")
    net = nn.Sequential(
        nn.Conv2d(in_channels, 32, kernel_size=3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, kernel_size=3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * s * s, 64),
        nn.ReLU(),
        nn.Linear(64, num_classes),
    )
    # ToyCifarNet._initialize_weights from the FedAWARE code.
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
    return net


def _build_mlp(in_channels: int, image_size: int, num_classes: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_channels * image_size * image_size, 200),
        nn.ReLU(),
        nn.Linear(200, 200),
        nn.ReLU(),
        nn.Linear(200, num_classes),
    )


_BUILDERS = {"fedavg": _build_fedavg, "toy": _build_toy, "mlp": _build_mlp}


class FedAwareCNN(Classifier):
    """Client model for the FedAWARE image benchmarks (see the module docstring for sources).

    Args:
        in_channels: image channels ``C`` (1 for (Fashion-)MNIST, 3 for CIFAR-10).
        image_size: side ``H = W`` of the square input (28 for (F)MNIST, 32 for CIFAR-10).
        num_classes: number of classes (10 for all three data sets).
        lr: client SGD learning rate; 0.01 in FedAWARE App. C.1.
        arch: ``"fedavg"`` (default, FedAvg/FedLab CNN), ``"toy"`` (the authors' code's
            CIFAR-10 CNN) or ``"mlp"`` (the authors' code's (F)MNIST model).
        channels_last: keep the convolution weights and the input images in channels-last memory format
            (``torch.channels_last``). Default ``False``. On CPU, oneDNN's channels-last convolutions train the
            ``fedavg`` CNN about 1.2× faster (measured here at 1 thread, batch sizes 16–256). The results are the
            same up to float rounding, not bit for bit, because other convolution kernels run. It only adds a copy
            for ``"mlp"``.
        norm: ``None`` (default: no normalisation layers, the CNN above) or ``"batch"``: a ``BatchNorm2d`` after
            each convolution, before its ReLU (``arch="fedavg"`` only), for FedBN, which keeps the BatchNorm layers
            local; the layer indices then shift by two (the last linear layer is ``net.11``, not ``net.9``). The
            convolutions and linear layers start from the same weights as with ``norm=None`` (same seed).

    Shapes:
        input ``x``: ``[B, C, H, W]`` float; labels ``y``: ``[B]`` long in ``[0, num_classes)``;
        output of :meth:`forward`: logits ``[B, num_classes]``.

    Logging (all through ``self.log``, epoch means weighted by batch size):
        ``train_loss`` (per step), ``val_loss`` / ``val_acc`` and ``test_loss`` / ``test_acc``
        (per epoch); accuracies are torchmetrics ``MulticlassAccuracy(average="micro")``,
        i.e. correct / total over the whole evaluation epoch.

    Example::

        >>> import torch
        >>> FedAwareCNN()(torch.zeros(2, 1, 28, 28)).shape
        torch.Size([2, 10])
        >>> FedAwareCNN(in_channels=3, image_size=32, arch="toy")(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
        >>> FedAwareCNN(channels_last=True).net[0].weight.is_contiguous(memory_format=torch.channels_last)
        True
        >>> [type(m).__name__ for m in FedAwareCNN(norm="batch").net[:4]]
        ['Conv2d', 'BatchNorm2d', 'ReLU', 'MaxPool2d']
        >>> FedAwareCNN(arch="resnet")
        Traceback (most recent call last):
        ...
        ValueError: arch must be one of ('fedavg', 'toy', 'mlp'), got 'resnet'

    Raises:
        ValueError: an unknown ``arch``, ``lr`` ≤ 0, a ``channels_last`` that is not a bool, or a ``norm`` not in
            ``(None, "batch")`` (``"batch"`` with an ``arch`` other than ``"fedavg"``).
    """

    def __init__(
        self,
        in_channels: int = 1,
        image_size: int = 28,
        num_classes: int = 10,
        lr: float = 0.01,
        arch: str = "fedavg",
        channels_last: bool = False,
        norm: Optional[str] = None,
    ) -> None:
        super().__init__()
        if arch not in _BUILDERS:
            raise ValueError(f"arch must be one of {_ARCHS}, got {arch!r}")
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not isinstance(channels_last, bool):
            raise ValueError(f"channels_last must be True or False, got {channels_last!r}")
        if norm not in _NORMS:
            raise ValueError(f"norm must be one of {_NORMS}, got {norm!r}")
        if norm is not None and arch != "fedavg":
            raise ValueError(f"norm={norm!r} needs arch='fedavg', got arch={arch!r}")
        self.save_hyperparameters()
        if norm is None:  # the builders' calls as before norm existed
            self.net = _BUILDERS[arch](in_channels, image_size, num_classes)
        else:
            self.net = _build_fedavg(in_channels, image_size, num_classes, norm)
        self.channels_last = channels_last
        if channels_last:
            self.net.to(memory_format=torch.channels_last)  # 4-D weights only
        self.init_metrics(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` images -> ``[B, num_classes]`` logits."""
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)
