"""LoRACausalLM: federated LoRA keeps the frozen base bit-identical and moves the adapters; adapter-only
checkpoints; argument errors; the package imports without the `llm` extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_fed.models.lora_lm import LoRACausalLM

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(n_layer=2, n_embd=16, n_head=2, lora_r=4)


def _needs_extra():
    pytest.importorskip("transformers")
    pytest.importorskip("peft")


def _token_data(n: int = 24, seed: int = 0) -> TensorDataset:
    """Shakespeare-shaped batches: 80 character ids in 1..89, then trailing pad (0), target = input shifted."""
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(1, 90, (n, 81), generator=g)
    for i, length in enumerate(torch.randint(20, 82, (n,), generator=g).tolist()):
        seq[i, length:] = 0
    return TensorDataset(seq[:, :80].clone(), seq[:, 1:].clone())


def _fit(model, tmp_path, rounds: int = 2, executor=None, ckpt_path=None, **trainer_kwargs):
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import FedAdam
    from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner

    dm = FederatedDataModule(_token_data(), val_dataset=_token_data(8, seed=1),
                             partitioner=IIDPartitioner(num_clients=4, seed=0), clients_per_round=2, batch_size=4,
                             seed=0)
    kwargs = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  num_sanity_val_steps=0, accelerator="cpu", devices=1, default_root_dir=tmp_path)
    kwargs.update(trainer_kwargs)
    trainer = FederatedTrainer(max_epochs=rounds, callbacks=[FedAdam(lr=0.01, tau=1e-3)], client_executor=executor,
                               **kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return trainer


# the vectorized executor runs GPT-2's SDPA attention under vmap through torch's (slow, correct) batching fallback
@pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet implemented the batching")
@pytest.mark.parametrize("executor, attn", [("sequential", None), ("vectorized", None), ("vectorized", "eager")])
def test_federated_lora_keeps_the_base_and_trains_the_adapters(tmp_path, executor, attn):
    """Two FedAdam rounds, sequential and vectorized executor: every frozen base tensor ends bit-identical, every
    adapter tensor moved (B starts at 0), the round loss and the validation loss are finite; only the adapters have
    requires_grad. The two executors give the same adapters up to rounding."""
    _needs_extra()
    from lightning_fed.vectorized import VectorizedExecutor

    torch.manual_seed(0)
    model = LoRACausalLM(**TINY, attn_implementation=attn)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adapters = set(model.adapter_state_dict())
    assert adapters and all(".lora_A." in k or ".lora_B." in k for k in adapters)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == adapters
    assert all(torch.count_nonzero(before[k]) == 0 for k in adapters if ".lora_B." in k)

    vectorized = VectorizedExecutor(on_unsupported="raise") if executor == "vectorized" else None
    trainer = _fit(model, tmp_path, executor=vectorized)

    assert trainer.current_epoch == 2
    after = model.state_dict()
    frozen = [k for k in before if k.startswith("model.") and k not in adapters]
    assert len(frozen) > 20
    changed = [k for k in frozen if not torch.equal(before[k], after[k])]
    assert changed == [], changed
    still = [k for k in adapters if torch.equal(before[k], after[k])]
    assert still == [], still
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["round_train_loss"]) and torch.isfinite(metrics["val_loss"])
    if executor == "vectorized":
        torch.manual_seed(0)
        reference = LoRACausalLM(**TINY, attn_implementation=attn)
        _fit(reference, tmp_path / "sequential")
        for k in adapters:
            torch.testing.assert_close(after[k], reference.state_dict()[k], rtol=1e-4, atol=1e-6)


def test_adapter_only_checkpoint_round_trip(tmp_path):
    """A checkpoint holds the adapters and the base's fingerprint, not the base; it loads back bit for bit into a
    model with the same base and is refused, naming the mismatch, by a model with another base (init_seed)."""
    _needs_extra()
    model = LoRACausalLM(**TINY)
    trainer = _fit(model, tmp_path, rounds=1)
    path = tmp_path / "lora.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    assert set(k for k in checkpoint["state_dict"] if k.startswith("model.")) == set(model.adapter_state_dict())
    assert checkpoint["lora_causal_lm_base"]["sha256"] == model.base_fingerprint()

    restored = LoRACausalLM.load_from_checkpoint(path)
    for k, v in model.state_dict().items():
        assert torch.equal(restored.state_dict()[k], v), k

    full = LoRACausalLM(**TINY, adapter_only_checkpoint=False)
    full_trainer = _fit(full, tmp_path / "full", rounds=1)
    full_trainer.save_checkpoint(tmp_path / "full.ckpt")
    assert path.stat().st_size < (tmp_path / "full.ckpt").stat().st_size

    with pytest.raises(RuntimeError, match="another frozen base.*init_seed=0.*init_seed=1"):
        LoRACausalLM.load_from_checkpoint(path, init_seed=1)


def test_resume_from_an_adapter_only_checkpoint_is_bit_for_bit(tmp_path):
    """Three FedAdam rounds straight equal one round, an adapter-only checkpoint, and two resumed rounds into a
    freshly built model (the base rebuilt from the config, the adapters and the server state from the file)."""
    _needs_extra()
    straight = LoRACausalLM(**TINY)
    _fit(straight, tmp_path / "straight", rounds=3)

    first = LoRACausalLM(**TINY)
    trainer = _fit(first, tmp_path / "first", rounds=1)
    path = tmp_path / "round1.ckpt"
    trainer.save_checkpoint(path)
    resumed = LoRACausalLM(**TINY)
    _fit(resumed, tmp_path / "resumed", rounds=3, ckpt_path=str(path))
    for k, v in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k


WTE = "model.base_model.model.transformer.wte.weight"
LM_HEAD = "model.base_model.model.lm_head.weight"


def _tied_trained(**kwargs) -> LoRACausalLM:
    """TINY with GPT-2's tied embedding unfrozen through its alias `lm_head.weight` (the name that
    `named_parameters` leaves out): the adapters and the one tensor wte = lm_head train."""
    model = LoRACausalLM(**TINY, **kwargs)
    model.model.base_model.model.lm_head.weight.requires_grad_(True)
    return model


def _sha256(state, names) -> str:
    """The documented fingerprint, written out here: SHA-256 over name|dtype|shape| and the bytes, in order."""
    import hashlib

    digest = hashlib.sha256()
    for name in names:
        t = state[name].contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode() + t.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def test_unfrozen_tied_embedding_is_saved_once_and_loads_back_tied(tmp_path):
    """Issue #49: with the tied wte/lm_head trained, the fingerprint covers exactly the frozen tensors (neither
    name of the tied pair), the checkpoint holds the pair once (under wte) and names lm_head as its alias, and it
    loads back bit for bit into a fresh model -- with the pair still one tensor -- instead of being refused as
    "another frozen base"; another base (init_seed) is still refused."""
    _needs_extra()
    model = _tied_trained()
    wte = model.model.base_model.model.transformer.wte.weight
    assert wte is model.model.base_model.model.lm_head.weight
    before = wte.detach().clone()
    assert set(model.adapter_state_dict()) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert WTE in model.adapter_state_dict() and LM_HEAD not in model.adapter_state_dict()
    trainer = _fit(model, tmp_path, rounds=1)
    assert not torch.equal(wte, before)  # the pair trained, through both uses

    state = model.state_dict()
    frozen = [k for k in state if k.startswith("model.") and ".lora_" not in k and k not in (WTE, LM_HEAD)]
    assert len(frozen) == len([k for k in state if k.startswith("model.")]) - 2 - 4  # 2 layers x (A, B)
    assert model.base_fingerprint() == _sha256(state, frozen)
    assert model.base_fingerprint() == _sha256(LoRACausalLM(**TINY).state_dict(), frozen)  # the base is untouched

    path = tmp_path / "tied.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    saved = [k for k in checkpoint["state_dict"] if k.startswith("model.")]
    assert WTE in saved and LM_HEAD not in saved and len(saved) == 5
    assert checkpoint["lora_causal_lm_base"]["aliases"] == {LM_HEAD: WTE}
    assert checkpoint["lora_causal_lm_base"]["sha256"] == _sha256(state, frozen)

    fresh = LoRACausalLM(**TINY)  # the pair frozen: its own fingerprint covers it, the checkpoint's does not
    assert fresh.base_fingerprint() != model.base_fingerprint()
    assert fresh.base_fingerprint(saved + [LM_HEAD]) == model.base_fingerprint()
    restored = LoRACausalLM.load_from_checkpoint(path)  # a fresh model (tied pair frozen): loads for inference
    for k, v in state.items():
        assert torch.equal(restored.state_dict()[k], v), k
    assert restored.model.base_model.model.lm_head.weight is restored.model.base_model.model.transformer.wte.weight

    with pytest.raises(RuntimeError, match="another frozen base.*init_seed=0.*init_seed=1"):
        LoRACausalLM.load_from_checkpoint(path, init_seed=1)


def test_resume_with_an_unfrozen_tied_embedding_is_bit_for_bit(tmp_path):
    """Three FedAdam rounds straight equal one round, an adapter-only checkpoint holding the tied pair once, and two
    resumed rounds into a fresh model with the same pair unfrozen; the pair is one tensor all along."""
    _needs_extra()
    straight = _tied_trained()
    _fit(straight, tmp_path / "straight", rounds=3)

    trainer = _fit(_tied_trained(), tmp_path / "first", rounds=1)
    path = tmp_path / "round1.ckpt"
    trainer.save_checkpoint(path)
    resumed = _tied_trained()
    _fit(resumed, tmp_path / "resumed", rounds=3, ckpt_path=str(path))
    inner = resumed.model.base_model.model
    assert inner.lm_head.weight is inner.transformer.wte.weight and inner.lm_head.weight.requires_grad
    for k, v in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k
    assert not torch.equal(straight.state_dict()[WTE], LoRACausalLM(**TINY).state_dict()[WTE])


def test_pretrained_model_from_a_local_folder(tmp_path):
    """``pretrained`` loads with ``from_pretrained`` (here a folder, no download): its architecture is used, the
    architecture arguments and a vocabulary smaller than ``vocab_size`` are refused by name."""
    _needs_extra()
    import transformers

    config = transformers.GPT2Config(vocab_size=100, n_positions=32, n_embd=8, n_layer=1, n_head=2)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "tiny")
    model = LoRACausalLM(pretrained=str(tmp_path / "tiny"), lora_r=2)
    assert model.model.base_model.model.config.n_embd == 8 and model.num_parameters(trainable=True) == 2 * (8 + 24)
    assert model(torch.randint(0, 90, (2, 20))).shape == (2, 20, 100)
    with pytest.raises(ValueError, match="embeds 100 token ids, fewer than `vocab_size` = 256"):
        LoRACausalLM(pretrained=str(tmp_path / "tiny"), vocab_size=256)


def test_default_vocabulary_is_the_shakespeare_tasks():
    """The defaults embed the Shakespeare task's ids (pad 0 masked, 90 ids) and hold its 80-token inputs."""
    import inspect

    from lightning_fed.datamodules.tasks import shakespeare as shk
    from lightning_fed.models import lora_lm

    defaults = {k: p.default for k, p in inspect.signature(LoRACausalLM).parameters.items()}
    assert defaults["vocab_size"] == shk.VOCAB_SIZE and lora_lm.PAD_ID == shk.PAD_ID
    assert defaults["accuracy_masked_tokens"] == (shk.PAD_ID,)
    assert lora_lm.DEFAULT_ARCH["n_positions"] >= shk.CHUNK_LENGTH - 1


