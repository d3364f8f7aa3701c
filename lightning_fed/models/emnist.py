"""The EMNIST models of Reddi et al., "Adaptive Federated Optimization", ICLR 2021.

Source
------
Reddi et al. (Sec. 5): "For EMNIST, we train a CNN for character recognition (EMNIST CR) and a bottleneck
autoencoder (EMNIST AE)"; the architectures are those of their open-source TFF implementation
(github.com/google-research/federated, ``optimization/``), which the paper links:

* :class:`EMNISTCNN` -- TFF's ``create_conv_dropout_model(only_digits=False)``::

      Conv(1, 32, 3) - ReLU - Conv(32, 64, 3) - ReLU - MaxPool(2) - Dropout(0.25)
      - Flatten - Linear(9216, 128) - ReLU - Dropout(0.5) - Linear(128, 62)

  valid padding: 1x28x28 -> 32x26x26 -> 64x24x24 -> 64x12x12 = 9216 features; 1,206,590 parameters
  (320 + 18,496 + 1,179,776 + 7,998). Keras' final softmax is folded into the cross-entropy loss here.

* :class:`EMNISTAutoencoder` -- TFF's ``create_autoencoder_model()``, the deep bottleneck autoencoder of
  Hinton & Salakhutdinov (Science 2006) as used by Zaheer et al. (NeurIPS 2018)::

      784 -1000 -500 -250 -30 -250 -500 -1000 -784

  every layer sigmoid except the linear 30-unit code layer; 2,837,314 parameters. Loss: mean squared error
  over the 784 pixels (Keras ``MeanSquaredError``). Reddi et al.'s Table 1 reports MSE x 1000, logged here as
  ``val_mse_x1000`` / ``test_mse_x1000`` alongside ``val_loss`` (the plain MSE).

Initialisation: PyTorch's defaults (Keras uses Glorot-uniform weights and zero biases; not reproduced).
Client optimiser: plain SGD (Reddi et al.: ClientOpt = SGD with learning rate ``eta_l``).
"""

from __future__ import annotations


import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from lightning_fed.checks import check_int, check_positive
from lightning_fed.models.classifier import Classifier

__all__ = ["EMNISTCNN", "EMNISTAutoencoder"]


class EMNISTCNN(Classifier):
    """Reddi et al.'s EMNIST CR model (TFF ``create_conv_dropout_model``; see the module docstring).

    Args:
        num_classes: output classes (62 for EMNIST-62 / FEMNIST, 10 for digits only).
        lr: client SGD learning rate ``eta_l`` (default 10^-1.5 ~ 0.0316, a value of Reddi et al.'s grid).

    Shapes:
        input ``x``: float ``[B, 1, 28, 28]``; labels ``y``: int64 ``[B]``; :meth:`forward` -> logits
        ``[B, num_classes]``.

    Logging: ``train_loss`` (per step), ``val_loss``/``val_acc``, ``test_loss``/``test_acc`` (per epoch,
    sample-weighted; accuracy = correct / total).

    Raises:
        ValueError: ``num_classes`` not an integer ≥ 2, or ``lr`` not a positive number.

    Example::

        >>> import torch
        >>> EMNISTCNN()(torch.zeros(2, 1, 28, 28)).shape
        torch.Size([2, 62])
        >>> EMNISTCNN(num_classes=1)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `num_classes` must be an integer >= 2, got 1.
    """

    def __init__(self, num_classes: int = 62, lr: float = 10 ** -1.5) -> None:
        super().__init__()
        check_int("num_classes", num_classes, 2)
        check_positive("lr", lr)
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
            nn.Linear(64 * 12 * 12, 128),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(128, num_classes),
        )
        self.init_metrics(num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 1, 28, 28]`` images -> ``[B, num_classes]`` logits."""
        return self.net(x)


class EMNISTAutoencoder(L.LightningModule):
    """Reddi et al.'s EMNIST AE model (TFF ``create_autoencoder_model``; see the module docstring).

    Args:
        lr: client SGD learning rate ``eta_l`` (default 1.0, a value of Reddi et al.'s grid).

    Shapes:
        input ``x``: float ``[B, 784]`` (or ``[B, 1, 28, 28]``, flattened) in [0, 1]; target: the same
        ``[B, 784]``; :meth:`forward` -> reconstruction ``[B, 784]`` in (0, 1).

    Logging: ``train_loss`` (per step, MSE), ``val_loss``/``val_mse_x1000`` and ``test_loss``/
    ``test_mse_x1000`` (per epoch, sample-weighted mean of the per-sample MSE; ``x1000`` is Table 1's unit).

    Raises:
        ValueError: ``lr`` not a positive number.

    Example: the reconstruction is a sigmoid output, shaped like the flattened input::

        >>> import torch
        >>> out = EMNISTAutoencoder()(torch.zeros(2, 1, 28, 28))
        >>> out.shape, bool(((out > 0) & (out < 1)).all())
        (torch.Size([2, 784]), True)
    """

    #: Layer widths, input to output.
    WIDTHS = (784, 1000, 500, 250, 30, 250, 500, 1000, 784)
    #: Index (into the 8 linear layers) of the code layer, which has no activation.
    CODE_LAYER = 3

    def __init__(self, lr: float = 1.0) -> None:
        super().__init__()
        check_positive("lr", lr)
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(self.WIDTHS[:-1], self.WIDTHS[1:])):
            layers.append(nn.Linear(n_in, n_out))
            if i != self.CODE_LAYER:
                layers.append(nn.Sigmoid())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, 784]`` (or ``[B, 1, 28, 28]``) pixels -> ``[B, 784]`` reconstruction."""
        return self.net(x.reshape(x.shape[0], -1))

    def _loss(self, batch) -> tuple[torch.Tensor, int]:
        x, target = batch
        recon = self(x)
        return F.mse_loss(recon, target.reshape(recon.shape)), int(x.shape[0])

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss, n = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=n)
        return loss

    def _eval_step(self, batch, stage: str) -> torch.Tensor:
        loss, n = self._loss(batch)
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=n)
        self.log(f"{stage}_mse_x1000", loss * 1000.0, on_step=False, on_epoch=True, batch_size=n)
        return loss

    def validation_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain client SGD with ``lr`` (no momentum, no weight decay)."""
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
