"""The MNIST models of Fed-LAMB: a one-hidden-layer MLP and the classic two-convolution CNN.

Source
------
Karimi, Li, Li, "Layerwise and Dimensionwise Locally Adaptive Optimization" (Fed-LAMB), Sec. 4,
"Models": "For MNIST, we apply 1) a simple multilayer perceptron (MLP), which has one hidden layer
containing 200 cells with dropout; 2) Convolutional Neural Network (CNN), which has two max-pooled
convolutional layers followed by a dropout layer and two fully-connected layers with 320 and 50
cells respectively."

The paper gives neither the dropout rate nor the convolution sizes; see each class for our reading.
Both models take ``[B, 1, 28, 28]`` images and return ``[B, 10]`` logits; training, logging and the
plain client SGD come from :class:`~lightning_fed.models.classifier.Classifier` (Fed-LAMB's callback
replaces that SGD by its layerwise client AMSGrad at fit start).
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_fed.checks import check_positive, check_unit_interval
from lightning_fed.checks import check_positive_int as _check_positive_int
from lightning_fed.models.classifier import Classifier

__all__ = ["MNISTCNN", "MNISTMLP"]


class MNISTMLP(Classifier):
    """Fed-LAMB's MNIST MLP: one hidden layer of 200 units with dropout (Sec. 4, "Models")::

        Flatten - Linear(in_features, hidden) - ReLU - Dropout(dropout) - Linear(hidden, num_classes)

    With the defaults: 784·200 + 200 + 200·10 + 10 = **159,010** parameters.

    Args:
        in_features: flattened input size (784 = 1·28·28 for MNIST).
        hidden: hidden units (200 in the paper).
        dropout: dropout probability after the hidden layer, in [0, 1). The paper says "with
            dropout" but does not give the rate; 0.5 is our choice.
        num_classes: number of classes (10 digits).
        lr: client SGD learning rate (Fed-LAMB's callback may override it with its ``client_lr``).

    Shapes:
        input ``x``: ``[B, 1, 28, 28]`` (any ``[B, ...]`` with ``in_features`` elements per sample);
        labels ``y``: ``[B]`` long; output of :meth:`forward`: logits ``[B, num_classes]``.

    Raises:
        ValueError: a size not a positive integer, ``dropout`` outside [0, 1), or ``lr`` not finite and > 0.

    Example::

        >>> import torch
        >>> model = MNISTMLP()
        >>> model(torch.zeros(2, 1, 28, 28)).shape, sum(p.numel() for p in model.parameters())
        (torch.Size([2, 10]), 159010)
        >>> MNISTMLP(dropout=1.0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `dropout` must be a number in [0, 1), got 1.0.
    """

    def __init__(
        self, in_features: int = 784, hidden: int = 200, dropout: float = 0.5, num_classes: int = 10, lr: float = 0.01
    ) -> None:
        super().__init__()
        _check_positive_int("in_features", in_features)
        _check_positive_int("hidden", hidden)
        _check_positive_int("num_classes", num_classes)
        check_unit_interval("dropout", dropout)
        check_positive("lr", lr)
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        self.init_metrics(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 1, 28, 28]`` images -> ``[B, num_classes]`` logits."""
        return self.net(x)


class MNISTCNN(Classifier):
    """Fed-LAMB's MNIST CNN: two max-pooled convolutions, dropout, then fully-connected layers of 320 and
    50 cells (Sec. 4, "Models").

    That description is the classic PyTorch MNIST example network (``pytorch/examples``, ``mnist``, the
    version with ``conv2_drop``), whose flattened convolution output has exactly 320 = 20·4·4 cells
    followed by a 50-unit hidden layer; we build it::

        Conv(C, 10, 5) - MaxPool(2) - ReLU              1x28x28 -> 10x24x24 -> 10x12x12
        - Conv(10, 20, 5) - Dropout2d(p) - MaxPool(2) - ReLU   -> 20x8x8 -> 20x4x4
        - Flatten (320) - Linear(320, 50) - ReLU - Dropout(p) - Linear(50, num_classes)

    With the defaults: (1·25·10 + 10) + (10·25·20 + 20) + (320·50 + 50) + (50·10 + 10)
    = 260 + 5,020 + 16,050 + 510 = **21,840** parameters.

    Args:
        in_channels: image channels (1 for MNIST); inputs must be 28x28.
        num_classes: number of classes (10 digits).
        dropout: probability of both dropouts (channel-wise ``Dropout2d`` after the second convolution
            and ``Dropout`` after the 50-unit layer), in [0, 1). Not given in the paper; 0.5 is the
            PyTorch example's (``F.dropout``'s default) rate.
        lr: client SGD learning rate (Fed-LAMB's callback may override it with its ``client_lr``).

    Shapes:
        input ``x``: ``[B, in_channels, 28, 28]``; labels ``y``: ``[B]`` long;
        output of :meth:`forward`: logits ``[B, num_classes]``.

    Raises:
        ValueError: a size not a positive integer, ``dropout`` outside [0, 1), or ``lr`` not finite and > 0.

    Example::

        >>> import torch
        >>> model = MNISTCNN()
        >>> model(torch.zeros(2, 1, 28, 28)).shape, sum(p.numel() for p in model.parameters())
        (torch.Size([2, 10]), 21840)
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, dropout: float = 0.5, lr: float = 0.01) -> None:
        super().__init__()
        _check_positive_int("in_channels", in_channels)
        _check_positive_int("num_classes", num_classes)
        check_unit_interval("dropout", dropout)
        check_positive("lr", lr)
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 10, kernel_size=5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(10, 20, kernel_size=5),
            nn.Dropout2d(dropout),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(320, 50),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(50, num_classes),
        )
        self.init_metrics(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, in_channels, 28, 28]`` images -> ``[B, num_classes]`` logits."""
        return self.net(x)
