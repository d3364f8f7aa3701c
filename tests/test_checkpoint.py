"""Checkpoints of federated runs (lightning_fed.checkpoint): crash-safe writes, readable errors on damaged files,
the run's configuration checked on resume, one checkpoint per round holding the global model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.plugins import TorchCheckpointIO

from helpers import SmallClassifier, classification_dataset, quiet_trainer_kwargs
from lightning_fed import FederatedTrainer
from lightning_fed.callbacks import FedAdam, FedYogi
from lightning_fed.checkpoint import AtomicCheckpointIO, CorruptCheckpointError, MidRoundCheckpointError
from lightning_fed.datamodules import DirichletPartitioner, FederatedDataModule, IIDPartitioner

# Expected here: the resume tests continue into a new checkpoint folder (Lightning: "The dirpath has changed") and
# make allowed changes on purpose (the fit announces them; the tests check them in the checkpoint).
pytestmark = [
    pytest.mark.filterwarnings("ignore:The dirpath has changed from:UserWarning"),
    pytest.mark.filterwarnings("ignore:Resuming from .* with allowed changes:UserWarning"),
]

TESTS = Path(__file__).parent


def _dm(val: bool = True, **overrides) -> FederatedDataModule:
    train, val_ds = classification_dataset(n=300, n_val=60)
    kwargs = dict(
        partitioner=DirichletPartitioner(num_clients=10, alpha=1.0, seed=0), clients_per_round=3, batch_size=8,
    )
    kwargs.update(overrides)
    return FederatedDataModule(train, val_dataset=val_ds if val else None, **kwargs)


def _trainer(tmp_path, callbacks, max_epochs=2, **kwargs) -> FederatedTrainer:
    base = quiet_trainer_kwargs(tmp_path) | {"enable_checkpointing": True}
    return FederatedTrainer(max_epochs=max_epochs, callbacks=callbacks, **(base | kwargs))


def _fit(tmp_path, ckpt_dir, max_epochs=2, server=None, dm=None, ckpt_path=None, callbacks_extra=(), **kwargs):
    torch.manual_seed(0)
    model = SmallClassifier(dropout=0.0)
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    server = server if server is not None else FedAdam(lr=0.02)
    trainer = _trainer(tmp_path, [server, checkpoint, *callbacks_extra], max_epochs=max_epochs, **kwargs)
    trainer.fit(model, datamodule=dm if dm is not None else _dm(), ckpt_path=ckpt_path)
    return model, trainer


# ---------------------------------------------------------------------------------------------- #16.10 atomic writes
class _Probe:
    """Pickled inside a checkpoint: records the directories' contents at the moment torch.save serialises it, and
    optionally raises (a failure in the middle of writing)."""

    def __init__(self, dirs, fail=False):
        self.dirs, self.fail, self.seen = dirs, fail, None

    def __reduce__(self):
        self.seen = {d: sorted(os.listdir(d)) for d in self.dirs}
        if self.fail:
            raise RuntimeError("serialisation failed half-way")
        return (int, (0,))


class _AddToCheckpoint(Callback):
    def __init__(self):
        self.extra = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if self.extra is not None:
            checkpoint["probe"] = self.extra


def _partials(directory) -> list[str]:
    return [n for n in os.listdir(directory) if ".partial-" in n]


def test_default_checkpoint_io_is_atomic_and_a_given_one_is_kept(tmp_path):
    assert type(FederatedTrainer(**quiet_trainer_kwargs(tmp_path)).strategy.checkpoint_io) is AtomicCheckpointIO
    mine = TorchCheckpointIO()
    assert FederatedTrainer(plugins=[mine], **quiet_trainer_kwargs(tmp_path)).strategy.checkpoint_io is mine


def test_checkpoint_is_written_in_the_target_directory_not_tmpdir(tmp_path, monkeypatch):
    other_tmp = tmp_path / "other_tmp"
    other_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(other_tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(other_tmp))
    ckpt_dir = tmp_path / "ckpt"
    adder = _AddToCheckpoint()
    torch.manual_seed(0)
    trainer = _trainer(tmp_path, [FedAdam(lr=0.02), adder], max_epochs=1)
    trainer.fit(SmallClassifier(dropout=0.0), datamodule=_dm())
    adder.extra = probe = _Probe([ckpt_dir, other_tmp])
    ckpt_dir.mkdir()
    trainer.save_checkpoint(ckpt_dir / "last.ckpt")
    # while torch.save ran, the bytes went to a partial file next to the target, nothing to $TMPDIR
    assert len(probe.seen[ckpt_dir]) == 1 and probe.seen[ckpt_dir][0].startswith(".last.ckpt.partial-")
    assert probe.seen[other_tmp] == []
    assert sorted(os.listdir(ckpt_dir)) == ["last.ckpt"] and os.listdir(other_tmp) == []
    assert (os.stat(ckpt_dir / "last.ckpt").st_mode & 0o777) == (0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_failure_while_writing_keeps_the_previous_checkpoint(tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    adder = _AddToCheckpoint()
    torch.manual_seed(0)
    trainer = _trainer(tmp_path, [FedAdam(lr=0.02), adder], max_epochs=1)
    trainer.fit(SmallClassifier(dropout=0.0), datamodule=_dm())
    trainer.save_checkpoint(ckpt_dir / "last.ckpt")
    before = (ckpt_dir / "last.ckpt").read_bytes()
    adder.extra = probe = _Probe([ckpt_dir], fail=True)
    with pytest.raises(RuntimeError, match="serialisation failed half-way"):
        trainer.save_checkpoint(ckpt_dir / "last.ckpt")
    assert any(".partial-" in n for n in probe.seen[ckpt_dir]), "the save had started writing"
    assert (ckpt_dir / "last.ckpt").read_bytes() == before
    assert os.listdir(ckpt_dir) == ["last.ckpt"], "the partial file is removed"
    assert torch.load(ckpt_dir / "last.ckpt", weights_only=True)["epoch"] == 1  # after round 0


KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from lightning_fed.checkpoint import AtomicCheckpointIO

    class KillMidWrite:
        def __reduce__(self):  # the process dies while torch.save is writing the new checkpoint
            os.kill(os.getpid(), signal.SIGKILL)

    AtomicCheckpointIO().save_checkpoint({"step": 2, "w": torch.zeros(1000), "kill": KillMidWrite()}, sys.argv[1])
    """
)


