"""Lightning semantics in federated training: every Trainer feature keeps its meaning or is refused (issue #11 A)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import TensorDataset
from helpers import LinearRegression, quiet_trainer_kwargs, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner


# ---------------------------------------------------------------- #11.3 Trainer arguments
def _regression_dm(num_clients=4, n=40, **kwargs):
    x, y = regression_data(n=n)
    kwargs = {"clients_per_round": 2, "batch_size": 3} | kwargs
    dataset = TensorDataset(torch.tensor(x), torch.tensor(y))
    return FederatedDataModule(dataset, partitioner=IIDPartitioner(num_clients=num_clients, seed=0), **kwargs)


@pytest.mark.parametrize("bar", ["tqdm", "rich"])
def test_user_progress_bar_counts_clients(tmp_path, bar):
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    if bar == "rich":
        pytest.importorskip("rich")
    progress = TQDMProgressBar() if bar == "tqdm" else RichProgressBar()
    seen = []

    class Spy(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if bar == "tqdm":
                seen.append((progress.train_progress_bar.n, progress.train_progress_bar.total))
            else:
                task = progress.progress.tasks[progress.train_progress_bar_id]
                seen.append((task.completed, task.total))

    kwargs = quiet_trainer_kwargs(tmp_path) | {"enable_progress_bar": True}
    FederatedTrainer(max_epochs=2, callbacks=[progress, Spy()], **kwargs).fit(
        LinearRegression(), datamodule=_regression_dm(clients_per_round=3)
    )
    assert seen == [(3, 3), (3, 3)]


_LOGGED_FIT = """
import sys
sys.path.insert(0, {tests!r})
import torch
from torch.utils.data import TensorDataset
from helpers import LinearRegression, regression_data
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

x, y = regression_data(n=40)
data = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), clients_per_round=2, batch_size=3,
                           partitioner=IIDPartitioner(num_clients=4, seed=0))
FederatedTrainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_model_summary=False,
                 accelerator="cpu").fit(LinearRegression(), datamodule=data)
"""


def _run_logged_fit(tmp_path, terminal: bool) -> str:
    """Run _LOGGED_FIT in a new process, stdout and stderr into a file (``> log 2>&1``) or a terminal (a pty of 24 x
    120 characters); what it printed, as written (``\\r`` kept)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    script = tmp_path / "train.py"
    script.write_text(_LOGGED_FIT.format(tests=str(tests)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(script)]
    if not terminal:
        log = tmp_path / "log.txt"
        with open(log, "w") as out:
            subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=env, check=True,
                           timeout=300)
        return log.read_bytes().decode("utf-8")  # read_text would turn the bar's \r into newlines
    import fcntl
    import pty
    import struct
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(command, stdout=child, stderr=child, cwd=tmp_path, env=env)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert process.wait(timeout=300) == 0
    return out.decode("utf-8").replace("\r\n", "\n")  # the terminal's newline


def test_progress_bar_in_a_terminal(tmp_path):
    """In a terminal the bar is redrawn in place and titled ``Round N`` from its first draw (no ``Epoch N``
    flashing); after the last round its line ends, so "`Trainer.fit` stopped" starts a line (it was glued to the
    bar there too)."""
    pytest.importorskip("pty")
    text = _run_logged_fit(tmp_path, terminal=True)
    states = [s.strip() for s in text.replace("\r", "\n").split("\n")]
    assert not [s for s in states if s.startswith("Epoch")], text
    assert any(s.startswith("Round 2: 100%") for s in states), text
    (stopped,) = [ln for ln in text.split("\n") if "`Trainer.fit` stopped" in ln]
    assert stopped.startswith("`Trainer.fit` stopped: `max_epochs=3` reached."), repr(stopped)


def test_progress_bar_in_a_log_file(tmp_path):
    """stdout and stderr to a file (``python train.py > log 2>&1``): the bar is titled ``Round N`` from its first
    draw (no ``Epoch N`` state, which a log viewer shows as a line of its own before every round), each round's
    bar ends its line, and Lightning's "`Trainer.fit` stopped" starts a line (issue #43: it was glued to the bar)."""
    text = _run_logged_fit(tmp_path, terminal=False)
    states = [s.strip() for s in text.replace("\r", "\n").split("\n")]  # every state the bar was drawn in
    assert not [s for s in states if s.startswith("Epoch")], text
    for r in range(3):
        assert any(s.startswith(f"Round {r}: 100%") for s in states), text
    lines = text.split("\n")
    (stopped,) = [ln for ln in lines if "`Trainer.fit` stopped" in ln]
    assert stopped.startswith("`Trainer.fit` stopped: `max_epochs=3` reached."), repr(stopped)
    # one line per round: each round's last drawing ends with a newline
    ends = [ln.rsplit("\r", 1)[-1] for ln in lines if "Round" in ln]
    assert [e.split(":")[0] for e in ends if e.startswith("Round")] == ["Round 0", "Round 1", "Round 2"], ends
