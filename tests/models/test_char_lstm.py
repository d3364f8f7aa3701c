"""ShakespeareLSTM: shapes, the pad-ignoring loss, the masked accuracy, Keras-style init, Lightning logging."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_fed.models.char_lstm import MaskedTokenAccuracy, ShakespeareLSTM, masked_token_loss


def test_forward_shapes_and_hparams():
    model = ShakespeareLSTM()
    x = torch.randint(0, 90, (3, 80))
    logits = model(x)
    assert logits.shape == (3, 80, 90) and logits.dtype == torch.float32
    assert model.embedding.weight.shape == (90, 8)
    assert model.lstm.num_layers == 2 and model.lstm.hidden_size == 256
    assert model.head.in_features == 256 and model.head.out_features == 90
    assert sum(p.numel() for p in model.parameters()) == 822_570
    assert model.hparams.lr == 1.0 and model.hparams.momentum == 0.0
    opt = ShakespeareLSTM(lr=0.5, momentum=0.9).configure_optimizers()
    assert type(opt) is torch.optim.SGD
    assert opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[0]["momentum"] == 0.9
    with pytest.raises(ValueError, match="hidden_size"):
        ShakespeareLSTM(hidden_size=0)
    with pytest.raises(ValueError, match="lr"):
        ShakespeareLSTM(lr=0.0)


def test_ids_match_datamodule():
    from lightning_fed.datamodules.tasks import shakespeare as shk
    from lightning_fed.models import char_lstm

    assert char_lstm.PAD_ID == shk.PAD_ID and ShakespeareLSTM().hparams.vocab_size == shk.VOCAB_SIZE


def test_loss_ignores_pad_hand_check():
    # 1 sequence, 3 positions, 2 classes; the last target is pad (0)
    logits = torch.tensor([[[0.0, 1.0], [2.0, 0.0], [5.0, -5.0]]], requires_grad=True)
    target = torch.tensor([[1, 0, 0]])
    # only position 0 counts (targets 0 = pad at positions 1, 2): CE = log(1 + e^-1)
    loss, n = masked_token_loss(logits, target)
    assert n.item() == 1
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1.0)), rel=1e-6)
    loss.backward()
    assert torch.all(logits.grad[0, 1:] == 0)  # pad positions get no gradient
    # two counted tokens: mean of their CEs
    logits2 = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [9.0, 0.0, 0.0]]])
    target2 = torch.tensor([[1, 2, 0]])
    ce = [F.cross_entropy(logits2[0, i:i + 1], target2[0, i:i + 1]).item() for i in (0, 1)]
    assert masked_token_loss(logits2, target2)[0].item() == pytest.approx(sum(ce) / 2, rel=1e-6)
    # no counted token: 0, not NaN
    loss0, n0 = masked_token_loss(logits2, torch.zeros(1, 3, dtype=torch.long))
    assert n0.item() == 0 and loss0.item() == 0.0


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")
def test_training_step_loss_matches_manual():
    torch.manual_seed(0)
    model = ShakespeareLSTM(hidden_size=16)
    x = torch.randint(1, 90, (2, 80))
    y = torch.randint(1, 90, (2, 80))
    y[0, 50:] = 0
    y[1, 70:] = 0
    loss = model.training_step((x, y), 0)
    logits = model(x)
    keep = y != 0
    manual = F.cross_entropy(logits[keep], y[keep])
    assert loss.item() == pytest.approx(manual.item(), rel=1e-5)


def test_masked_accuracy_hand_computed():
    # V = 90; predictions via one-hot logits
    target = torch.tensor([[5, 7, 89, 0], [87, 3, 3, 0]])
    preds = torch.tensor([[5, 1, 89, 0], [87, 3, 4, 2]])
    logits = F.one_hot(preds, 90).float()
    pad_only = MaskedTokenAccuracy((0,))
    pad_only.update(logits, target)
    # counted: 5✓ 7✗ 89✓ | 87✓ 3✓ 3✗  -> 4 / 6
    assert pad_only.compute().item() == pytest.approx(4 / 6)
    special = MaskedTokenAccuracy((0, 87, 88, 89))
    special.update(logits, target)
    # counted: 5✓ 7✗ | 3✓ 3✗ -> 2 / 4
    assert special.compute().item() == pytest.approx(2 / 4)
    # accumulates over batches, token-weighted
    pad_only.update(F.one_hot(torch.tensor([[9, 9]]), 90).float(), torch.tensor([[9, 9]]))
    assert pad_only.compute().item() == pytest.approx(6 / 8)


def test_keras_init():
    torch.manual_seed(0)
    model = ShakespeareLSTM()
    h = 256
    assert model.embedding.weight.abs().max() <= 0.05
    for layer in range(2):
        b_ih = getattr(model.lstm, f"bias_ih_l{layer}")
        b_hh = getattr(model.lstm, f"bias_hh_l{layer}")
        assert torch.all(b_ih[h:2 * h] == 1) and torch.all(b_ih[:h] == 0) and torch.all(b_ih[2 * h:] == 0)
        assert torch.all(b_hh == 0)
        w_hh = getattr(model.lstm, f"weight_hh_l{layer}")  # [4H, H], orthonormal columns
        assert torch.allclose(w_hh.T @ w_hh, torch.eye(h), atol=1e-4)
        w_ih = getattr(model.lstm, f"weight_ih_l{layer}")
        std = math.sqrt(2.0 / w_ih.shape[1]) / 0.87962566103423978
        assert w_ih.abs().max() <= 2 * std + 1e-6
    assert torch.all(model.head.bias == 0)
    plain = ShakespeareLSTM(keras_init=False)
    assert not torch.all(plain.lstm.bias_hh_l0 == 0)


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_lightning_validation_logs_token_weighted_metrics():
    torch.manual_seed(0)
    model = ShakespeareLSTM(hidden_size=8, lr=0.1)
    x = torch.randint(1, 90, (6, 80))
    y = torch.randint(1, 90, (6, 80))
    y[:, 40:] = 0
    y[5, 5:] = 0  # rows with different numbers of counted tokens
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    out = trainer.validate(model, loader, verbose=False)[0]
    with torch.no_grad():
        logits = model(x)
    keep = y != 0
    acc = (logits.argmax(-1)[keep] == y[keep]).float().mean().item()
    loss = F.cross_entropy(logits[keep], y[keep]).item()
    assert out["val_acc"] == pytest.approx(acc, abs=1e-6)
    assert out["val_loss"] == pytest.approx(loss, rel=1e-5)
    test_out = trainer.test(model, loader, verbose=False)[0]
    assert test_out["test_acc"] == pytest.approx(acc, abs=1e-6)
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, limit_val_batches=0)
    trainer.fit(model, loader)
    assert "train_loss" in trainer.callback_metrics
