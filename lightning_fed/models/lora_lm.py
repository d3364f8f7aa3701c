"""A small causal language model fine-tuned with LoRA, as a LightningModule (federated LoRA on Shakespeare).

Source
------
Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022 (arXiv:2106.09685): a frozen weight
``W0 [d_out, d_in]`` gets a trainable low-rank update, ``h = W0 x + (alpha / r) * B A x`` with ``A [r, d_in]``
(random init) and ``B [d_out, r]`` (zero init, so training starts at the base model). Only ``A`` and ``B`` are
trained. Here the base is a GPT-2 style decoder (Radford et al. 2019) from Hugging Face ``transformers`` and the
adapters are ``peft``'s ``LoraConfig`` / ``get_peft_model``.

The base model is built from a config, **randomly initialised** (GPT-2's N(0, 0.02) init, drawn from its own
generator seeded by ``init_seed``, independent of the global seed): nothing is downloaded, and LoRA then adapts a
random frozen network -- a test bed for federated parameter-efficient fine-tuning (what travels, what the server
keeps, memory), not a way to get a good Shakespeare model. A real pretrained causal LM plugs in by name with
``pretrained="<hub name or local folder>"`` (``transformers.AutoModelForCausalLM.from_pretrained``; the only
download this module may do, and only then); its embedding must cover the data's token ids (``vocab_size``).

Requires the optional extra: ``pip install "lightning_fed[llm]"`` (transformers, peft). Importing
``lightning_fed`` does not import them; constructing :class:`LoRACausalLM` without them raises ``ImportError``
saying so.

Data: the Shakespeare task's ``(input [B, 80], target [B, 80])`` int64 character ids
(:mod:`lightning_fed.datamodules.tasks.shakespeare`: pad 0, characters 1..86, OOV 87, BOS 88, EOS 89; 90 ids), the
same batches as :class:`~lightning_fed.models.ShakespeareLSTM`. Loss, metrics and logging are those of
``char_lstm.NextTokenModel`` (mean cross-entropy over non-pad targets; ``val_acc``
counts every non-pad target). Pad only ever trails a sequence, so causal attention needs no attention mask.
"""

from __future__ import annotations

import hashlib
import importlib
import warnings
from typing import Any, Optional, Sequence

import torch

from lightning_fed.checks import check_positive, check_unit_interval
from lightning_fed.models.char_lstm import PAD_ID, NextTokenModel
from lightning_fed.models.stackoverflow import _check_pos_int, _check_sgd

__all__ = ["LoRACausalLM", "require_llm_extra"]

#: What to install for :class:`LoRACausalLM` (printed by :func:`require_llm_extra`).
LLM_EXTRA = 'pip install "lightning_fed[llm]"'

#: Key under which an adapter-only checkpoint records the frozen base it was trained on.
BASE_RECORD_KEY = "lora_causal_lm_base"

#: The attention kernels :class:`LoRACausalLM` accepts (``None``: transformers' default).
ATTN_IMPLEMENTATIONS = (None, "sdpa", "eager")