def test_sigkill_in_the_middle_of_a_save_keeps_the_previous_checkpoint_and_the_leftover_is_cleaned(tmp_path):
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, ckpt)
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(TESTS.parent), OMP_NUM_THREADS="1")
    previous = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script), str(ckpt)], env=env, capture_output=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
        # the killed save left its partial file; the next save removed the earlier one
        leftovers = _partials(ckpt.parent)
        assert len(leftovers) == 1 and leftovers != previous
        previous = leftovers
    assert io.load_checkpoint(ckpt)["step"] == 1  # the previous checkpoint, intact
    io.save_checkpoint({"step": 3}, ckpt)  # the next save removes the killed processes' partial files
    assert os.listdir(ckpt.parent) == ["last.ckpt"]
    assert io.load_checkpoint(ckpt)["step"] == 3


# ---------------------------------------------------------------------------------------------- #16.13 damaged files
@pytest.fixture(scope="module")
def real_checkpoint(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("real")
    _fit(tmp, tmp / "ckpt", max_epochs=1)
    return tmp / "ckpt" / "last.ckpt"


@pytest.mark.parametrize(
    "damage, problem",
    [
        ("truncate", "truncated"),
        ("garbage", "not a PyTorch checkpoint"),
        ("empty", r"empty \(0 bytes"),
    ],
)
def test_damaged_checkpoint_error_names_the_file_and_the_damage(tmp_path, real_checkpoint, damage, problem):
    data = real_checkpoint.read_bytes()
    bad = tmp_path / f"{damage}.ckpt"
    if damage == "truncate":
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        bad.write_bytes(np.random.default_rng(0).bytes(4096))
    else:
        bad.write_bytes(b"")
    with pytest.raises(CorruptCheckpointError, match=re.escape(str(bad)) + ".*" + problem):
        _fit(tmp_path, tmp_path / "resumed", max_epochs=2, ckpt_path=str(bad))
    trainer = _trainer(tmp_path, [FedAdam(lr=0.02)], max_epochs=1)
    with pytest.raises(CorruptCheckpointError, match=problem):
        trainer.validate(SmallClassifier(dropout=0.0), datamodule=_dm(), ckpt_path=str(bad))


def test_intact_checkpoint_still_loads(real_checkpoint):
    assert AtomicCheckpointIO().load_checkpoint(real_checkpoint)["epoch"] == 0


# ---------------------------------------------------------------------------------------------- #16.11 resume checks
@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("two_rounds")
    _fit(tmp, tmp / "ckpt", max_epochs=2)
    return tmp / "ckpt" / "last.ckpt"


@pytest.mark.parametrize(
    "dm_kwargs, server, expected",
    [
        ({"partitioner": DirichletPartitioner(num_clients=10, alpha=0.5, seed=0)}, None,
         ["partitioner.alpha: 1.0 -> 0.5", "partition: '10 clients"]),
        ({"partitioner": IIDPartitioner(num_clients=10)}, None,
         ["partitioner: 'lightning_fed.datamodules.partitioners.dirichlet.DirichletPartitioner' -> "
          "'lightning_fed.datamodules.partitioners.iid.IIDPartitioner'"]),
        ({"seed": 1}, None, ["seed: 0 -> 1"]),
        ({"clients_per_round": 4}, None, ["clients_per_round: 3 -> 4"]),
        ({"batch_size": 16}, None, ["local_work.batch_size: 8 -> 16"]),
        ({"local_epochs": 2}, None, ["local_work.local_epochs: 1 -> 2"]),
        ({"data_order": "once"}, None, ["data_order: 'reshuffle' -> 'once'"]),
        ({"cohort_sampling": "poisson"}, None, ["cohort_sampling: 'fixed_size' -> 'poisson'"]),  # #31 item 19
        ({}, FedYogi(lr=0.02), ["server_optimizer: 'lightning_fed.callbacks.fedadam.FedAdam' -> "
                                "'lightning_fed.callbacks.fedyogi.FedYogi'"]),
        ({}, FedAdam(lr=0.01), ["server_optimizer.lr: 0.02 -> 0.01"]),
        ({}, FedAdam(lr=0.02, beta2=0.9), ["server_optimizer.beta2: 0.99 -> 0.9"]),
        ({"seed": 3, "clients_per_round": 2}, None, ["clients_per_round: 3 -> 2", "seed: 0 -> 3"]),
    ],
)
def test_resume_with_a_different_configuration_is_refused(tmp_path, two_rounds, dm_kwargs, server, expected):
    with pytest.raises(ValueError, match="configuration differs") as info:
        _fit(tmp_path, tmp_path / "resumed", max_epochs=3, server=server, dm=_dm(**dm_kwargs), ckpt_path=str(two_rounds))
    message = str(info.value)
    assert str(two_rounds) in message and "allow_resume_changes" in message
    for line in expected:
        assert line in message
    listed = [line.split(":")[0].strip() for line in message.splitlines() if line.startswith("  ")]
    names = sorted(e.split(":")[0] for e in expected)
    if names[0].startswith("partition"):  # a partitioner change lists its settings and the partition too
        assert set(names) <= set(listed) and all(n.startswith("partition") for n in listed)
    else:
        assert listed == names


def test_resume_with_the_same_configuration_is_accepted(tmp_path, two_rounds):
    _, trainer = _fit(tmp_path, tmp_path / "resumed", max_epochs=3, ckpt_path=str(two_rounds))
    assert trainer.current_epoch == 3 and trainer.server_optimizer.num_steps == 3


def test_a_record_from_before_cohort_sampling_resumes_as_fixed_size(tmp_path, two_rounds):
    """#31 item 19: ``cohort_sampling`` joined the record later; a record without it was run with fixed-size cohorts,
    so it resumes with them and is refused with Poisson cohorts."""
    from lightning_fed.checkpoint import CHECKPOINT_KEY

    ckpt = torch.load(two_rounds, weights_only=False)
    assert ckpt[CHECKPOINT_KEY]["run_config"].pop("cohort_sampling") == "fixed_size"
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    _, trainer = _fit(tmp_path, tmp_path / "resumed", max_epochs=3, ckpt_path=str(old))
    assert trainer.current_epoch == 3
    with pytest.raises(ValueError, match="cohort_sampling: 'fixed_size' -> 'poisson'"):
        _fit(tmp_path, tmp_path / "resumed2", max_epochs=3, dm=_dm(cohort_sampling="poisson"), ckpt_path=str(old))


def test_a_record_from_before_poisson_draws_resumes_as_per_client_draws(tmp_path):
    """``poisson_draws`` joined the record with #40: a Poisson-cohort record without it drew per client, so it
    resumes with those draws and is refused with ``poisson_draws="binomial"`` (other cohorts), naming it."""
    from lightning_fed.checkpoint import CHECKPOINT_KEY

    _fit(tmp_path, tmp_path / "first", max_epochs=2, dm=_dm(cohort_sampling="poisson"))
    saved = tmp_path / "first" / "last.ckpt"
    ckpt = torch.load(saved, weights_only=False)
    assert ckpt[CHECKPOINT_KEY]["run_config"].pop("poisson_draws") == "per_client"
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    _, trainer = _fit(tmp_path, tmp_path / "resumed", max_epochs=3, dm=_dm(cohort_sampling="poisson"),
                      ckpt_path=str(old))
    assert trainer.current_epoch == 3
    with pytest.raises(ValueError, match="poisson_draws: 'per_client' -> 'binomial'"):
        _fit(tmp_path, tmp_path / "resumed2", max_epochs=3, dm=_dm(cohort_sampling="poisson", poisson_draws="binomial"),
             ckpt_path=str(old))


def test_40_a_record_naming_a_partitioner_by_its_path_before_the_move_resumes_bit_for_bit(tmp_path, two_rounds):
    """#40: the partitioners moved to ``datamodules/partitioners/``; a checkpoint written before the move names the
    class by its old path. It is the same class: the run resumes, to the same weights as from today's record, and a
    different partitioner is still refused (named by its path now)."""
    from lightning_fed.checkpoint import CHECKPOINT_KEY

    ckpt = torch.load(two_rounds, weights_only=True)
    record = ckpt[CHECKPOINT_KEY]["run_config"]
    assert record["partitioner"] == "lightning_fed.datamodules.partitioners.dirichlet.DirichletPartitioner"
    record["partitioner"] = "lightning_fed.datamodules.dirichlet.DirichletPartitioner"  # as written before the move
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    resumed, trainer = _fit(tmp_path, tmp_path / "resumed", max_epochs=3, ckpt_path=str(old))
    assert trainer.current_epoch == 3
    today, _ = _fit(tmp_path, tmp_path / "today", max_epochs=3, ckpt_path=str(two_rounds))
    for a, b in zip(resumed.parameters(), today.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=re.escape(
            "partitioner: 'lightning_fed.datamodules.partitioners.dirichlet.DirichletPartitioner' -> "
            "'lightning_fed.datamodules.partitioners.iid.IIDPartitioner'")):
        _fit(tmp_path, tmp_path / "other", max_epochs=3, dm=_dm(partitioner=IIDPartitioner(num_clients=10)),
             ckpt_path=str(old))


class _RecordAtStart(Callback):
    def on_train_epoch_start(self, trainer, pl_module):
        if not hasattr(self, "num_steps"):
            server = trainer.server_optimizer
            self.num_steps = server.num_steps
            self.state = {k: [t.clone() for t in v] for k, v in server.state.items()}
            self.params = [p.detach().clone() for p in pl_module.parameters()]


def test_allowed_server_lr_change_keeps_fedadam_state(tmp_path, two_rounds):
    saved = torch.load(two_rounds, weights_only=True)
    (key,) = [k for k in saved["callbacks"] if k.startswith("FedAdam")]
    m2, v2 = (saved["callbacks"][key]["state"][n] for n in ("exp_avg", "exp_avg_sq"))
    assert saved["callbacks"][key]["num_steps"] == 2
    torch.manual_seed(0)
    recorder = _RecordAtStart()
    server = FedAdam(lr=0.01)
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "resumed"), save_last=True)
    trainer = _trainer(
        tmp_path, [server, checkpoint, recorder], max_epochs=3, allow_resume_changes=["server_optimizer.lr"]
    )
    model = SmallClassifier(dropout=0.0)
    with pytest.warns(UserWarning, match=r"allowed changes: server_optimizer.lr: 0.02 -> 0.01"):
        trainer.fit(model, datamodule=_dm(), ckpt_path=str(two_rounds))
    # restored: step count and the moments exactly as saved
    assert recorder.num_steps == 2
    for name, saved_tensors in (("exp_avg", m2), ("exp_avg_sq", v2)):
        for a, b in zip(recorder.state[name], saved_tensors):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # round 3 continued them with the new lr: m3 = β1 m2 + (1-β1)Δ, v3 = β2 v2 + (1-β2)Δ², x3 = x2 + η' m3/(√v3+τ)
    assert server.num_steps == 3
    for x2, x3, m_2, v_2, m3, v3 in zip(
        recorder.params, model.parameters(), m2, v2, server.state["exp_avg"], server.state["exp_avg_sq"]
    ):
        x2, x3, m_2, v_2, m3, v3 = (t.detach().double().numpy() for t in (x2, x3, m_2, v_2, m3, v3))
        delta = (m3 - 0.9 * m_2) / 0.1
        np.testing.assert_allclose(v3, 0.99 * v_2 + 0.01 * delta**2, rtol=1e-4, atol=1e-12)
        np.testing.assert_allclose(x3, x2 + 0.01 * m3 / (np.sqrt(v3) + 1e-3), rtol=1e-5, atol=1e-7)


