"""FedAwareCNN: shapes, parameter counts (hand-computed), optimiser, logging on a hand-made batch."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_fed.models.cnn import FedAwareCNN

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers.*"),
    pytest.mark.filterwarnings("ignore:.*no `val_dataloader`.*"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
]


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _trainer(**kw) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )


# Hand counts: Conv(cin, cout, k) has cout*cin*k*k + cout parameters, Linear(i, o) has i*o + o.
# fedavg 1x28x28: conv1 32*1*25+32=832, conv2 64*32*25+64=51,264, fc1 1024*512+512=524,800,
#                 fc2 512*10+10=5,130                                     -> 582,026
# fedavg 3x32x32: conv1 32*3*25+32=2,432, conv2 51,264, fc1 1600*512+512=819,712, fc2 5,130
#                                                                         -> 878,538
# toy 3x32x32:    conv 32*3*9+32=896, 64*32*9+64=18,496, 64*64*9+64=36,928, fc1 1024*64+64=65,600,
#                 fc2 64*10+10=650                                        -> 122,570
# toy 1x28x28:    conv 32*1*9+32=320, 18,496, 36,928, fc1 576*64+64=36,928, fc2 650 -> 93,322
# mlp 1x28x28:    784*200+200=157,000, 200*200+200=40,200, 200*10+10=2,010 -> 199,210
@pytest.mark.parametrize(
    "arch, in_channels, image_size, expected",
    [
        ("fedavg", 1, 28, 832 + 51_264 + 524_800 + 5_130),
        ("fedavg", 3, 32, 2_432 + 51_264 + 819_712 + 5_130),
        ("toy", 3, 32, 896 + 18_496 + 36_928 + 65_600 + 650),
        ("toy", 1, 28, 320 + 18_496 + 36_928 + 36_928 + 650),
        ("mlp", 1, 28, 157_000 + 40_200 + 2_010),
    ],
)
def test_output_shape_and_parameter_count(arch, in_channels, image_size, expected):
    model = FedAwareCNN(in_channels=in_channels, image_size=image_size, arch=arch)
    out = model(torch.randn(5, in_channels, image_size, image_size))
    assert out.shape == (5, 10)
    assert _num_params(model) == expected


def test_default_is_fedavg_cnn_for_fashion_mnist():
    model = FedAwareCNN()
    assert dict(model.hparams) == dict(in_channels=1, image_size=28, num_classes=10, lr=0.01, arch="fedavg",
                                       channels_last=False, norm=None)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (1, 32, (5, 5), (0, 0)),
        (32, 64, (5, 5), (0, 0)),
    ]
    assert [(m.in_features, m.out_features) for m in linears] == [(1024, 512), (512, 10)]
    cifar = FedAwareCNN(in_channels=3, image_size=32)
    assert [(m.in_features, m.out_features) for m in cifar.modules() if isinstance(m, torch.nn.Linear)] == [
        (1600, 512),
        (512, 10),
    ]


def test_num_classes():
    model = FedAwareCNN(in_channels=3, image_size=32, num_classes=100)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 100)


def test_toy_init_matches_authors_code():
    torch.manual_seed(0)
    model = FedAwareCNN(in_channels=3, image_size=32, arch="toy")
    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            assert torch.count_nonzero(m.bias) == 0
    fc1 = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][0]
    assert fc1.weight.std().item() == pytest.approx(0.01, rel=0.05)


@pytest.mark.parametrize("kwargs", [dict(arch="resnet"), dict(image_size=12), dict(lr=0.0), dict(arch="toy", image_size=16),
                                    dict(channels_last="yes"), dict(norm="group"), dict(arch="toy", norm="batch")])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        FedAwareCNN(**kwargs)


def test_batch_norm_option_adds_batchnorm_after_each_conv_with_the_same_initial_weights():
    """norm="batch" (for FedBN): BatchNorm2d(32) and BatchNorm2d(64) after the convolutions, before their ReLUs;
    the convolutions and linear layers start from the weights of the plain CNN (same seed), and the default
    (norm=None) builds the plain CNN exactly as before (the same initial weights bit for bit)."""
    torch.manual_seed(3)
    plain = FedAwareCNN()
    torch.manual_seed(3)
    batch = FedAwareCNN(norm="batch")
    assert [type(m).__name__ for m in batch.net] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Conv2d",
                                                     "BatchNorm2d", "ReLU", "MaxPool2d", "Flatten", "Linear", "ReLU",
                                                     "Linear"]
    assert (batch.net[1].num_features, batch.net[5].num_features) == (32, 64)
    weights = [m for m in plain.net if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert [m for m in batch.net if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))].__len__() == len(weights)
    for a, b in zip(weights, [m for m in batch.net if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert _num_params(batch) == _num_params(plain) + 2 * (32 + 64)
    assert batch.hparams["norm"] == "batch"
    batch.train()
    assert batch(torch.randn(4, 1, 28, 28)).shape == (4, 10)
    assert batch.net[1].num_batches_tracked.item() == 1  # running statistics are updated in training
    with pytest.raises(ValueError, match="norm must be one of"):
        FedAwareCNN(norm="layer")
    with pytest.raises(ValueError, match="needs arch='fedavg'"):
        FedAwareCNN(arch="mlp", norm="batch")


def test_configure_optimizers_is_plain_sgd():
    model = FedAwareCNN(lr=0.05)
    opt = model.configure_optimizers()
    assert type(opt) is torch.optim.SGD
    group = opt.param_groups[0]
    assert group["lr"] == 0.05 and group["momentum"] == 0 and group["weight_decay"] == 0
    assert not group["nesterov"]
    assert sum(p.numel() for p in group["params"]) == _num_params(model)
    assert FedAwareCNN().configure_optimizers().param_groups[0]["lr"] == 0.01


def _constant_model() -> FedAwareCNN:
    """All weights zero, last bias [2, 0, ..., 0]: logits = that bias for every input, argmax = class 0."""
    model = FedAwareCNN()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.net[-1].bias[0] = 2.0
    return model


# per-sample cross-entropy with logits b = [2, 0 x 9]: lse = log(e^2 + 9); label 0 -> lse - 2, else lse
_LSE = math.log(math.exp(2.0) + 9.0)


def _hand_loaders():
    x = torch.randn(6, 1, 28, 28)
    y = torch.tensor([0, 0, 0, 5, 0, 7])  # predictions are all 0: 4 of 6 correct
    return DataLoader(TensorDataset(x, y), batch_size=4)  # batches of 4 and 2


def test_validation_logs_sample_weighted_loss_and_micro_accuracy():
    (metrics,) = _trainer().validate(_constant_model(), dataloaders=_hand_loaders(), verbose=False)
    # micro accuracy over the epoch: 4/6 (a mean of batch accuracies would be (3/4 + 1/2)/2 = 0.625)
    assert metrics["val_acc"] == pytest.approx(4 / 6)
    # loss averaged over samples: (4 (lse - 2) + 2 lse) / 6 = lse - 4/3
    assert metrics["val_loss"] == pytest.approx(_LSE - 4 / 3, rel=1e-5)
    assert set(metrics) == {"val_loss", "val_acc"}


def test_test_step_logs_test_metrics():
    (metrics,) = _trainer().test(_constant_model(), dataloaders=_hand_loaders(), verbose=False)
    assert set(metrics) == {"test_loss", "test_acc"}
    assert metrics["test_acc"] == pytest.approx(4 / 6)
    assert metrics["test_loss"] == pytest.approx(_LSE - 4 / 3, rel=1e-5)


def test_training_step_logs_train_loss_and_takes_an_sgd_step():
    model = _constant_model()
    x = torch.randn(4, 1, 28, 28)
    y = torch.tensor([0, 0, 0, 5])
    bias_before = model.net[-1].bias.detach().clone()
    trainer = _trainer(max_steps=1)
    trainer.fit(model, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=4))
    # loss of the (only) step, computed before the update: (3 (lse - 2) + lse) / 4 = lse - 1.5
    assert trainer.callback_metrics["train_loss"].item() == pytest.approx(_LSE - 1.5, rel=1e-5)
    # only the last bias has a non-zero gradient at zero weights; SGD: b <- b - lr * (mean softmax - mean onehot)
    p = torch.softmax(bias_before, 0)
    onehot = torch.zeros(10)
    onehot[0], onehot[5] = 3 / 4, 1 / 4
    expected = bias_before - 0.01 * (p - onehot)
    assert torch.allclose(model.net[-1].bias.detach(), expected, atol=1e-6)


def test_channels_last_trains_the_same_model_up_to_rounding():
    """channels_last=True: the conv weights (and inputs) in channels-last memory; the same function and the same
    SGD steps as the default layout, up to float rounding (other oneDNN kernels); the default stays contiguous."""
    torch.manual_seed(0)
    dense, last = FedAwareCNN(), FedAwareCNN(channels_last=True)
    last.load_state_dict(dense.state_dict())
    conv_weights = [m.weight for m in last.net if isinstance(m, torch.nn.Conv2d)]
    assert conv_weights and all(w.is_contiguous(memory_format=torch.channels_last) for w in conv_weights)
    assert all(m.weight.is_contiguous() for m in dense.net if isinstance(m, torch.nn.Conv2d))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)
    torch.testing.assert_close(last(x), dense(x), rtol=1e-5, atol=1e-6)
    for model in (dense, last):
        optimizer = model.configure_optimizers()
        for _ in range(3):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    for a, b in zip(dense.parameters(), last.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_channels_last_federated_round_matches_the_default_layout(tmp_path):
    """Two FedAvg rounds through the sequential executor (x_t loaded into channels-last weights in place, the
    pseudo-gradient aggregated from them) and through the vectorized one equal the default layout's up to
    rounding."""
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import FedAvg
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(40, 1, 28, 28, generator=g), torch.randint(0, 10, (40,), generator=g))
    from lightning_fed.vectorized import VectorizedExecutor

    models = []
    vectorized = VectorizedExecutor()
    for channels_last, executor in ((False, None), (True, None), (True, vectorized)):
        torch.manual_seed(0)
        model = FedAwareCNN(channels_last=channels_last)
        dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2,
                                 batch_size=5, seed=0)
        trainer = FederatedTrainer(max_epochs=2, callbacks=[FedAvg(lr=1.0)], logger=False, enable_checkpointing=False,
                                   enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                                   default_root_dir=tmp_path, client_executor=executor)
        trainer.fit(model, datamodule=dm)
        models.append(model)
    assert models[1].net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert vectorized.fallback_reason is None  # the layout change runs under vmap too
    for other in models[1:]:
        for a, b in zip(models[0].parameters(), other.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
