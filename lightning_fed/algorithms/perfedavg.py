"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020, Algorithm 1): FedAvg on the MAML objective
F(w) = (1/n)·Σ_i f_i(w − α∇f_i(w)), so that one gradient step of a client from the global model is a good personal
model.

Algorithm 1 (round k, client i ∈ A_k, τ local steps, step sizes α (inner) and β (outer))::

    w_{k+1,0}^i = w_k
    for t = 1 … τ:
        w̃ = w_{k+1,t−1}^i − α·∇f_i(w_{k+1,t−1}^i; D_t^i)                                        (l. 6-7)
        w_{k+1,t}^i = w_{k+1,t−1}^i − β·(I − α·∇²f_i(w_{k+1,t−1}^i; D_t''^i))·∇f_i(w̃; D_t'^i)      (l. 8)
    server:  w_{k+1} = (1/|A_k|)·Σ_{i∈A_k} w_{k+1,τ}^i                                             (l. 10)

with independent mini-batches D, D', D''. Per-FedAvg (FO) drops the Hessian term; Per-FedAvg (HF) keeps it,
``variant="hf"``: by default as the exact Hessian-vector product ∇²f_i(w; D'')·∇f_i(w̃; D') (double backward,
:func:`~lightning_fed.client.personal_grad.hessian_vector_product_at`), with ``delta`` = δ > 0 as the paper's
finite difference (Sec. 5) [∇f_i(w + δ·g; D'') − ∇f_i(w − δ·g; D'')]/(2δ), g = ∇f_i(w̃; D').

**The batches.** A local step of the client's local work is one mini-batch, so :class:`PerFedAvgClient` groups the
round's batches in order: with FO, batches 2t and 2t + 1 are D_t and D'_t; with HF, batches 3t, 3t + 1, 3t + 2 are
D_t, D'_t and D''_t. The group's earlier steps leave the model unchanged (their gradients are dropped, ``grad =
None``, so the client optimizer skips them); at its last batch the gradient becomes l. 8's meta-gradient
(I − α∇²f_i)·∇f_i(w̃; D') — so the client optimizer's step with learning rate β is l. 8 (plain SGD, no momentum or
weight decay, is the paper's). A round of n batches thus makes τ = ⌊n/2⌋ (FO) or ⌊n/3⌋ (HF) Per-FedAvg steps; the
last n mod 2 (3) batches make no step. The gradients come from the module's ``training_step``
(:func:`~lightning_fed.client.personal_grad.loss_gradient_at`). l. 10 is any server rule;
:class:`~lightning_fed.algorithms.perfedavg.PerFedAvg` is FedAvg with the uniform mean.

**The personal model** (the paper's evaluation, Sec. 5: one step of gradient descent from the global model on the
client's own data, with step size α) is :meth:`PerFedAvgClient.personal_model`: w − α∇f_i(w; D_i) with D_i the
client's first training mini-batch of the last round it trained (its round's batch size and data order,
:meth:`~lightning_fed.datamodules.FederatedDataModule.client_batches`), computed from the current global model w
whenever the personal model is asked for (``fed_personal_<m>``). The per-client state is that round's index and the
client's id, all the step needs besides the global model and the data module; a client never trained has the
global model.

Choices the paper leaves open or that differ from it: the grouping of the round's batches into (D, D', D'') above
(the paper samples them independently; the FO implementation of the pFedMe authors, github.com/CharlieDinh/pFedMe
``userperavg.py``, also takes two consecutive batches per step — its evaluation, ``train_one_step``, takes a second,
β step as well, where the paper's Sec. 5 takes one α step); the personal model's batch D_i (the paper does not fix it); BatchNorm
statistics are the global model's during the extra gradient evaluations and are put back afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.checks import ArgumentError, check_choice, check_positive
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.client.personal_grad import (
    StepBatches,
    hessian_vector_product_at,
    loss_gradient_at,
    parameter_names,
    parameters_named,
)
from lightning_fed.server.aggregators.base import Stage

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext

__all__ = ["PerFedAvg", "PerFedAvgClient"]

VARIANTS = ("fo", "hf")


class PerFedAvgClient(ClientAlgorithm):
    """Per-FedAvg's client half (Fallah et al. 2020, Alg. 1, l. 6-8): the round's batches in groups (D, D') (FO) or
    (D, D', D'') (HF); each group makes one step of the client optimizer along the MAML meta-gradient.

    Args:
        alpha: α (> 0), the inner step size of l. 7 and of the personal model's one step (default 0.005: the
            pFedMe authors' Per-FedAvg MNIST command, github.com/CharlieDinh/pFedMe README, with β = 0.001 there).
        variant: ``"fo"`` (first order, default) or ``"hf"`` (with the Hessian-vector product).
        delta: HF only: ``None`` (default) the exact Hessian-vector product; δ > 0 the paper's finite difference.

    Raises:
        ValueError: ``alpha`` / ``delta`` not a finite number > 0, ``variant`` not ``"fo"`` or ``"hf"``, ``delta``
            given with ``"fo"``; in a fit, a half run outside the federated loop (no client batches).

    Example::

        >>> PerFedAvgClient(alpha=0.02, variant="hf")
        PerFedAvgClient(alpha=0.02, variant='hf', delta=None)
    """

    def __init__(self, alpha: float = 0.005, variant: str = "fo", delta: Optional[float] = None) -> None:
        self.alpha = check_positive("alpha", alpha)
        self.variant = check_choice("variant", variant, VARIANTS)
        if delta is not None and variant != "hf":
            raise ArgumentError(f"`delta` is the HF variant's finite-difference step; it needs variant='hf', got "
                             f"variant={variant!r} with delta={delta!r}.")
        self.delta = None if delta is None else check_positive("delta", delta)
        self._params: list[Tensor] = []
        self._names: Optional[list[str]] = None
        self._batches: Optional[StepBatches] = None
        self._group: list[tuple[int, Any]] = []
        self._round = self._client = 0

    def state_dim(self, num_params: int) -> int:
        """Two numbers: the last round the client trained and its id (its personal model's batch)."""
        return 2

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        self._params = context.parameters(module)
        self._names = parameter_names(module, self._params)
        self._batches = StepBatches(context, type(self).__name__)
        self._group, self._round, self._client = [], int(context.round_idx), int(context.client_id)

    def meta_gradient(self, module: Any, params: list[Tensor], group: list[tuple[int, Any]]) -> Optional[list[Tensor]]:
        """l. 6-8's (I − α∇²f(w; D''))·∇f(w̃; D') at w = ``params``' values, ``group`` = [(idx, D), (idx, D'), …]."""
        (i, d), (i1, d1) = group[0], group[1]
        w = [p.detach().clone() for p in params]
        g = loss_gradient_at(module, params, w, d, i)
        if g is None:
            return None
        adapted = [wi - self.alpha * gi for wi, gi in zip(w, g)]  # w̃
        g1 = loss_gradient_at(module, params, adapted, d1, i1)
        if g1 is None or self.variant == "fo":
            return g1
        i2, d2 = group[2]
        if self.delta is None:
            hv = hessian_vector_product_at(module, params, w, g1, d2, i2)
        else:
            plus = loss_gradient_at(module, params, [wi + self.delta * u for wi, u in zip(w, g1)], d2, i2)
            minus = loss_gradient_at(module, params, [wi - self.delta * u for wi, u in zip(w, g1)], d2, i2)
            hv = None if plus is None or minus is None else [(a - b) / (2 * self.delta) for a, b in zip(plus, minus)]
        if hv is None:
            return None
        return [a - self.alpha * h for a, h in zip(g1, hv)]

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """Drop the gradients inside a group; at its last batch, the meta-gradient into ``.grad``."""
        if self._batches is None:
            return
        self._group.append(self._batches.next())
        meta = None
        if len(self._group) == (2 if self.variant == "fo" else 3):
            meta = self.meta_gradient(module, self._params, self._group)
            self._group = []
        for i, p in enumerate(self._params):
            p.grad = None if meta is None else meta[i].to(p)

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
        """(round, client id): the personal model's batch is the client's first of that round."""
        self._batches, self._group = None, []
        return {}, torch.tensor([float(self._round), float(self._client)], dtype=torch.float64)

    def personal_model(self, module: Any, state: Optional[Tensor]) -> None:
        """``module`` (the global model w) becomes client i's personal model w − α∇f_i(w; D_i) in place, D_i its
        first mini-batch of the last round it trained (``state``: that round and the client's id; ``None``: never
        trained, the global model). Buffers are left as they are.

        Raises:
            RuntimeError: ``module`` not attached to a trainer with a ``FederatedDataModule`` (the client's data).
        """
        if state is None:
            return
        try:
            datamodule = module.trainer.datamodule
        except RuntimeError:
            datamodule = None
        if not hasattr(datamodule, "client_dataloader"):
            raise RuntimeError("PerFedAvgClient's personal model is one step on the client's data: the module must "
                               "be attached to a trainer with a FederatedDataModule.")
        round_idx, client_id = int(state[0]), int(state[1])
        params = parameters_named(module, self._names)
        batch = next(iter(datamodule.client_dataloader(client_id, round_idx)))
        w = [p.detach().clone() for p in params]
        g = loss_gradient_at(module, params, w, batch, 0)
        if g is not None:
            with torch.no_grad():
                for p, gi in zip(params, g):
                    p.sub_(self.alpha * gi)


class PerFedAvg(FedAvg):
    """Per-FedAvg (Fallah et al., NeurIPS 2020, Alg. 1): FedAvg (uniform mean, l. 10) whose clients take MAML steps
    (see :mod:`lightning_fed.algorithms.perfedavg`); the client learning rate is β.

    Args:
        alpha: α (default 0.005).
        variant: ``"fo"`` (default) or ``"hf"``.
        delta: HF's finite-difference δ (default ``None``: the exact Hessian-vector product).
        lr: Server learning rate (default 1.0).
        weighting: ``"uniform"`` (default, l. 10) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after Per-FedAvg's (default ``None``).

    Example::

        >>> PerFedAvg(alpha=0.02, variant="hf", delta=1e-3).client_algorithms
        [PerFedAvgClient(alpha=0.02, variant='hf', delta=0.001)]
    """

    repr_fields = ("alpha", "variant", "delta", "lr", "weighting")
    #: The client half a CLI swap of the server optimizer carries into ``trainer.client_algorithms`` (its argument:
    #: this class's).
    carried_client_half = ("PerFedAvgClient", {"alpha": "alpha", "variant": "variant", "delta": "delta"})

    def __init__(self, alpha: float = 0.005, variant: str = "fo", delta: Optional[float] = None, lr: float = 1.0,
                 weighting: str = "uniform", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [PerFedAvgClient(alpha, variant, delta)]
        self.alpha, self.variant, self.delta = self._own_client[0].alpha, variant, self._own_client[0].delta