def test_allow_all_changes_and_a_class_change_starts_the_server_afresh_with_a_warning(tmp_path, two_rounds):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="not carried over"):
        _, trainer = _fit(
            tmp_path, tmp_path / "resumed", max_epochs=3, server=FedYogi(lr=0.02), dm=_dm(seed=5),
            ckpt_path=str(two_rounds), allow_resume_changes=True,
        )
    assert trainer.current_epoch == 3 and trainer.server_optimizer.num_steps == 1


def test_a_name_allows_its_sub_settings_and_a_partitioner_change_its_partition(tmp_path, two_rounds):
    _fit(
        tmp_path, tmp_path / "r1", max_epochs=3, dm=_dm(batch_size=16, partitioner=DirichletPartitioner(10, 0.5)),
        ckpt_path=str(two_rounds), allow_resume_changes=["local_work", "partitioner.alpha"],
    )
    with pytest.raises(ValueError, match=r"seed: 0 -> 2") as info:
        _fit(tmp_path, tmp_path / "r2", max_epochs=3, dm=_dm(seed=2, batch_size=16), ckpt_path=str(two_rounds),
             allow_resume_changes=["local_work"])
    assert "local_work" not in str(info.value)


@pytest.mark.filterwarnings("ignore:MaliciousClients with `fraction`=.* malicious clients in every round:UserWarning")
def test_31_5_a_changed_simulated_attack_is_refused_on_resume(tmp_path):
    """#31 item 5: the robust reducers' client_transforms (the simulated attack) are in the run record: resuming
    with another attack is refused unless allowed; a checkpoint written before they were recorded is accepted with
    a warning that they cannot be checked."""
    from lightning_fed.callbacks import FedMedian
    from lightning_fed.server.attacks import MaliciousClients

    _, trainer = _fit(tmp_path, tmp_path / "a", max_epochs=1,
                      server=FedMedian(client_transforms=[MaliciousClients(0.3, attack="sign_flip")]))
    ckpt = tmp_path / "a" / "last.ckpt"
    record = torch.load(ckpt, weights_only=True)["lightning_fed"]["run_config"]
    assert record["server_optimizer.client_transforms"] == [
        "MaliciousClients(fraction=0.3, attack='sign_flip', scale=None, seed=0)"]
    stronger = lambda: FedMedian(client_transforms=[MaliciousClients(0.6, attack="sign_flip")])  # noqa: E731
    with pytest.raises(ValueError, match=r"server_optimizer.client_transforms: .*fraction=0.3.* -> .*fraction=0.6"):
        _fit(tmp_path, tmp_path / "b", max_epochs=2, server=stronger(), ckpt_path=str(ckpt))
    with pytest.raises(ValueError, match=r"server_optimizer.client_transforms"):
        _fit(tmp_path, tmp_path / "b", max_epochs=2, server=FedMedian(), ckpt_path=str(ckpt))
    _, trainer = _fit(tmp_path, tmp_path / "c", max_epochs=2, server=stronger(), ckpt_path=str(ckpt),
                      allow_resume_changes=["server_optimizer.client_transforms"])
    assert trainer.current_epoch == 2
    # an older checkpoint without the setting in its record: accepted, with a warning
    old = torch.load(ckpt, weights_only=True)
    del old["lightning_fed"]["run_config"]["server_optimizer.client_transforms"]
    torch.save(old, tmp_path / "old.ckpt")
    with pytest.warns(UserWarning, match="cannot be checked: server_optimizer.client_transforms"):
        _, trainer = _fit(tmp_path, tmp_path / "d", max_epochs=2, server=stronger(), ckpt_path=str(tmp_path / "old.ckpt"))
    assert trainer.current_epoch == 2


