"""Issue #33.3, torch.compile readiness: a user's ``torch.compile``d LightningModule trains federatedly (lean step and
vectorized executor) with no graph break in lightning_fed's code, and ends with the weights of the uncompiled run.

Graph breaks are read from dynamo's ``graph_breaks`` log (each names the file and line of the break), so a break
inside Lightning's own code (its ``self.log`` is ``torch.compiler.disable``d: the first call of each name per round
still goes through it) is told apart from one in ``lightning_fed/``. Tracing uses dynamo's ``"eager"`` backend (no C
compiler needed, and the weights are then bit for bit those of the uncompiled run); one test compiles with the
default backend (inductor), which needs a working C++ compiler and is skipped without one."""

from __future__ import annotations

import contextlib
import logging
import os
import re

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import lightning_fed
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

dynamo = pytest.importorskip("torch._dynamo")
pytestmark = pytest.mark.skipif(not dynamo.is_dynamo_supported(), reason="torch.compile (dynamo) is not supported "
                                "on this platform / Python version")

PACKAGE_DIR = os.path.dirname(os.path.abspath(lightning_fed.__file__))


class MLP(L.LightningModule):
    """A small classifier logging a step value and an epoch value in ``training_step``. ``compile_net`` compiles its
    inner ``nn.Sequential`` with that backend (``None``: not compiled)."""

    def __init__(self, compile_net: str | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        if compile_net is not None:
            self.net = torch.compile(self.net, backend=compile_net)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, batch_size=y.shape[0])
        self.log("loss_x2", 2 * loss, on_step=False, on_epoch=True, batch_size=y.shape[0])
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(model, executor="sequential", rounds=2):
    """2 rounds, 2 clients of 20 samples (batches of 4: 5 local steps each); returns the trainer."""
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(40, 5, generator=g), torch.randint(0, 3, (40,), generator=g))
    dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=2), clients_per_round=2, batch_size=4)
    trainer = FederatedTrainer(max_epochs=rounds, logger=False, enable_progress_bar=False, enable_model_summary=False,
                               enable_checkpointing=False, accelerator="cpu", on_client_failure="raise",
                               client_executor=executor)
    trainer.fit(model, datamodule=dm)
    return trainer


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def metrics(trainer):
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k != "round_time_s"}


class _BreakLocations(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.found: list[tuple[str, int]] = []

    def emit(self, record):
        match = re.search(r"in user code at (.+):(\d+)", record.getMessage())
        if match:
            self.found.append((os.path.abspath(match.group(1)), int(match.group(2))))


@contextlib.contextmanager
def graph_breaks():
    """Yields the list of ``(file, line)`` of every graph break dynamo makes inside the block (from its
    ``graph_breaks`` log; dynamo's caches are reset first, so every frame is traced afresh); afterwards checks that
    the log saw a break whenever dynamo's own counter did (a changed log format fails loudly, not silently)."""
    dynamo.reset()
    dynamo.utils.counters.clear()
    handler = _BreakLocations()
    logger = torch._logging.getArtifactLogger("torch._dynamo.symbolic_convert", "graph_breaks")
    torch._logging.set_logs(graph_breaks=True)
    logger.addHandler(handler)
    try:
        yield handler.found
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()
    counted = sum(dynamo.utils.counters["graph_break"].values())
    assert bool(handler.found) == bool(counted), (handler.found, dict(dynamo.utils.counters["graph_break"]))


def ours(found):
    return [(f, line) for f, line in found if f.startswith(PACKAGE_DIR + os.sep)]


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_a_compiled_inner_module_trains_without_any_graph_break(executor):
    """``self.net = torch.compile(net)``: the compiled region is the user's network; no graph break at all, and the
    same weights and logged values as the uncompiled run, bit for bit (dynamo's eager backend runs the same ops)."""
    plain_model = MLP()
    plain = fit(plain_model, executor)
    compiled_model = MLP(compile_net="eager")
    with graph_breaks() as found:
        compiled = fit(compiled_model, executor)
    assert found == []
    assert dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the network was compiled (and ran compiled)
    if executor == "sequential":
        assert compiled.fit_loop.client_runner.step_path == "lean"
    assert all(torch.equal(a, b) for a, b in zip(weights(compiled_model), weights(plain_model)))
    assert metrics(compiled) == metrics(plain)


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_a_compiled_lightning_module_has_no_graph_break_in_lightning_fed(executor):
    """``torch.compile(model)``: Lightning compiles ``forward`` and ``training_step``, so ``self.log`` — lightning_fed's
    fast path on the lean step — runs inside the compiled frame. Issue #33: the fast path's ``Tensor.item()`` (the
    CPU's way of keeping a step value) broke the graph there; under compilation it now keeps a tensor clone (the
    path of every non-CPU device: the same logged values bit for bit). The only graph breaks left are Lightning's own
    (its ``_ResultCollection.log`` is ``torch.compiler.disable``d), taken by the first call of each name per round."""
    plain_model = MLP()
    plain = fit(plain_model, executor)
    compiled_model = MLP()
    with graph_breaks() as found:
        compiled = fit(torch.compile(compiled_model, backend="eager"), executor)
    assert ours(found) == []
    if executor == "sequential":
        assert compiled.fit_loop.client_runner.step_path == "lean"
        lightning_dir = os.path.dirname(os.path.abspath(L.__file__))
        assert found and all(f.startswith(lightning_dir) for f, _ in found)  # Lightning's own log, seen by the log
    assert all(torch.equal(a, b) for a, b in zip(weights(compiled_model), weights(plain_model)))
    assert metrics(compiled) == metrics(plain)


def test_the_fast_log_path_broke_the_graph_before_the_fix(monkeypatch):
    """The check above is able to fail: the fast path's CPU ``item()`` taken under compilation too (the code before
    the fix) is seen as a graph break in lightning_fed/client/lean_step.py."""
    import lightning_fed.client.lean_step as lean_step

    monkeypatch.setattr(lean_step, "_is_compiling", lambda: False)  # as if the fast path did not know
    with graph_breaks() as found:
        trainer = fit(torch.compile(MLP(), backend="eager"), rounds=1)
    assert trainer.fit_loop.client_runner.step_path == "lean"
    assert {os.path.basename(f) for f, _ in ours(found)} == {"lean_step.py"}


@pytest.fixture(scope="module")
def inductor():
    """Skips when the default torch.compile backend (inductor) cannot compile here (no C++ compiler, ...)."""
    try:
        torch.compile(lambda x: torch.tanh(x) + 1)(torch.zeros(2))
    except Exception as error:  # inductor's failures are BackendCompilerFailed, InvalidCxxCompiler, OSError...
        pytest.skip(f"torch.compile's default backend does not work here: {type(error).__name__}: {error}")


def test_an_inductor_compiled_network_matches_the_uncompiled_run(inductor):
    """The default backend (inductor) generates its own kernels (fused tanh and matmul epilogues, its own reduction
    order for the loss and the gradients), so the weights are close to, not bit for bit, those of the uncompiled run:
    float32 rounding differences of a few ulps after 20 local steps."""
    plain_model = MLP()
    plain = fit(plain_model)
    compiled_model = MLP(compile_net="inductor")
    with graph_breaks() as found:
        compiled = fit(compiled_model)
    assert found == [] and compiled.fit_loop.client_runner.step_path == "lean"
    for a, b in zip(weights(compiled_model), weights(plain_model)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert metrics(compiled) == pytest.approx(metrics(plain), rel=1e-6)
