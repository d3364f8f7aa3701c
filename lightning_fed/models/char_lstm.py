"""The Shakespeare next-character LSTM of McMahan et al. (2017) / Reddi et al. (2021), as a LightningModule.

Source
------
Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (App. C: "For Shakespeare, we train an RNN for
next-character prediction"), implemented in TensorFlow Federated: ``create_recurrent_model`` of
``tensorflow_federated/python/research/optimization/shakespeare/models.py`` (which "replicates the model
structure in" McMahan et al., AISTATS 2017)::

    Embedding(vocab_size=90, 8, mask_zero=True)
    LSTM(256, return_sequences=True, kernel_initializer="he_normal")
    LSTM(256, return_sequences=True, kernel_initializer="he_normal")
    Dense(90)                                   # logits at every position

Shapes: input ``[B, 80]`` int64 token ids (see :mod:`lightning_fed.datamodules.tasks.shakespeare`: pad 0, characters
1..86, OOV 87, BOS 88, EOS 89) -> logits ``[B, 80, 90]``. 822,570 parameters with the defaults (Keras: 820,522;
PyTorch's LSTM has two bias vectors per layer, ``bias_ih`` and ``bias_hh``, Keras one).

Initialisation (``keras_init=True``, default) copies Keras' defaults for those layers, so that training from
scratch starts where the reference did: embedding U(-0.05, 0.05); LSTM input kernels He-normal (truncated
normal, std sqrt(2 / fan_in) / 0.8796), recurrent kernels orthogonal, biases zero except the forget gate's
(Keras ``unit_forget_bias=True``: 1, put on ``bias_ih``); output layer Glorot-uniform, bias zero. PyTorch and
Keras share the gate order (i, f, g/c, o) and the sigmoid recurrent activation.

Loss and metrics
----------------
* Loss: mean cross-entropy over the target tokens that are not pad (``ignore_index=0``). Keras masks by the
  *input* (``mask_zero``), which also scores the one "predict pad after EOS" position per snippet; masking the
  targets is the cleaner choice and differs only there.
* Accuracy: Reddi et al.'s code (``federated_shakespeare.py`` / ``centralized_shakespeare.py``) and TFF's
  ``char_prediction_tasks`` use ``MaskedCategoricalAccuracy(masked_tokens=[pad_token])``: every non-pad target
  counts, *including* OOV and EOS (BOS is never a target). That is the default here
  (``accuracy_masked_tokens=(0,)``). Pass ``accuracy_masked_tokens=(0, 87, 88, 89)`` to also exclude the
  OOV/BOS/EOS targets (TFF's Stack Overflow next-word metric style); on Shakespeare the two differ by ~0.1-0.3
  percentage points (EOS is ~1/140 of the targets).
* Logged: ``train_loss`` (per step); ``val_loss``/``val_acc`` and ``test_loss``/``test_acc`` (epoch values,
  token-weighted over the whole evaluation set, through torchmetrics).

``configure_optimizers`` returns plain ``torch.optim.SGD`` -- the client optimizer ClientOpt of FedOpt.
Nothing federated lives here.
"""

from __future__ import annotations

import math
from typing import Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric, Metric

from lightning_fed.checks import check_positive, check_positive_int, check_unit_interval

__all__ = ["ShakespeareLSTM", "MaskedTokenAccuracy", "masked_token_loss"]

PAD_ID = 0  # == lightning_fed.datamodules.tasks.shakespeare.PAD_ID (kept local: models do not import data modules)


