"""The Stack Overflow models of Reddi et al. (2021) as LightningModules: next-word LSTM (SO NWP) and tag logistic
regression (SO LR).

Source
------
Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (Sec. 5, App. C), implemented in TensorFlow Federated
(``optimization/stackoverflow/models.py::create_recurrent_model`` and ``optimization/stackoverflow_lr/models.py::
create_logistic_model``)::

    SO NWP: Embedding(V + 4, 96, mask_zero=True) -> LSTM(670, return_sequences=True) -> Dense(96) -> Dense(V + 4)
    SO LR:  Dense(500, activation="sigmoid") on the 10,000-word bag of words, binary cross-entropy

with V = 10,000 words (+ pad, OOV, BOS, EOS). Data: :mod:`lightning_fed.datamodules.tasks.stackoverflow`.

Metrics
-------
* NWP accuracy: Reddi et al. report accuracy with pad, OOV, BOS and EOS targets excluded
  (``MaskedCategoricalAccuracy(masked_tokens=[pad, oov, bos, eos])``); that is ``val_acc``/``test_acc`` here.
  The loss is the mean cross-entropy over the non-pad targets. (Keras masks by the *input* via ``mask_zero``,
  which also scores the one position whose input is EOS and whose target is pad; we do not.)
* LR recall@5: Keras ``tf.keras.metrics.Recall(top_k=5)``: per example the 5 highest-scoring tags count as
  predicted positives; recall = sum of true positives / sum of true tags, *micro*-averaged over every
  (example, tag) seen since the last reset (examples without any in-vocabulary tag add nothing).
  :class:`RecallAtK` implements exactly that (tested against a hand-computed value). torchmetrics' multilabel
  ``MultilabelRecall`` cannot express it: it thresholds the scores (0.5) instead of taking each row's top 5, and
  (torchmetrics 1.9) accepts no ``top_k`` for multilabel inputs; its default ``average="macro"`` (per-tag recall
  averaged over tags) differs from Keras' micro recall as well.

Initialisation uses PyTorch's defaults (not Keras'). ``configure_optimizers`` returns plain SGD (ClientOpt).
"""

from __future__ import annotations


import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric, Metric

from lightning_fed.checks import check_positive, check_positive_int as _check_pos_int, check_unit_interval
from lightning_fed.models.char_lstm import NextTokenModel

__all__ = ["StackOverflowNWP", "StackOverflowTagLR", "RecallAtK"]


def _check_sgd(lr, momentum) -> None:
    check_positive("lr", lr)
    check_unit_interval("momentum", momentum)