def test_31_3_the_run_record_keeps_the_privacy_history(tmp_path, two_rounds):
    """#31 item 3: every checkpoint records the rounds of the run by server optimizer (here 2 non-private rounds of
    FedAdam); after an allowed change of class they move to ``previous``."""
    record = torch.load(two_rounds, weights_only=True)["lightning_fed"]["privacy"]
    assert record == {"previous": [], "current": {"private": False, "rounds": 2}}
    with pytest.warns(UserWarning, match="not carried over"):
        _, trainer = _fit(tmp_path, tmp_path / "resumed", max_epochs=3, server=FedYogi(lr=0.02),
                          ckpt_path=str(two_rounds), allow_resume_changes=["server_optimizer"])
    record = torch.load(tmp_path / "resumed" / "last.ckpt", weights_only=True)["lightning_fed"]["privacy"]
    assert record == {"previous": [{"private": False, "rounds": 2}], "current": {"private": False, "rounds": 1}}


@pytest.mark.parametrize("bad", ["lr", ["server_optimizer.lr", "learning_rate"], 3])
def test_malformed_allow_resume_changes_is_an_error(tmp_path, bad):
    with pytest.raises(ValueError, match="allow_resume_changes"):
        FederatedTrainer(allow_resume_changes=bad, **quiet_trainer_kwargs(tmp_path))


