"""Fed-LAMB's MNIST MLP with a second head: the shape FedRoD trains (a generic and a personal head on one body).

Source
------
Chen, Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR 2022 (Fed-RoD):
a feature extractor f(·; θ) shared by a generic head h(·; ψ) and a personal head h(·; φ_i), the personalised
prediction adding the two heads' logits (:mod:`lightning_fed.algorithms.fedrod` has the method). The body and the
generic head are :class:`~lightning_fed.models.mnist.MNISTMLP`'s (Karimi, Li, Li, Fed-LAMB, Sec. 4), so a FedRoD run
starts from the MLP's initial weights. Nothing federated is in the model: ``lightning_fed.callbacks.FedRoD``
names its two heads (``generic_head="head"``, ``personal_head="personal_head"``, its defaults).
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_fed.models.mnist import MNISTMLP

__all__ = ["TwoHeadMLP"]


class TwoHeadMLP(MNISTMLP):
    """:class:`~lightning_fed.models.mnist.MNISTMLP` with a personal head beside its output layer (FedRoD's model,
    Chen & Chao, ICLR 2022)::

        body:           Flatten - Linear(in_features, hidden) - ReLU - Dropout(dropout)     -> z  [B, hidden]
        head:           Linear(hidden, num_classes)     (the generic head: the MLP's output layer)
        personal_head:  Linear(hidden, num_classes)     (all 0 at construction)
        forward(x) = head(z) + personal_head(z)

    Under one torch seed, ``body`` and ``head`` hold :class:`MNISTMLP`'s initial values (its ``net.1`` and ``net.4``)
    bit for bit, and the construction draws nothing more from torch's generator than :class:`MNISTMLP`'s (the
    personal head is made without initialisation, then set to 0): a model of the same seed, run beside the MLP's
    rows, starts from the same weights and leaves the generator in the same state. With the personal head at 0 the
    model predicts with the generic head alone, as FedRoD's global model does.

    With the defaults: 159,010 (the MLP) + 200·10 + 10 = **161,020** parameters.

    Args:
        in_features: flattened input size (784 = 1·28·28).
        hidden: hidden units, the feature size both heads read (200).
        dropout: dropout probability after the hidden layer, in [0, 1) (0.5, as :class:`MNISTMLP`).
        num_classes: number of classes (10).
        lr: client SGD learning rate.

    Shapes:
        input ``x``: ``[B, 1, 28, 28]`` (any ``[B, ...]`` with ``in_features`` elements per sample); labels ``y``:
        ``[B]`` long; output of :meth:`forward`: logits ``[B, num_classes]``.

    Raises:
        ValueError: as :class:`MNISTMLP` (a size not a positive integer, ``dropout`` outside [0, 1), ``lr`` not
            finite and > 0), naming the argument.

    Example::

        >>> import torch
        >>> from lightning_fed.algorithms import FedRoDClient
        >>> model = TwoHeadMLP(hidden=8)
        >>> model(torch.zeros(2, 1, 28, 28)).shape, sum(p.numel() for p in model.parameters())
        (torch.Size([2, 10]), 6460)
        >>> bool(model.personal_head.weight.eq(0).all())
        True
        >>> half = FedRoDClient(generic_head="head", personal_head="personal_head")
        >>> half.setup(model)
        >>> half.state_dim(0)  # the personal head, kept per client
        90
    """

    def __init__(
        self, in_features: int = 784, hidden: int = 200, dropout: float = 0.5, num_classes: int = 10, lr: float = 0.01
    ) -> None:
        super().__init__(in_features=in_features, hidden=hidden, dropout=dropout, num_classes=num_classes, lr=lr)
        net = self.net
        del self.net
        self.body = net[:4]
        self.head = net[4]
        # no draw from torch's generator: made without initialisation, then 0 (FedRoDClient checks the 0 start)
        self.personal_head = nn.utils.skip_init(nn.Linear, hidden, num_classes)
        with torch.no_grad():
            self.personal_head.weight.zero_()
            self.personal_head.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 1, 28, 28]`` images -> ``[B, num_classes]`` logits, ``head(z) + personal_head(z)``."""
        z = self.body(x)
        return self.head(z) + self.personal_head(z)