def test_shapes_parameter_counts_and_seeded_base():
    _needs_extra()
    model = LoRACausalLM(**TINY)
    torch.manual_seed(123)  # the global seed does not change the base (init_seed does)
    again = LoRACausalLM(**TINY)
    assert model.base_fingerprint() == again.base_fingerprint()
    assert LoRACausalLM(**TINY, init_seed=1).base_fingerprint() != model.base_fingerprint()
    x = torch.randint(0, 90, (2, 80))
    assert model(x).shape == (2, 80, 90) and model(x).dtype == torch.float32
    # LoRA on GPT-2's fused qkv projection c_attn [16 -> 48]: A [4, 16] + B [48, 4] per layer
    assert model.num_parameters(trainable=True) == 2 * (4 * 16 + 48 * 4)
    three = LoRACausalLM(**TINY, target_modules=["c_attn", "attn.c_proj", "c_fc"])
    assert three.num_parameters(trainable=True) == 2 * 4 * (16 + 48 + 16 + 16 + 16 + 64)
    opt = LoRACausalLM(**TINY, lr=0.5, momentum=0.9).configure_optimizers()
    assert type(opt) is torch.optim.SGD and opt.defaults["lr"] == 0.5 and opt.defaults["momentum"] == 0.9
    assert all(p.requires_grad for g in opt.param_groups for p in g["params"])
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_parameters(trainable=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_layer=0), "`n_layer` must be an integer >= 1, got 0"),
    (dict(n_embd=18, n_head=4), "`n_embd` \\(18\\) must be divisible by `n_head` \\(4\\)"),
    (dict(lora_r=0), "`lora_r` must be an integer >= 1, got 0"),
    (dict(lora_alpha=0), "`lora_alpha` must be a finite number > 0, got 0"),
    (dict(lora_dropout=1.0), "`lora_dropout` must be a number in \\[0, 1\\)"),
    (dict(dropout=-0.1), "`dropout` must be a number in \\[0, 1\\)"),
    (dict(target_modules="c_attn"), "`target_modules` must be a non-empty list"),
    (dict(target_modules=[]), "`target_modules` must be a non-empty list"),
    (dict(lr=0.0), "`lr` must be a finite number > 0, got 0.0"),
    (dict(pretrained="gpt2", n_layer=2), "`n_layer` cannot be combined with `pretrained`"),
    (dict(attn_implementation="flash"), "`attn_implementation` must be one of \\(None, 'sdpa', 'eager'\\)"),
])
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoRACausalLM(**kwargs)