# ---------------------------------------------------------------------------------------------- #16.12 timing
class _RoundLosses(Callback):
    def __init__(self):
        self.losses = {}

    def on_train_epoch_end(self, trainer, pl_module):
        self.losses[trainer.current_epoch] = trainer.fit_loop.round_metrics["round_train_loss"]


def _epochs(directory) -> list[int]:
    return sorted(int(re.search(r"epoch=(\d+)", n).group(1)) for n in os.listdir(directory) if n.startswith("epoch="))


@pytest.mark.parametrize("val, check_every", [(True, 2), (False, 1), (False, 3)])
def test_round_checkpoints_follow_rounds_not_validation(tmp_path, val, check_every):
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_top_k=-1, every_n_epochs=1, filename="{epoch}")
    torch.manual_seed(0)
    trainer = _trainer(tmp_path, [FedAdam(lr=0.02), checkpoint], max_epochs=3, check_val_every_n_epoch=check_every)
    trainer.fit(SmallClassifier(dropout=0.0), datamodule=_dm(val=val))
    assert _epochs(tmp_path / "ckpt") == [0, 1, 2]


def test_monitored_round_metric_is_the_current_rounds(tmp_path):
    """Validation every 2 rounds: Lightning alone would save at validation end only (rounds 1, 3), before the
    round's metrics are logged, i.e. scored with the previous round's round_train_loss."""
    checkpoint = ModelCheckpoint(
        dirpath=str(tmp_path / "ckpt"), monitor="round_train_loss", mode="min", save_top_k=-1, filename="{epoch}"
    )
    losses = _RoundLosses()
    torch.manual_seed(0)
    trainer = _trainer(tmp_path, [FedAdam(lr=0.02), checkpoint, losses], max_epochs=4, check_val_every_n_epoch=2)
    trainer.fit(SmallClassifier(dropout=0.0), datamodule=_dm())
    scores = {int(re.search(r"epoch=(\d+)", p).group(1)): float(s) for p, s in checkpoint.best_k_models.items()}
    assert sorted(scores) == [0, 1, 2, 3]
    for epoch, score in scores.items():
        assert score == pytest.approx(losses.losses[epoch], rel=1e-6)
    assert len(set(losses.losses.values())) == 4


def test_save_on_train_epoch_end_false_is_refused(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_on_train_epoch_end=False)
    with pytest.raises(ValueError, match=r"save_on_train_epoch_end=False"):
        _trainer(tmp_path, [checkpoint]).fit(SmallClassifier(), datamodule=_dm())


# ---------------------------------------------------------------------------------------------- #11.4 global models only
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"every_n_train_steps": 2}, r"ModelCheckpoint\(every_n_train_steps=2\) saves inside a round"),
        ({"train_time_interval": __import__("datetime").timedelta(seconds=1)},
         r"ModelCheckpoint\(train_time_interval=0:00:01\) saves inside a round"),
        ({"save_on_exception": True}, r"ModelCheckpoint\(save_on_exception=True\)"),
    ],
)
def test_checkpoints_inside_a_round_are_refused_at_fit_start(tmp_path, kwargs, match):
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), **kwargs)
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, [checkpoint]).fit(SmallClassifier(), datamodule=_dm())
    assert not (tmp_path / "ckpt").exists() or os.listdir(tmp_path / "ckpt") == []


def test_on_exception_checkpoint_is_refused(tmp_path):
    with pytest.raises(ValueError, match="OnExceptionCheckpoint"):
        _trainer(tmp_path, [OnExceptionCheckpoint(str(tmp_path))]).fit(SmallClassifier(), datamodule=_dm())


class _SaveEveryBatch(Callback):
    def __init__(self, path):
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        trainer.save_checkpoint(self.path)


def test_save_checkpoint_inside_a_round_raises(tmp_path):
    path = tmp_path / "mid.ckpt"
    with pytest.raises(MidRoundCheckpointError, match="inside round 0.*client's local model"):
        _trainer(tmp_path, [_SaveEveryBatch(path)]).fit(SmallClassifier(), datamodule=_dm())  # on_client_failure="skip"
    assert not path.exists()