#: GPT-2 architecture defaults used when ``pretrained`` is None (3.2 M base parameters with ``vocab_size=90``).
DEFAULT_ARCH = {"n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 80}


def require_llm_extra() -> tuple[Any, Any]:
    """Import and return ``(transformers, peft)``, or raise ``ImportError`` naming the extra to install.

    Raises:
        ImportError: ``transformers`` or ``peft`` is not installed; the message says
            ``pip install "lightning_fed[llm]"``.

    Example::

        >>> try:
        ...     transformers, peft = require_llm_extra()
        ... except ImportError as err:
        ...     assert 'lightning_fed[llm]' in str(err)
    """
    modules = []
    for name in ("transformers", "peft"):
        try:
            modules.append(importlib.import_module(name))
        except ImportError as err:
            raise ImportError(
                f"LoRACausalLM needs `{name}` (the optional `llm` extra), which is not installed: {LLM_EXTRA}"
            ) from err
    return modules[0], modules[1]


class LoRACausalLM(NextTokenModel):
    """A GPT-2 style causal LM with frozen base weights and trainable LoRA adapters (Hu et al. 2021).

    Args:
        vocab_size: token ids of the data (default 90: the Shakespeare task's pad + 86 characters + OOV + BOS +
            EOS). The random-init model's vocabulary; with ``pretrained``, its embedding must have at least that
            many rows (``ValueError`` otherwise).
        n_layer: transformer blocks of the random-init GPT-2 base (default ``None`` = 4). This and the next three
            are refused (``ValueError``) together with ``pretrained``: the architecture then comes from the model.
        n_embd: width (default ``None`` = 256); divisible by ``n_head``.
        n_head: attention heads (default ``None`` = 4).
        n_positions: positions (default ``None`` = 80); at least the sequence length (80 on Shakespeare).
        dropout: GPT-2's residual, embedding and attention dropout of the random-init base (default 0.0).
        lora_r: adapter rank ``r`` (default 8).
        lora_alpha: LoRA scale numerator; the update is scaled by ``lora_alpha / lora_r`` (default 16).
        lora_dropout: dropout on the adapters' input (default 0.0).
        target_modules: names (suffixes) of the linear layers that get adapters (default ``("c_attn",)``, GPT-2's
            fused query/key/value projection: the paper adapts the attention projections). ``"attn.c_proj"``,
            ``"c_fc"``, ``"mlp.c_proj"`` name GPT-2's other projections.
        lr: client SGD learning rate (default 1.0); the client optimizer is ``SGD`` over the trainable
            parameters (the adapters) only.
        momentum: client SGD momentum (default 0.0).
        init_seed: seed of the random-init base and of the adapters' ``A`` init (default 0). The frozen base is
            a function of the architecture and this seed, which is what lets checkpoints hold the adapters only.
        pretrained: ``None`` (default: random init from the config above) or a Hugging Face model name / local
            folder for ``AutoModelForCausalLM.from_pretrained`` (downloads if it is a hub name; not used in tests).
        adapter_only_checkpoint: drop the frozen base weights from Lightning checkpoints (default ``True``); the
            checkpoint keeps a SHA-256 of the base, and loading checks it against the model being restored
            (``RuntimeError`` naming both on a mismatch), then puts the base back. ``False`` saves everything.
            A base tensor unfrozen by hand (``requires_grad_(True)``) is saved with the adapters and left out of
            the fingerprint under every name that holds it: GPT-2's tied ``wte`` / ``lm_head`` weight, unfrozen
            under either name, is saved once and loads back into both (still one tensor).
        accuracy_masked_tokens: target ids that ``val_acc``/``test_acc`` do not count (default ``(0,)``: pad).
        attn_implementation: ``transformers``' attention kernel: ``None`` (default: its own choice, ``"sdpa"``),
            ``"sdpa"`` or ``"eager"``. ``"eager"`` is plain matmuls, which ``torch.func.vmap`` (the vectorized
            executor) batches; torch has no batching rule for SDPA's CPU kernel and loops over it (a
            ``UserWarning``).

    Shapes:
        ``forward(x)``: ``x`` int64 ``[B, T]`` (``T <= n_positions``) -> logits float32 ``[B, T, V]`` with V the
        model's vocabulary (``vocab_size`` for the random-init base). Batches are ``(input [B, T], target [B,
        T])``.

    Attributes:
        model: the ``peft`` ``PeftModelForCausalLM`` wrapping the base; only its ``lora_A`` / ``lora_B`` weights
            have ``requires_grad``.

    Raises:
        ImportError: the ``llm`` extra is not installed (``pip install "lightning_fed[llm]"``).
        ValueError: a non-positive size, ``n_embd`` not divisible by ``n_head``, a bad ``lr``/``momentum``/
            dropout, empty ``target_modules``, an unknown ``attn_implementation``, an architecture argument with
            ``pretrained``, a pretrained vocabulary smaller than ``vocab_size``.

    Example (needs the ``llm`` extra; a tiny base: 2 layers, width 16)::

        >>> import pytest, torch
        >>> _ = pytest.importorskip("peft"), pytest.importorskip("transformers")
        >>> model = LoRACausalLM(n_layer=2, n_embd=16, n_head=2, lora_r=4)
        >>> model(torch.zeros(3, 80, dtype=torch.long)).shape
        torch.Size([3, 80, 90])
        >>> model.num_parameters(trainable=True), model.num_parameters()  # 2 layers x 4 * 4 * 16 adapters
        (512, 9824)
        >>> [g["params"][0].shape for g in model.configure_optimizers().param_groups]  # SGD on adapters only
        [torch.Size([4, 16])]
    """

    def __init__(
        self,
        vocab_size: int = 90,
        n_layer: Optional[int] = None,
        n_embd: Optional[int] = None,
        n_head: Optional[int] = None,
        n_positions: Optional[int] = None,
        dropout: float = 0.0,
        lora_r: int = 8,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.0,
        target_modules: Sequence[str] = ("c_attn",),
        lr: float = 1.0,
        momentum: float = 0.0,
        init_seed: int = 0,
        pretrained: Optional[str] = None,
        adapter_only_checkpoint: bool = True,
        accuracy_masked_tokens: Sequence[int] = (PAD_ID,),
        attn_implementation: Optional[str] = None,
    ) -> None:
        super().__init__()
        _check_pos_int("vocab_size", vocab_size)
        _check_pos_int("lora_r", lora_r)
        _check_sgd(lr, momentum)
        arch = {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_positions": n_positions}
        for name, value in (("dropout", dropout), ("lora_dropout", lora_dropout)):
            check_unit_interval(name, value)
        check_positive("lora_alpha", lora_alpha)
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"`attn_implementation` must be one of {ATTN_IMPLEMENTATIONS}, got "
                             f"{attn_implementation!r}.")
        if isinstance(target_modules, str) or not target_modules or not all(
                isinstance(t, str) and t for t in target_modules):
            raise ValueError(f"`target_modules` must be a non-empty list of module names, got {target_modules!r}.")
        if pretrained is not None:
            given = [name for name, value in arch.items() if value is not None]
            if given:
                raise ValueError(f"`{given[0]}` cannot be combined with `pretrained` (the architecture comes from "
                                 f"{pretrained!r}); leave it unset.")
        else:
            arch = {name: DEFAULT_ARCH[name] if value is None else _check_pos_int(name, value)
                    for name, value in arch.items()}
            if arch["n_embd"] % arch["n_head"]:
                raise ValueError(f"`n_embd` ({arch['n_embd']}) must be divisible by `n_head` ({arch['n_head']}).")
        self.save_hyperparameters()
        transformers, peft = require_llm_extra()

        # The base and the adapters' A init come from their own generator (init_seed), not the global one.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(init_seed))
            if pretrained is None:
                config = transformers.GPT2Config(
                    vocab_size=vocab_size, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                    bos_token_id=None, eos_token_id=None, pad_token_id=None, **arch,
                    **({} if attn_implementation is None else {"attn_implementation": attn_implementation}))
                base = transformers.GPT2LMHeadModel(config)
            else:
                base = transformers.AutoModelForCausalLM.from_pretrained(
                    pretrained, **({} if attn_implementation is None else {"attn_implementation": attn_implementation}))
                rows = base.get_input_embeddings().num_embeddings
                if rows < vocab_size:
                    raise ValueError(f"`pretrained` {pretrained!r} embeds {rows} token ids, fewer than "
                                     f"`vocab_size` = {vocab_size}.")
            lora = peft.LoraConfig(
                r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=list(target_modules),
                # GPT-2 stores its projections as Conv1D ([d_in, d_out]); peft must know
                fan_in_fan_out=getattr(base.config, "model_type", None) == "gpt2", bias="none")
            with warnings.catch_warnings():
                # peft 0.21 calls transformers' deprecated `is_gradient_checkpointing` (third-party, harmless)
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.model = peft.get_peft_model(base, lora)
        self.init_metrics(accuracy_masked_tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``[B, T, V]`` for int64 token ids ``x`` ``[B, T]``."""
        return self.model(input_ids=x, use_cache=False).logits

    def num_parameters(self, trainable: bool = False) -> int:
        """Number of parameters of the model (``trainable=True``: only those with ``requires_grad``, the adapters)."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad or not trainable)

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The trainable tensors by their ``state_dict`` name: what an adapter-only save holds.

        The adapters, plus any base tensor unfrozen by hand (``requires_grad_(True)``). A tensor held under several
        names (tied weights: GPT-2's ``transformer.wte.weight`` and ``lm_head.weight``) is one entry, under its
        first ``state_dict`` name; it is trainable when any of its names is (:meth:`tied_names` lists the others).
        """
        state = self.state_dict(keep_vars=True)
        return {group[0]: state[group[0]].detach() for group in self._tensor_groups()
                if any(state[n].requires_grad for n in group)}

    def tied_names(self) -> dict[str, str]:
        """``{alias: name}`` for every ``model.*`` ``state_dict`` name that holds the same tensor (same storage,
        offset, shape, strides) as an earlier name. GPT-2's tied embedding gives
        ``{"model.base_model.model.lm_head.weight": "model.base_model.model.transformer.wte.weight"}``.

        Example (needs the ``llm`` extra)::

            >>> import pytest
            >>> _ = pytest.importorskip("peft"), pytest.importorskip("transformers")
            >>> model = LoRACausalLM(n_layer=1, n_embd=8, n_head=2, lora_r=2)
            >>> {alias.split(".")[-2]: name.split(".")[-2] for alias, name in model.tied_names().items()}
            {'lm_head': 'wte'}
            >>> _ = model.model.base_model.model.lm_head.weight.requires_grad_(True)  # unfreeze the tied pair
            >>> [name.split(".")[-3:-1] for name in model.adapter_state_dict()]  # A, B and the pair once
            [['transformer', 'wte'], ['lora_A', 'default'], ['lora_B', 'default']]
        """
        return {alias: group[0] for group in self._tensor_groups() for alias in group[1:]}

    def _tensor_groups(self) -> list[list[str]]:
        """The ``model.*`` ``state_dict`` names grouped by the tensor they hold, in ``state_dict`` order."""
        groups: dict[Any, list[str]] = {}
        for name, t in self.state_dict(keep_vars=True).items():
            if not name.startswith("model."):
                continue
            key = ((t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
                    t.dtype) if t.numel() else name)
            groups.setdefault(key, []).append(name)
        return list(groups.values())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain SGD (ClientOpt) over the trainable parameters (the adapters): ``SGD(adapters, lr, momentum)``."""
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.SGD(params, lr=self.hparams.lr, momentum=self.hparams.momentum)

    # ------------------------------------------------------------------------------ adapter-only checkpoints
    def _frozen_names(self, trained: Optional[set[str]] = None) -> list[str]:
        """``model.*`` names not in ``trained`` (default: this model's trainable tensors under all their names)."""
        if trained is None:
            trained = set(self.adapter_state_dict())
            trained |= {alias for alias, name in self.tied_names().items() if name in trained}
        return [name for name in self.state_dict(keep_vars=True) if name.startswith("model.")
                and name not in trained]

    def base_fingerprint(self, trained: Optional[Sequence[str]] = None) -> str:
        """SHA-256 over the frozen base's tensors (names, dtypes, shapes, bytes), in ``state_dict`` order.

        Args:
            trained: ``state_dict`` names left out (default ``None``: this model's trainable tensors under every
                name that holds them, so a tied tensor unfrozen under one name is left out under the other too).
        """
        digest = hashlib.sha256()
        state = self.state_dict()
        for name in self._frozen_names(None if trained is None else set(trained)):
            t = state[name].detach().cpu().contiguous()
            digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return digest.hexdigest()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """With ``adapter_only_checkpoint``: remove the frozen base from ``checkpoint["state_dict"]`` and record
        its fingerprint under ``checkpoint["lora_causal_lm_base"]``. A trainable tensor held under several names
        (an unfrozen tied embedding) is saved once, under its first name; ``"aliases"`` records the others."""
        if not self.hparams.adapter_only_checkpoint:
            return
        trainable = set(self.adapter_state_dict())
        aliases = {alias: name for alias, name in self.tied_names().items() if name in trainable}
        frozen = self._frozen_names(trainable | set(aliases))
        state = checkpoint["state_dict"]
        for name in [*frozen, *aliases]:
            state.pop(name, None)
        checkpoint[BASE_RECORD_KEY] = {"sha256": self.base_fingerprint(), "tensors": len(frozen),
                                       "pretrained": self.hparams.pretrained, "init_seed": self.hparams.init_seed,
                                       "aliases": aliases}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """An adapter-only checkpoint: check the fingerprint of the base it froze (every ``model.*`` name it does
        not hold, nor lists in ``"aliases"``) on this model, then put this model's frozen base back into
        ``checkpoint["state_dict"]`` and each alias's saved tensor under the alias too, so that Lightning's strict
        load sees every key (tied names load the same values and stay one tensor)."""
        record = checkpoint.get(BASE_RECORD_KEY)
        if record is None:
            return
        state_dict = checkpoint["state_dict"]
        aliases = dict(record.get("aliases", {}))
        trained = {name for name in state_dict if name.startswith("model.")} | set(aliases)
        mine = self.base_fingerprint(trained)
        if record["sha256"] != mine:
            raise RuntimeError(
                f"The checkpoint's adapters were trained on another frozen base (base SHA-256 {record['sha256'][:16]}"
                f"…, pretrained={record['pretrained']!r}, init_seed={record['init_seed']}) than this model's "
                f"({mine[:16]}…, pretrained={self.hparams.pretrained!r}, init_seed={self.hparams.init_seed}).")
        state = self.state_dict()
        for name in self._frozen_names(trained):
            state_dict.setdefault(name, state[name])
        for alias, name in aliases.items():
            state_dict[alias] = state_dict[name]
