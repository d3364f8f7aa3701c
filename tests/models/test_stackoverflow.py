"""Stack Overflow (SO NWP / SO LR): TFF's SQLite layout written by the test, hand-checked preprocessing, models."""

from __future__ import annotations

import pytest
import torch
from lightning_fed.models.stackoverflow import RecallAtK, StackOverflowNWP, StackOverflowTagLR


def test_recall_at_5_hand_computed():
    scores = torch.tensor([
        [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3],  # top-5 = tags 0..4
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],  # top-5 = tags 2..6
        [0.5, 0.1, 0.1, 0.1, 0.1, 0.1, 0.9],  # no positives: adds nothing
    ])
    target = torch.tensor([
        [1, 0, 0, 0, 0, 1, 1],  # 1 of 3 in top-5
        [1, 1, 0, 0, 1, 0, 0],  # 1 of 3 in top-5
        [0, 0, 0, 0, 0, 0, 0],
    ])
    metric = RecallAtK(5)
    metric.update(scores[:2], target[:2])
    metric.update(scores[2:], target[2:])
    assert metric.compute().item() == pytest.approx(2 / 6)  # micro: (1 + 1) / (3 + 3), as Keras Recall(top_k=5)
    # torchmetrics' MultilabelRecall thresholds scores and (1.9) takes no `top_k`: not TFF's recall@5.
    from torchmetrics.classification import MultilabelRecall

    assert MultilabelRecall(num_labels=7, average="micro")(scores, target).item() != pytest.approx(2 / 6)


def test_model_shapes():
    nwp = StackOverflowNWP(vocab_size=50, embedding_dim=8, hidden_size=12)
    x = torch.randint(0, 54, (3, 20))
    assert nwp(x).shape == (3, 20, 54)
    full = StackOverflowNWP()
    assert full.embedding.weight.shape == (10004, 96) and full.lstm.hidden_size == 670
    assert full.projection.out_features == 96 and full.head.out_features == 10004
    lr = StackOverflowTagLR()
    assert lr(torch.rand(4, 10000)).shape == (4, 500)
    # accuracy ignores pad/OOV/BOS/EOS targets: only the one word target counts
    logits = torch.zeros(1, 4, 54)
    logits[0, :, 7] = 1.0
    nwp.val_acc.update(logits, torch.tensor([[7, 51, 53, 0]]))
    assert nwp.val_acc.compute().item() == 1.0