def test_save_checkpoint_between_rounds_holds_the_global_model(tmp_path):
    class SaveAtRoundEnd(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.save_checkpoint(tmp_path / f"round{trainer.current_epoch}.ckpt")
            self.params = [p.detach().clone() for p in pl_module.parameters()]

    saver = SaveAtRoundEnd()
    torch.manual_seed(0)
    model = SmallClassifier(dropout=0.0)
    _trainer(tmp_path, [FedAdam(lr=0.02), saver], max_epochs=2).fit(model, datamodule=_dm())
    state = torch.load(tmp_path / "round1.ckpt", weights_only=True)["state_dict"]
    for (name, p), q in zip(model.named_parameters(), saver.params):
        torch.testing.assert_close(state[name], q, rtol=0, atol=0)
        torch.testing.assert_close(state[name], p.detach(), rtol=0, atol=0)


def test_truncated_legacy_format_is_named_and_a_content_error_is_not_disguised(tmp_path):
    legacy = tmp_path / "legacy.ckpt"
    torch.save({"w": torch.ones(1000)}, legacy, _use_new_zipfile_serialization=False)
    io = AtomicCheckpointIO()
    assert io.load_checkpoint(legacy, weights_only=False)["w"].shape == (1000,)
    legacy.write_bytes(legacy.read_bytes()[:2000])
    with pytest.raises(CorruptCheckpointError, match="legacy-format .* truncated"):
        io.load_checkpoint(legacy, weights_only=False)
    intact = tmp_path / "object.ckpt"  # an intact file whose content weights_only refuses: the original error
    torch.save({"f": _Unsafe()}, intact)
    with pytest.raises(Exception, match="Weights only load failed") as info:
        io.load_checkpoint(intact, weights_only=True)
    assert not isinstance(info.value, CorruptCheckpointError)


class _Unsafe:
    pass


def test_settings_added_by_issue_34_default_to_the_old_behaviour_in_older_records():
    """#34 added ``SampledLocalWork(batch_size_upper=)`` and ``FedAWARE(warmup_rounds=, pairing=)``: a record
    without them was run with their defaults, so it resumes under the defaults and is refused under another value."""
    from lightning_fed.checkpoint import config_differences

    old = {"local_work": "SampledLocalWork", "server_optimizer": "FedAWARE"}
    new = dict(old, **{"local_work.batch_size_upper": "dataset_size", "server_optimizer.warmup_rounds": None,
                       "server_optimizer.pairing": "client_id"})
    assert config_differences(old, new) == []
    changed = dict(new, **{"server_optimizer.pairing": "public_code",
                           "local_work.batch_size_upper": "dataset_size_minus_one"})
    assert config_differences(old, changed) == [
        ("local_work.batch_size_upper", "dataset_size", "dataset_size_minus_one"),
        ("server_optimizer.pairing", "client_id", "public_code"),
    ]


# ---------------------------------------------------------------------------------------------- #43 state integrity
class _CountBatches(Callback):
    def __init__(self):
        self.batches = 0

    def on_train_batch_start(self, *args):
        self.batches += 1


def _edited(tmp_path, source, edit) -> Path:
    checkpoint = torch.load(source, weights_only=True)
    edit(checkpoint)
    path = tmp_path / "edited.ckpt"
    torch.save(checkpoint, path)
    return path


def _fedadam_state(checkpoint):
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("FedAdam")]
    return checkpoint["callbacks"][key]


def test_43_a_nan_in_fedadams_second_moment_is_refused_at_fit_start(tmp_path, two_rounds):
    """#43 case 1: one NaN in FedAdam's v (exp_avg_sq) of the checkpoint; before, the run resumed without a word,
    the first server step wrote NaN into the model, later clients were all dropped and fit returned normally."""
    path = _edited(tmp_path, two_rounds, lambda c: _fedadam_state(c)["state"]["exp_avg_sq"][0].view(-1)[3].fill_(
        float("nan")))
    counter = _CountBatches()
    with pytest.raises(ValueError, match="Cannot resume from") as info:
        _fit(tmp_path, tmp_path / "resumed", max_epochs=4, ckpt_path=str(path), callbacks_extra=[counter])
    message = str(info.value)
    assert str(path) in message
    assert "FedAdam state 'state.exp_avg_sq' for parameter 'net.0.weight' has 1 non-finite value(s) (of 80)" in message
    assert counter.batches == 0  # refused before any client trained


def test_43_nan_weights_in_a_checkpoint_are_refused_at_fit_start_naming_the_tensor(tmp_path, two_rounds):
    """#43 case 2: a non-finite global model in the checkpoint; before, every client of every round was dropped."""
    def edit(checkpoint):
        checkpoint["state_dict"]["net.3.bias"][1] = float("inf")
        checkpoint["state_dict"]["net.0.weight"][0, :2] = float("nan")

    counter = _CountBatches()
    with pytest.raises(ValueError, match="Cannot resume from") as info:
        _fit(tmp_path, tmp_path / "resumed", max_epochs=4, ckpt_path=str(_edited(tmp_path, two_rounds, edit)),
             callbacks_extra=[counter])
    message = str(info.value)
    assert "global model parameter 'net.0.weight' has 2 non-finite value(s) (of 80)" in message
    assert "global model parameter 'net.3.bias' has 1 non-finite value(s) (of 3)" in message
    assert counter.batches == 0


