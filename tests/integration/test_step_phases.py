"""benchmarks/step_phases.py (issue #33.1): both variants time the same phases, the timers are removed afterwards,
and bad arguments are refused by name."""

from __future__ import annotations

import pytest
import torch

from helpers import load_script
from lightning_fed.client.lean_step import LeanLocalStep
from lightning_fed.models.classifier import Classifier


@pytest.fixture(scope="module")
def step_phases():
    return load_script("benchmarks/step_phases.py")


def test_a_tiny_run_times_every_phase_and_leaves_nothing_attached(step_phases):
    originals = (torch.optim.SGD.__dict__.get("step"), "zero_grad" in torch.optim.SGD.__dict__,
                 torch.Tensor.backward, Classifier.training_step, LeanLocalStep.log, LeanLocalStep.step)
    result = step_phases.main(["--clients", "4", "--cohort", "2", "--samples-per-client", "40", "--rounds", "2",
                               "--repeats", "1"])
    assert set(result["plain"]) == {"forward+loss", "zero_grad", "backward", "optimizer.step"}
    assert set(result["lightning_fed"]) == {"training_step", "self.log", "zero_grad", "backward", "optimizer.step",
                                            "step"}
    assert all(v > 0 for r in result.values() for v in r.values())
    # the step holds its closure (training_step, zero_grad, backward) and the update
    lf = result["lightning_fed"]
    assert lf["step"] > lf["training_step"] + lf["optimizer.step"]
    assert originals == (torch.optim.SGD.__dict__.get("step"), "zero_grad" in torch.optim.SGD.__dict__,
                         torch.Tensor.backward, Classifier.training_step, LeanLocalStep.log, LeanLocalStep.step)


@pytest.mark.parametrize("argv, match", [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--cohort", "20", "--clients", "10"], "--cohort must be <= --clients"),
    (["--cnn-arch", "resnet"], "invalid choice"),
])
def test_bad_arguments_are_refused_by_name(step_phases, argv, match, capsys):
    with pytest.raises(SystemExit):
        step_phases.parse_args(argv)
    assert match in capsys.readouterr().err