class RecallAtK(Metric):
    """Micro recall@k for multi-label targets (Keras ``Recall(top_k=k)``).

    ``update(scores [B, K], target [B, K] in {0, 1})``; ``compute()`` = true positives among each row's top-``k``
    scores / number of positive targets, over everything seen since the last reset (0 if no positives).

    Example: the top 2 scores pick tags 0 and 2; of the positives {0, 1} one is found::

        >>> import torch
        >>> metric = RecallAtK(k=2)
        >>> metric.update(torch.tensor([[0.9, 0.1, 0.8, 0.2]]), torch.tensor([[1, 1, 0, 0]]))
        >>> metric.compute()
        tensor(0.5000)
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, k: int = 5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = _check_pos_int("k", k)
        self.add_state("tp", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("pos", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        k = min(self.k, scores.shape[-1])
        top = scores.topk(k, dim=-1).indices
        positive = target > 0.5
        self.tp += positive.gather(-1, top).sum()
        self.pos += positive.sum()

    def compute(self) -> torch.Tensor:
        return self.tp.float() / self.pos.clamp(min=1).float()


class StackOverflowNWP(NextTokenModel):
    """Embedding(V+4, 96) -> LSTM(670) -> Linear(670, 96) -> Linear(96, V+4): next-word logits at every position.

    Args:
        vocab_size: number of words V (default 10,000); token ids are ``V + 4`` (pad 0, words, OOV V+1, BOS V+2,
            EOS V+3).
        embedding_dim: embedding / projection width (default 96).
        hidden_size: LSTM units (default 670).
        lr: client SGD learning rate (default 1.0; Reddi et al. tune it, App. D).
        momentum: client SGD momentum (default 0).

    Shapes:
        ``forward(x)``: int64 ``[B, T]`` -> float ``[B, T, V + 4]``. Batches are ``(input [B, 20], target [B, 20])``.

    Raises:
        ValueError: a size not a positive integer, ``lr`` ≤ 0, or ``momentum`` outside [0, 1).

    Example::

        >>> import torch
        >>> model = StackOverflowNWP()
        >>> model(torch.zeros(2, 20, dtype=torch.long)).shape  # V + 4 = 10,004 token ids
        torch.Size([2, 20, 10004])
        >>> sum(p.numel() for p in model.parameters())
        4053428
    """

    def __init__(self, vocab_size: int = 10000, embedding_dim: int = 96, hidden_size: int = 670, lr: float = 1.0,
                 momentum: float = 0.0) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("embedding_dim", embedding_dim),
                            ("hidden_size", hidden_size)):
            _check_pos_int(name, value)
        _check_sgd(lr, momentum)
        self.save_hyperparameters()
        n = vocab_size + 4
        self.embedding = nn.Embedding(n, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, batch_first=True)
        self.projection = nn.Linear(hidden_size, embedding_dim)
        self.head = nn.Linear(embedding_dim, n)
        self.special_ids = (0, vocab_size + 1, vocab_size + 2, vocab_size + 3)
        self.init_metrics(self.special_ids)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embedding(x))
        return self.head(self.projection(out))


class StackOverflowTagLR(L.LightningModule):
    """Multi-label logistic regression: Linear(10,000, 500) with a sigmoid per tag, binary cross-entropy.

    Args:
        vocab_size: bag-of-words width (default 10,000).
        num_tags: tags (default 500).
        lr: client SGD learning rate (default 1.0; Reddi et al. tune it, App. D).
        momentum: client SGD momentum (default 0).
        k: ``k`` of the recall@k metric (default 5).

    Shapes:
        ``forward(x)``: float ``[B, vocab_size]`` -> logits ``[B, num_tags]`` (apply ``sigmoid`` for
        probabilities). Batches are ``(x [B, vocab_size], y [B, num_tags] multi-hot)``.

    Logged: ``train_loss``; ``val_loss``/``val_recall_at_5`` and ``test_loss``/``test_recall_at_5`` (named by ``k``).

    Raises:
        ValueError: a size not a positive integer, ``lr`` ≤ 0, or ``momentum`` outside [0, 1).

    Example::

        >>> import torch
        >>> model = StackOverflowTagLR()
        >>> model(torch.zeros(2, 10000)).shape, sum(p.numel() for p in model.parameters())  # 10,000·500 + 500
        (torch.Size([2, 500]), 5000500)
        >>> StackOverflowTagLR(momentum=1.0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `momentum` must be a number in [0, 1), got 1.0.
    """

    def __init__(self, vocab_size: int = 10000, num_tags: int = 500, lr: float = 1.0, momentum: float = 0.0,
                 k: int = 5) -> None:
        super().__init__()
        _check_pos_int("vocab_size", vocab_size)
        _check_pos_int("num_tags", num_tags)
        _check_pos_int("k", k)
        _check_sgd(lr, momentum)
        self.save_hyperparameters()
        self.linear = nn.Linear(vocab_size, num_tags)
        self.val_recall = RecallAtK(k)
        self.test_recall = RecallAtK(k)
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.binary_cross_entropy_with_logits(self(x), y)
        self.log("train_loss", loss, prog_bar=True, batch_size=y.shape[0])
        return loss

    def _eval_step(self, batch, stage: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = F.binary_cross_entropy_with_logits(logits, y)
        getattr(self, f"{stage}_loss").update(loss.detach(), weight=y.shape[0])
        getattr(self, f"{stage}_recall").update(logits.detach(), y)
        self.log(f"{stage}_loss", getattr(self, f"{stage}_loss"), on_step=False, on_epoch=True, prog_bar=True,
                 batch_size=y.shape[0])
        self.log(f"{stage}_recall_at_{self.hparams.k}", getattr(self, f"{stage}_recall"), on_step=False,
                 on_epoch=True, prog_bar=True, batch_size=y.shape[0])
        return loss

    def validation_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain SGD (ClientOpt): ``SGD(params, lr=hparams.lr, momentum=hparams.momentum)``."""
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)