@pytest.mark.parametrize("edit, expected", [
    (lambda c: c["callbacks"].pop(next(k for k in c["callbacks"] if k.startswith("FedAdam"))),
     "names the server optimizer FedAdam but the checkpoint holds no state for it"),
    (lambda c: _fedadam_state(c).update(state={}), "lacks 'state.exp_avg', 'state.exp_avg_sq' (after 2 server step(s))"),
    (lambda c: _fedadam_state(c).pop("num_steps"), "lacks 'num_steps'"),
])
def test_43_a_checkpoint_without_the_server_optimizers_state_is_refused(tmp_path, two_rounds, edit, expected):
    """#43 case 3: before, a checkpoint without FedAdam's state (its record intact) resumed with a fresh FedAdam
    (step count 0, moments at their start) without a word."""
    counter = _CountBatches()
    with pytest.raises(ValueError, match="Cannot resume from") as info:
        _fit(tmp_path, tmp_path / "resumed", max_epochs=4, ckpt_path=str(_edited(tmp_path, two_rounds, edit)),
             callbacks_extra=[counter])
    assert expected in str(info.value) and "edited.ckpt" in str(info.value)
    assert counter.batches == 0


def test_43_a_scaffold_checkpoint_without_its_client_variates_is_refused(tmp_path):
    """#43 case 3: SCAFFOLD's c_i table is state the run needs: without it every c_i would restart at zero while c
    (their mean) is kept."""
    from lightning_fed.callbacks import SCAFFOLD

    _fit(tmp_path, tmp_path / "ckpt", max_epochs=1, server=SCAFFOLD())
    path = _edited(tmp_path, tmp_path / "ckpt" / "last.ckpt", lambda c: c["callbacks"][
        next(k for k in c["callbacks"] if k.startswith("SCAFFOLD"))]["aggregators"][0].update(table=None))
    with pytest.raises(ValueError, match="the saved state of the server optimizer SCAFFOLD lacks 'aggregators.0.table'"):
        _fit(tmp_path, tmp_path / "resumed", max_epochs=2, server=SCAFFOLD(), ckpt_path=str(path))


@pytest.mark.parametrize("drop", ["client_algorithms", "aggregators"])
def test_43_a_feddyn_checkpoint_without_its_tables_or_h_is_refused(tmp_path, drop):
    """#43 case 3: FedDyn's per-client table (its client half's g_k) and its server state h are needed too."""
    from lightning_fed.callbacks import FedDyn

    _fit(tmp_path, tmp_path / "ckpt", max_epochs=1, server=FedDyn())

    def edit(checkpoint):
        checkpoint["callbacks"][next(k for k in checkpoint["callbacks"] if k.startswith("FedDyn"))].pop(drop)

    path = _edited(tmp_path, tmp_path / "ckpt" / "last.ckpt", edit)
    with pytest.raises(ValueError, match=f"the saved state of the server optimizer FedDyn lacks '{drop}"):
        _fit(tmp_path, tmp_path / "resumed", max_epochs=2, server=FedDyn(), ckpt_path=str(path))


# ------------------------------------------------------------------ the federated parameters in the record (#42)
def _fit_frozen(tmp_path, ckpt_dir, max_epochs, ckpt_path=None, unfreeze=(), server=None):
    from torch.utils.data import TensorDataset

    from helpers import FrozenEncoder, regression_data

    model = FrozenEncoder()
    for name in unfreeze:
        model.get_parameter(name).requires_grad_(True)
    x, y = regression_data(n=60)
    dm = FederatedDataModule(TensorDataset(torch.tensor(x), torch.tensor(y)), partitioner=IIDPartitioner(4, seed=0),
                             clients_per_round=3, batch_size=5, seed=0)
    checkpoint = ModelCheckpoint(dirpath=str(ckpt_dir), save_last=True, save_top_k=-1, every_n_epochs=1)
    trainer = _trainer(tmp_path, [server or FedAdam(lr=0.05), checkpoint], max_epochs=max_epochs)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model, trainer


_NO_VALIDATION = "ignore:You passed in a `val_dataloader` but have no `validation_step`:UserWarning"


@pytest.mark.filterwarnings(_NO_VALIDATION)
def test_the_record_names_the_federated_parameters_and_a_resume_with_others_is_refused(tmp_path, two_rounds):
    assert "federated_parameters" not in torch.load(two_rounds, weights_only=False)["lightning_fed"]  # layout as before
    _, trainer = _fit_frozen(tmp_path, tmp_path / "a", max_epochs=2)
    saved = torch.load(tmp_path / "a" / "last.ckpt", weights_only=False)
    assert saved["lightning_fed"]["federated_parameters"] == ["head.weight", "head.bias"]
    state = saved["callbacks"][trainer.fit_loop.server_optimizer.state_key]
    assert [t.shape for t in state["state"]["exp_avg"]] == [torch.Size([1, 6]), torch.Size([1])]  # F only
    with pytest.raises(ValueError, match="now federated but frozen in the checkpoint: encoder.bias"):
        _fit_frozen(tmp_path, tmp_path / "b", max_epochs=3, ckpt_path=str(tmp_path / "a" / "last.ckpt"),
                    unfreeze=["encoder.bias"])
    # the same set resumes exactly: as the uninterrupted run
    resumed, _ = _fit_frozen(tmp_path, tmp_path / "c", max_epochs=3, ckpt_path=str(tmp_path / "a" / "last.ckpt"))
    straight, _ = _fit_frozen(tmp_path, tmp_path / "d", max_epochs=3)
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), straight.parameters()))