def test_package_imports_without_the_llm_extra_and_the_model_says_what_to_install():
    """With transformers and peft unimportable, `lightning_fed` (and its CLI, models) still import, and building
    the model raises ImportError naming the extra."""
    code = (
        "import importlib.abc, importlib.metadata as md, sys\n"
        "HIDDEN = ('transformers', 'peft')\n"
        "class Hide(importlib.abc.MetaPathFinder):  # an environment where the extra is not installed\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in HIDDEN:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "def hide(real):\n"
        "    def lookup(name, *args, **kwargs):\n"
        "        if name in HIDDEN:\n"
        "            raise md.PackageNotFoundError(name)\n"
        "        return real(name, *args, **kwargs)\n"
        "    return lookup\n"
        "md.version, md.distribution = hide(md.version), hide(md.distribution)\n"
        "import lightning_fed, lightning_fed.cli, lightning_fed.models\n"
        "from lightning_fed.models import LoRACausalLM\n"
        "assert 'transformers' not in sys.modules and 'peft' not in sys.modules\n"
        "try:\n"
        "    LoRACausalLM()\n"
        "except ImportError as err:\n"
        "    print('ERR', err)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert 'ERR LoRACausalLM needs `transformers` (the optional `llm` extra), which is not installed: ' \
           'pip install "lightning_fed[llm]"' in out.stdout
