"""LogRecorder and ClientLogSums: self.log values of a vmapped training_step, per client, reduced by hand."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch.func import grad_and_value, vmap
from torchmetrics.aggregation import MeanMetric

from lightning_fed.client.vectorized_logging import ClientLogSums, LogRecorder


def test_recorder_keeps_values_batch_sizes_and_first_arguments():
    recorder = LogRecorder()
    recorder.begin()
    recorder.log("a", torch.tensor([2.5]), on_epoch=True, batch_size=3)
    recorder.log("a", torch.tensor(1.5), on_epoch=True)  # a second call in the same step
    recorder.log("n", 7)
    values = recorder.take()
    assert values["a"].tolist() == [2.5, 1.5] and values["n"].tolist() == [7.0]
    assert values["a"].dtype == torch.float64
    assert recorder.taken == {"a": [3, None], "n": [None]}
    assert recorder.kwargs == {"a": {"on_epoch": True}, "n": {}}
    recorder.log("g", torch.tensor(1.0), enable_graph=True)  # part of Lightning's metadata of the name
    assert recorder.kwargs["g"] == {"enable_graph": True}
    recorder.begin()
    assert recorder.take() == {} and recorder.taken == {}


@pytest.mark.parametrize("call", [
    lambda r: r.log("u", torch.ones(2)),                        # not one number per client
    lambda r: r.log("u", torch.tensor(1.0), reduce_fx="max"),   # not the mean
    lambda r: r.log("u", torch.tensor(1.0), reduce_fx=torch.sum),
    lambda r: r.log("u", torch.tensor(1.0), sync_dist=True),
    lambda r: r.log("u", torch.tensor(1.0), metric_attribute="m"),
    lambda r: r.log("u", MeanMetric()),                         # a torchmetrics Metric
    lambda r: r.log("u", "text"),
    lambda r: r.log("u", True),
])
def test_unsupported_calls_are_named_not_recorded(call):
    recorder = LogRecorder()
    recorder.begin()
    recorder.log("u", torch.tensor(0.0))  # recorded first, then an unsupported call of the same name drops it
    call(recorder)
    assert recorder.unsupported == {"u"} and recorder.take() == {}
    recorder.begin()
    recorder.log("u", torch.tensor(0.0))
    assert recorder.take() == {}  # stays unsupported for the fit


def test_other_arguments_for_a_name_raise_lightnings_error():
    recorder = LogRecorder()
    recorder.log("v", 1.0, prog_bar=True)
    recorder.log("v", 2.0, prog_bar=True, batch_size=5)  # batch_size is not an argument of the name
    with pytest.raises(MisconfigurationException, match=r"You called `self.log\(v, ...\)` twice in `training_step`"):
        recorder.log("v", 3.0)


def test_values_come_out_of_vmap_per_client():
    """Inside vmap(grad_and_value(..., has_aux=True)) a logged tensor is batched over the clients and a logged
    number is the same for all (broadcast)."""
    recorder = LogRecorder()

    def loss_fn(w, x):
        recorder.begin()
        loss = (w * x).sum()
        recorder.log("loss", loss)
        recorder.log("half", 0.5)
        return loss, recorder.take()

    w = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    x = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 2.0]])
    grads, (loss, values) = vmap(grad_and_value(loss_fn, has_aux=True))(w, x)
    assert torch.equal(grads, x) and loss.tolist() == [3.0, 3.0, 12.0]
    assert values["loss"].tolist() == [[3.0], [3.0], [12.0]] and values["half"].tolist() == [[0.5]] * 3


def test_client_sums_by_hand():
    """Three clients (rows). Step 1: rows 0, 1 (batches of 4) log x = 1, 2 and, twice, e = (1, 3), (2, 2) with
    batch_size 2 and None; step 2: row 0 (a batch of 1) logs x = 5, e = (7, 9). Row 2 never logs.
    Row 0: x/step = (1 + 5)/2 = 3, x/epoch = (4·1 + 1·5)/5 = 1.8; e/step = (3 + 9)/2 = 6 (each step's last value),
    e/epoch = (2·1 + 4·3 + 2·7 + 1·9)/(2 + 4 + 2 + 1) = 37/9. Row 1: x = 2, e/step = 2, e/epoch = (2·2 + 4·2)/6 = 2."""
    sums = ClientLogSums(3)
    f64 = dict(dtype=torch.float64)
    sums.add({"x": torch.tensor([[1.0], [2.0]], **f64), "e": torch.tensor([[1.0, 3.0], [2.0, 2.0]], **f64)},
             {"x": [None], "e": [2, None]}, [0, 1], batch_size=4)
    sums.add({"x": torch.tensor([[5.0]], **f64), "e": torch.tensor([[7.0, 9.0]], **f64)},
             {"x": [None], "e": [2, None]}, [0], batch_size=1)
    assert sums.client_values(0) == {"x/step": 3.0, "x/epoch": 1.8, "e/step": 6.0, "e/epoch": 37 / 9}
    assert sums.client_values(1) == {"x/step": 2.0, "x/epoch": 2.0, "e/step": 2.0, "e/epoch": 2.0}
    assert sums.client_values(2) == {}


def test_positional_arguments_follow_lightnings_signatures():
    """log(name, value, prog_bar, logger, on_step, on_epoch, ...) and log_dict(dictionary, prog_bar, ...) take the
    same positional arguments as LightningModule.log / log_dict."""
    import inspect

    from lightning.pytorch import LightningModule

    for name in ("log", "log_dict"):
        ours = list(inspect.signature(getattr(LogRecorder, name)).parameters)
        theirs = list(inspect.signature(getattr(LightningModule, name)).parameters)
        assert ours == theirs, name
    recorder = LogRecorder()
    recorder.log_dict({"a": 1.0}, True, None, False, True)
    assert recorder.kwargs["a"] == {"prog_bar": True, "on_step": False, "on_epoch": True}