@pytest.mark.filterwarnings(_NO_VALIDATION)
def test_an_older_checkpoint_whose_state_covers_every_parameter_is_cut_to_the_federated_ones(tmp_path):
    _, trainer = _fit_frozen(tmp_path, tmp_path / "a", max_epochs=2)
    key = trainer.fit_loop.server_optimizer.state_key
    # the layout before issue #42: no list in the record, and FedAdam's moments over all four parameters (the frozen
    # encoder's entries first, as module.parameters() orders them)
    old = torch.load(tmp_path / "a" / "last.ckpt", weights_only=False)
    del old["lightning_fed"]["federated_parameters"]
    moments = old["callbacks"][key]["state"]
    for name in ("exp_avg", "exp_avg_sq"):
        moments[name] = [torch.zeros(6, 3, dtype=torch.float64), torch.full((6,), 1e-6, dtype=torch.float64),
                         *moments[name]]
    torch.save(old, tmp_path / "old.ckpt")
    with pytest.warns(UserWarning, match=r"frozen ones \(encoder.weight, encoder.bias\) are dropped from "
                                         r"state.exp_avg, state.exp_avg_sq"):
        migrated, trainer = _fit_frozen(tmp_path, tmp_path / "b", max_epochs=3, ckpt_path=str(tmp_path / "old.ckpt"))
    moments = trainer.fit_loop.server_optimizer.state["exp_avg"]
    assert [t.shape for t in moments] == [torch.Size([1, 6]), torch.Size([1])]
    resumed, _ = _fit_frozen(tmp_path, tmp_path / "c", max_epochs=3, ckpt_path=str(tmp_path / "a" / "last.ckpt"))
    assert all(torch.equal(a, b) for a, b in zip(migrated.parameters(), resumed.parameters()))


# ------------------------------------------------------------------ the optimizers' parameter groups on resume (#49)
class _TwoGroups(SmallClassifier):
    """The first layer's two tensors in one group, the last layer's two in another (lr 0.01)."""

    def configure_optimizers(self):
        return torch.optim.SGD([{"params": self.net[0].parameters()},
                                {"params": self.net[3].parameters(), "lr": 0.01}], lr=self.hparams.lr)


class _LastLayerOnly(SmallClassifier):
    def configure_optimizers(self):
        return torch.optim.SGD(self.net[3].parameters(), lr=self.hparams.lr)


@pytest.mark.parametrize("module, now", [(_TwoGroups, "2 of [2, 2]"), (_LastLayerOnly, "1 of [2]")],
                         ids=["two_groups", "fewer_parameters"])
def test_49_other_optimizer_parameter_groups_are_named_before_torchs_error(tmp_path, two_rounds, module, now):
    """Before: torch's "loaded state dict has a different number of parameter groups" (or "... a parameter group
    that doesn't match the size of optimizer's group"), naming neither the checkpoint nor the groups. The
    checkpoint's SmallClassifier has one SGD group of its 4 parameter tensors (two Linear layers' weight and
    bias)."""
    saved = torch.load(two_rounds, weights_only=False)["optimizer_states"]
    assert [[len(g["params"]) for g in s["param_groups"]] for s in saved] == [[4]]
    torch.manual_seed(0)
    server = FedAdam(lr=0.02)
    trainer = _trainer(tmp_path, [server], max_epochs=3)
    with pytest.raises(ValueError) as info:
        trainer.fit(module(dropout=0.0), datamodule=_dm(), ckpt_path=str(two_rounds))
    message = str(info.value)
    assert message.startswith(f"Cannot resume from {two_rounds}: the optimizers' parameter groups differ: optimizer 0 "
                              f"(SGD): the checkpoint has 1 parameter group(s) of [4] parameter tensor(s), "
                              f"configure_optimizers now gives {now}."), message
    assert server.num_steps == 2  # the checkpoint's two rounds: refused before round 2 ran


def test_52_a_record_naming_a_ready_made_server_optimizer_by_its_callbacks_path_resumes(tmp_path):
    """#52: the ready-made names moved from ``callbacks/`` into their method's module of ``algorithms/``; a checkpoint
    written before names FedProx by its old path. The same class: the run resumes to the weights of today's record."""
    from lightning_fed.callbacks import FedProx
    from lightning_fed.checkpoint import CHECKPOINT_KEY

    _fit(tmp_path, tmp_path / "first", max_epochs=1, server=FedProx(mu=0.1))
    ckpt = torch.load(tmp_path / "first" / "last.ckpt", weights_only=True)
    record = ckpt[CHECKPOINT_KEY]["run_config"]
    assert record["server_optimizer"] == "lightning_fed.algorithms.fedprox.FedProx"
    record["server_optimizer"] = "lightning_fed.callbacks.fedprox.FedProx"  # as written before the move
    torch.save(ckpt, tmp_path / "old.ckpt")
    resumed, _ = _fit(tmp_path, tmp_path / "resumed", max_epochs=2, server=FedProx(mu=0.1),
                      ckpt_path=str(tmp_path / "old.ckpt"))
    today, _ = _fit(tmp_path, tmp_path / "today", max_epochs=2, server=FedProx(mu=0.1),
                    ckpt_path=str(tmp_path / "first" / "last.ckpt"))
    for a, b in zip(resumed.parameters(), today.parameters(), strict=True):
        assert torch.equal(a, b)
