"""The training/evaluation body shared by the papers' classifiers (nothing federated in it)."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics.classification import MulticlassAccuracy


class Classifier(L.LightningModule):
    """A LightningModule around ``self.net`` (inputs → ``[B, num_classes]`` logits) with cross-entropy, torchmetrics
    accuracy and plain client SGD.

    Logs ``train_loss`` per step and ``val_loss``/``val_acc`` (``test_loss``/``test_acc``) per epoch, weighted by
    batch size (micro accuracy over all samples). Subclasses build ``self.net`` and call :meth:`init_metrics`;
    ``configure_optimizers`` returns ``torch.optim.SGD(lr=self.hparams.lr)``, the client optimizer.

    Example: a linear classifier on 4 features::

        >>> import torch
        >>> from torch import nn
        >>> class LinearClassifier(Classifier):
        ...     def __init__(self, lr: float = 0.1) -> None:
        ...         super().__init__()
        ...         self.save_hyperparameters()
        ...         self.net = nn.Linear(4, 3)
        ...         self.init_metrics(num_classes=3)
        >>> model = LinearClassifier()
        >>> model(torch.zeros(2, 4)).shape
        torch.Size([2, 3])
        >>> optimizer = model.configure_optimizers()
        >>> type(optimizer).__name__, optimizer.defaults["lr"], optimizer.defaults["momentum"]
        ('SGD', 0.1, 0)
    """

    def init_metrics(self, num_classes: int) -> None:
        """Create the validation and test accuracy metrics for ``num_classes`` classes."""
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True, batch_size=y.shape[0])
        return loss

    def _eval_step(self, batch, stage: str, metric: MulticlassAccuracy) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        metric(logits, y)
        n = y.shape[0]
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, prog_bar=True, batch_size=n)
        self.log(f"{stage}_acc", metric, on_step=False, on_epoch=True, prog_bar=True, batch_size=n)
        return loss

    def validation_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "val", self.val_acc)

    def test_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "test", self.test_acc)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain client SGD with ``lr`` (no momentum, no weight decay)."""
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