def masked_token_loss(
    logits: torch.Tensor, target: torch.Tensor, pad_id: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy over the non-pad targets, and their count.

    Args:
        logits: ``[B, T, V]`` float; target: ``[B, T]`` int64.

    Returns:
        ``(loss, n_tokens)``: the scalar mean (0 with a gradient if no token counts) and the int64 token count.

    Example: uniform logits over V = 4 tokens cost ln 4 per counted token; the pad target (0) is skipped::

        >>> import torch
        >>> loss, n = masked_token_loss(torch.zeros(1, 3, 4), torch.tensor([[2, 3, 0]]))
        >>> round(loss.item(), 4), n.item()  # ln 4 = 1.3863
        (1.3863, 2)
    """
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=pad_id,
                            reduction="sum")
    n = (target != pad_id).sum()
    return total / n.clamp(min=1).to(total.dtype), n


class MaskedTokenAccuracy(Metric):
    """Token accuracy ignoring targets in ``masked_tokens`` (TFF's ``MaskedCategoricalAccuracy``).

    ``update(logits [B, T, V] or preds [B, T], target [B, T])``; ``compute()`` = correct / counted tokens over
    everything seen since the last reset (0 if nothing counted).

    Example: 1 of the 2 non-pad targets is predicted::

        >>> import torch
        >>> metric = MaskedTokenAccuracy(masked_tokens=(0,))
        >>> metric.update(torch.tensor([[5, 2, 7]]), torch.tensor([[5, 3, 0]]))
        >>> metric.compute()
        tensor(0.5000)
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, masked_tokens: Sequence[int] = (PAD_ID,), **kwargs) -> None:
        super().__init__(**kwargs)
        self.masked_tokens = tuple(int(t) for t in masked_tokens)
        self.add_state("correct", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if preds.ndim == target.ndim + 1:
            preds = preds.argmax(dim=-1)
        mask = torch.ones_like(target, dtype=torch.bool)
        for t in self.masked_tokens:
            mask &= target != t
        self.correct += ((preds == target) & mask).sum()
        self.total += mask.sum()

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total.clamp(min=1).float()


class NextTokenModel(L.LightningModule):
    """Training and evaluation shared by the next-token language models (Shakespeare, Stack Overflow NWP).

    ``training_step`` returns :func:`masked_token_loss` (pad targets ignored) and logs ``train_loss``;
    ``validation_step``/``test_step`` log the token-weighted ``{stage}_loss`` and ``{stage}_acc``
    (:class:`MaskedTokenAccuracy`); ``configure_optimizers`` is the client's plain SGD
    (``lr=hparams.lr``, ``momentum=hparams.momentum``). Subclasses define ``forward`` and call :meth:`init_metrics`.

    Example (through :class:`ShakespeareLSTM`)::

        >>> model = ShakespeareLSTM(lr=0.5, momentum=0.9)
        >>> optimizer = model.configure_optimizers()
        >>> type(optimizer).__name__, optimizer.defaults["lr"], optimizer.defaults["momentum"]
        ('SGD', 0.5, 0.9)
        >>> model.val_acc.masked_tokens  # the pad id is not counted by val_acc
        (0,)
    """

    def init_metrics(self, masked_tokens: Sequence[int]) -> None:
        """Create the evaluation metrics; ``masked_tokens`` are target ids the accuracy does not count."""
        masked = tuple(int(t) for t in masked_tokens)
        self.val_acc = MaskedTokenAccuracy(masked)
        self.test_acc = MaskedTokenAccuracy(masked)
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss, _ = masked_token_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True, batch_size=y.shape[0])
        return loss

    def _eval_step(self, batch, stage: str) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss, n = masked_token_loss(logits, y)
        loss_metric = getattr(self, f"{stage}_loss")
        acc_metric = getattr(self, f"{stage}_acc")
        loss_metric.update(loss.detach(), weight=n.to(loss.dtype))
        acc_metric.update(logits.detach(), y)
        self.log(f"{stage}_loss", loss_metric, on_step=False, on_epoch=True, prog_bar=True, batch_size=y.shape[0])
        self.log(f"{stage}_acc", acc_metric, on_step=False, on_epoch=True, prog_bar=True, batch_size=y.shape[0])
        return loss

    def validation_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain SGD (ClientOpt): ``SGD(params, lr=hparams.lr, momentum=hparams.momentum)``."""
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


class ShakespeareLSTM(NextTokenModel):
    """Embedding(90, 8) -> 2-layer LSTM(256) -> Linear(256, 90), next-character logits at every position.

    Args:
        vocab_size: token ids (default 90 = pad + 86 characters + OOV + BOS + EOS).
        embedding_dim: embedding width (default 8).
        hidden_size: LSTM units per layer (default 256).
        num_layers: stacked LSTM layers (default 2).
        lr: client learning rate of SGD (default 1.0; Reddi et al. tune it on a grid, App. D).
        momentum: SGD momentum (default 0.0).
        accuracy_masked_tokens: target ids not counted by ``val_acc``/``test_acc`` (default ``(0,)``: pad only,
            as Reddi et al.'s code; see the module doc).
        keras_init: initialise as the Keras reference (default ``True``); ``False`` keeps PyTorch's defaults.

    Shapes:
        ``forward(x)``: ``x`` int64 ``[B, 80]`` -> logits float ``[B, 80, vocab_size]``.
        Batches are ``(input [B, 80], target [B, 80])`` (``ShakespeareSequences`` items, collated).

    Example::

        >>> import torch
        >>> model = ShakespeareLSTM()
        >>> model(torch.zeros(2, 80, dtype=torch.long)).shape
        torch.Size([2, 80, 90])
        >>> sum(p.numel() for p in model.parameters())
        822570
    """

    def __init__(
        self,
        vocab_size: int = 90,
        embedding_dim: int = 8,
        hidden_size: int = 256,
        num_layers: int = 2,
        lr: float = 1.0,
        momentum: float = 0.0,
        accuracy_masked_tokens: Sequence[int] = (PAD_ID,),
        keras_init: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("embedding_dim", embedding_dim),
                            ("hidden_size", hidden_size), ("num_layers", num_layers)):
            check_positive_int(name, value)
        check_positive("lr", lr)
        check_unit_interval("momentum", momentum)
        self.save_hyperparameters()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)
        if keras_init:
            self.reset_parameters_keras()
        self.init_metrics(accuracy_masked_tokens)

    @torch.no_grad()
    def reset_parameters_keras(self) -> None:
        """Keras-default initialisation of the reference model (see the module doc)."""
        nn.init.uniform_(self.embedding.weight, -0.05, 0.05)
        h = self.hparams.hidden_size
        for layer in range(self.hparams.num_layers):
            w_ih = getattr(self.lstm, f"weight_ih_l{layer}")  # [4H, in]
            w_hh = getattr(self.lstm, f"weight_hh_l{layer}")  # [4H, H]
            std = math.sqrt(2.0 / w_ih.shape[1]) / 0.87962566103423978
            nn.init.trunc_normal_(w_ih, mean=0.0, std=std, a=-2 * std, b=2 * std)
            nn.init.orthogonal_(w_hh)
            b_ih = getattr(self.lstm, f"bias_ih_l{layer}")
            b_hh = getattr(self.lstm, f"bias_hh_l{layer}")
            b_ih.zero_()
            b_hh.zero_()
            b_ih[h:2 * h] = 1.0  # forget gate
        nn.init.xavier_uniform_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, vocab_size]`` for int64 token ids ``x`` ``[B, T]`` (T = 80 in the task)."""
        out, _ = self.lstm(self.embedding(x))
        return self.head(out)
