"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, Algorithm 1) as one unit:
the client half :class:`FedDynClient` (the dynamic regulariser, with the client's stored gradient ∇L_k(θ_k^{t−1})
as its per-client state) and the server half :class:`FedDynCorrection` (the reducer that keeps h and subtracts
h/α from the mean of the clients' updates). :class:`~lightning_fed.algorithms.feddyn.FedDyn` is the two under server SGD
with η = 1, the paper's method.

Algorithm 1, with P_t the round's cohort, N (the paper's m) all clients, θ^{t−1} the global model sent out::

    client k ∈ P_t:   θ_k^t = argmin_θ  L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2‖θ − θ^{t−1}‖²     (A1, local objective)
                      ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α(θ_k^t − θ^{t−1})                    (A2, local gradient)
    k ∉ P_t:          θ_k^t = θ_k^{t−1},  ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1})                       (unchanged)
    server:           h^t = h^{t−1} − (α/N)·Σ_{k∈P_t} (θ_k^t − θ^{t−1})                          (A3, server state)
                      θ^t = (1/|P_t|)·Σ_{k∈P_t} θ_k^t − h^t/α                                    (A4, server model)

with the inputs ∇L_k(θ_k^0) = 0 and h^0 = 0 (A1-A4 label Alg. 1's four "Set ..." steps, in its order).

Here, g_k = ∇L_k(θ_k^{t−1}) (zeros for a client never seen) is one flat vector of
the model's size per client, kept by the server optimizer's client-state table and sent to the client with x_t; the
argmin of A1 is the client's local work (its own optimizer, epochs/steps, batches) on the gradient
``∇L_k(θ) − g_k + α(θ − θ^{t−1})``; A4 is the pseudo-gradient Δ_t = mean_k Δ_k − h^t/α with Δ_k = θ_k^t − θ^{t−1},
applied by the server rule (SGD with η = 1 gives A4 exactly).

Choices, and where the peers differ (read, not copied):

* **Uniform mean over the clients that reported** (A4's 1/|P_t|; the authors' code, ``np.mean(clnt_params_list
  [selected_clnts])`` in utils_methods.py ``train_FedDyn``; Flower's DepthFL baseline, strategy.py; FedLab's
  ``Aggregators.fedavg_aggregate`` without weights). ``weighting="num_samples"`` is refused at fit start rather
  than offered: h^t tracks the plain mean (1/N)Σ_k ∇L_k(θ_k^t) over all clients, and Acar et al.'s analysis pairs it
  with the unweighted mean of A4; a sample-weighted A4 beside an unweighted h is a variant none of the peers runs,
  and its results would not be FedDyn's.
* **h's update sums the clients' own drifts** Σ_{k∈P_t}(θ_k^t − θ^{t−1}) (so that h^t = (1/N)Σ_k ∇L_k(θ_k^t) — the
  authors' code keeps exactly this, ``cld_mdl_param = avg + np.mean(local_param_list, axis=0)`` with
  ``local_param_list[k] += θ_k − θ``, and Flower's DepthFL baseline too). FedLab (fedlab/contrib/algorithm/
  feddyn.py, ``FedDynServerHandler.global_update``) reads A3 literally as (Σ_k θ_k^t) − θ^{t−1}, subtracting
  θ^{t−1} once; we do not.
* **N** is the data module's ``num_clients`` (``RoundInfo.num_clients``), all clients, as A3 and all three peers.
* **Where the α/2‖θ‖² part goes.** The authors put α‖θ‖²/2 into SGD's ``weight_decay`` (utils_general.py
  ``train_feddyn_mdl``: ``weight_decay=alpha_coef+weight_decay``) and α⟨θ, −θ^{t−1} − g_k/α⟩ into the loss, so their
  gradient clipping (max_norm = 10) sees the linear term but not α·θ; FedLab puts all three terms in the loss.
  Here the whole correction −g_k + α(θ − θ^{t−1}) is added to the gradient before the client optimizer steps
  (Lightning's ``on_before_optimizer_step``: before gradient clipping, after AMP unscaling), the same gradient
  as both for plain SGD without clipping. The user's own weight decay, if any, stays in its optimizer.
* **Per-client α.** The authors scale α per client, α_k = α / (n_k·N/Σ_j n_j) (``alpha_coef_adpt``); the paper's
  Alg. 1 uses one α, which we follow (for equal client sizes the two agree).
* **What h covers.** The pseudo-gradient covers ``module.parameters()`` only; buffers (BatchNorm running
  statistics) are averaged by the loop as for every method, without h — like Flower's DepthFL baseline, which
  applies h to weights and biases only.
* A parameter whose gradient is ``None`` at a step (unused, frozen) gets no correction at that step, as torch
  optimizers skip it; one that never gets a gradient stays at θ^{t−1}, so its entries of g_k are unchanged by A2.
* **Which model is evaluated.** θ^t of A4 (the authors' ``cld_model``); their code also reports the plain mean of
  the cohort's models (``avg_model``), which is not kept here.

The server half works with any server rule (``FedAdam(aggregators=[FedDynCorrection(0.01)], weighting="uniform")``
with ``FederatedTrainer(client_algorithms=[FedDynClient(0.01)])`` runs FedDyn's corrected pseudo-gradient through
Adam); only SGD with η = 1 is Alg. 1. The client half without the server half (or the reverse), or the two with different α, is refused
at fit start naming both parts (:func:`check_feddyn`).

Memory: one g_k of the model's size per client seen (N·d numbers at most, in the model's dtype, on the CPU and in
every checkpoint), like SCAFFOLD's c_i; h is one model-sized vector on the model's device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Optional

import torch
from torch import Tensor

from lightning_fed.client.algorithm import ClientAlgorithm, flat, stepped_indices, unflat
from lightning_fed.server.aggregators.base import (
    ClientDeltas,
    EmptyState,
    RoundInfo,
    Stage,
    WeightedMean,
    state_dtype,
    weighted_sum,
)
from lightning_fed.server.checks import check_positive
from lightning_fed.callbacks.fedavg import FedAvg

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext

__all__ = ["FedDyn", "FedDynClient", "FedDynCorrection", "check_feddyn"]




def check_feddyn(server: Any) -> None:
    """At fit start: FedDyn's two halves must come together, with one α, under uniform weighting.

    Args:
        server: the server optimizer (:class:`~lightning_fed.callbacks.ServerOptimizer`) holding the halves.

    Raises:
        ValueError: a :class:`FedDynClient` without a :class:`FedDynCorrection` in ``server.aggregators`` or the
            reverse, two FedDyn clients, different α in the two halves, or ``weighting`` other than ``"uniform"``;
            the message names both parts.
    """
    name = type(server).__name__
    clients = [a for a in getattr(server, "client_algorithms", ()) if isinstance(a, FedDynClient)]
    stages = [s for s in getattr(server, "aggregators", None) or () if isinstance(s, FedDynCorrection)]
    if clients and not stages:
        raise ValueError(
            f"{clients[0]!r} (FedDyn's client half) needs FedDyn's server half in {name}'s `aggregators`: "
            f"`aggregators=[FedDynCorrection(alpha={clients[0].alpha})]` (or use FedDyn(alpha={clients[0].alpha})); "
            f"without it the clients' dynamic regulariser is never balanced by h (Acar et al. 2021, Alg. 1, A3-A4)."
        )
    if stages and not clients:
        raise ValueError(
            f"{stages[0]!r} (FedDyn's server half) in {name}'s `aggregators` needs FedDyn's client half: "
            f"`FederatedTrainer(client_algorithms=[FedDynClient(alpha={stages[0].alpha})])` (or use "
            f"FedDyn(alpha={stages[0].alpha})); "
            f"without it h corrects a regulariser the clients never used."
        )
    if not clients:
        return
    if len(clients) > 1:
        raise ValueError(f"{name} runs FedDyn's client half twice ({clients}); give one FedDynClient.")
    if clients[0].alpha != stages[0].alpha:
        raise ValueError(
            f"FedDyn's two halves disagree on α: {clients[0]!r} in {name}'s `client` and {stages[0]!r} in its "
            f"`aggregators`; give both the same `alpha`."
        )
    weighting = getattr(server, "weighting", "uniform")
    if weighting != "uniform":
        raise ValueError(
            f"{clients[0]!r} with {stages[0]!r} needs `weighting`='uniform' on {name} (Acar et al. 2021, Alg. 1, "
            f"A4 averages the cohort's models uniformly, matching h = (1/N)·Σ_k g_k), got {weighting!r}."
        )


class FedDynClient(ClientAlgorithm):
    """FedDyn's client half: client k of round t approximately minimises
    L_k(θ) − ⟨g_k, θ⟩ + α/2‖θ − θ^{t−1}‖² (Acar et al. 2021, Alg. 1, A1 in the module doc), with
    g_k = ∇L_k(θ_k^{t−1}) its stored state, then updates g_k ← g_k − α(θ_k^t − θ^{t−1}) (A2).

    At every local step, after the backward pass and before the optimizer step (before gradient clipping; under AMP
    after unscaling), each parameter p the optimizer is about to update gets::

        p.grad ← p.grad + α·(p − p^{t−1}) − g_k[p]          (p^{t−1}: its value in the global model θ^{t−1})

    so SGD with learning rate γ takes θ ← θ − γ·(∇L_k(θ) − g_k + α(θ − θ^{t−1})). When the local work is over the new
    g_k (one flat vector of the model's size, ``module.parameters()`` order, the model's dtype) is returned as the
    client's new state; the server optimizer keeps it in its client-state table (zeros for a client never seen) and
    writes it only when the client's update reaches the server (a dropped client keeps its g_k, as a client
    outside P_t in Alg. 1).

    Must be paired with :class:`FedDynCorrection` of the same α in the server optimizer's ``aggregators`` and
    ``weighting="uniform"`` (:func:`check_feddyn`, at fit start); :class:`~lightning_fed.algorithms.feddyn.FedDyn` does both.

    Args:
        alpha: α (> 0, default 0.01). Acar et al. search α ∈ {0.1, 0.01, 0.001} (Sec. 5 / App.).

    Raises:
        ValueError: ``alpha`` not a finite number > 0; at fit start, as :func:`check_feddyn`.

    Example: the full pairing under FedAvg, its client half given to the trainer (or the ready-made
    :class:`~lightning_fed.algorithms.feddyn.FedDyn`, which holds both); FedDyn's server half without its client half
    is refused when fit starts::

        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.algorithms.feddyn import FedDyn
        >>> from lightning_fed.callbacks import FedAvg
        >>> server = FedAvg(weighting="uniform", aggregators=[FedDynCorrection(alpha=0.1)])
        >>> trainer = FederatedTrainer(callbacks=[server], client_algorithms=[FedDynClient(alpha=0.1)], logger=False, enable_checkpointing=False,
        ...                            enable_progress_bar=False, enable_model_summary=False)
        >>> check_feddyn(FedDyn(alpha=0.1))  # fine: both halves
        >>> check_feddyn(server)  # what fit start checks without the trainer's half
        Traceback (most recent call last):
        ...
        ValueError: FedDynCorrection(alpha=0.1) (FedDyn's server half) in FedAvg's `aggregators` needs FedDyn's client half: `FederatedTrainer(client_algorithms=[FedDynClient(alpha=0.1)])` (or use FedDyn(alpha=0.1)); without it h corrects a regulariser the clients never used.
    """

    def __init__(self, alpha: float = 0.01) -> None:
        self.alpha = check_positive("alpha", alpha)
        self._params: list[Tensor] = []
        self._index: dict[int, int] = {}
        self._anchor: Optional[list[Tensor]] = None
        self._grad: Optional[list[Tensor]] = None  # g_k shaped like the parameters; None: zeros

    def state_dim(self, num_params: int) -> int:
        """g_k: one number per model parameter."""
        return num_params

    def check(self, server: Any) -> None:
        """:func:`check_feddyn` (fit start)."""
        check_feddyn(server)

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """Anchor the regulariser at θ^{t−1} (``context.global_params``) and load g_k (``None``: zeros)."""
        self._params = context.parameters(module)  # the federated parameters, aligned with θ^{t−1}
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._anchor = context.global_params
        self._grad = None if state is None else unflat(state, self._params)

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """Add α·(p − p^{t−1}) − g_k to the gradient of every parameter ``optimizer`` is about to update."""
        if self._anchor is None:
            return
        stepped = stepped_indices(optimizer, self._params, self._index)
        if not stepped:
            return
        with torch.no_grad():
            grads = [self._params[i].grad for i in stepped]
            drift = torch._foreach_sub([self._params[i].detach() for i in stepped], [self._anchor[i] for i in stepped])
            torch._foreach_add_(grads, drift, alpha=self.alpha)  # ∇L_k(θ) + α(θ − θ^{t−1})
            if self._grad is not None:
                torch._foreach_sub_(grads, [self._grad[i] for i in stepped])  # − ∇L_k(θ_k^{t−1})

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
        """The new state g_k − α(θ_k^t − θ^{t−1}) (Alg. 1, A2), a flat CPU vector; nothing sent beyond Δ_k."""
        if self._anchor is None:
            return {}, None
        with torch.no_grad():
            params = self._params
            drift = flat(torch._foreach_sub([p.detach() for p in params], self._anchor))
            old = torch.zeros_like(drift) if self._grad is None else flat(self._grad)
            new = old - self.alpha * drift
        self._anchor, self._grad = None, None
        return {}, new


class FedDynCorrection(Stage):
    """FedDyn's server half, a reducer over the typed state h (Acar et al. 2021, Alg. 1, A3-A4 in the module doc)::

        h  ← h − (α/N)·Σ_{k∈P_t} Δ_k                 (A3; Δ_k = θ_k^t − θ^{t−1}, N = ``RoundInfo.num_clients``)
        Δ_t = (1/|P_t|)·Σ_{k∈P_t} Δ_k − h/α          (A4 as a pseudo-gradient: θ^t = θ^{t−1} + Δ_t)

    The mean is the chain's weighted mean by ``ClientDeltas.counts`` (all 1 under ``weighting="uniform"``, which
    :func:`check_feddyn` requires), summed in float64; the sum of A3 is over every client that reported. h
    (:class:`State`, one tensor per parameter, float32 — float64 for a float64 model — on the model's device, zeros
    before the first round) is checkpointed with the server optimizer's chain. Server SGD with η = 1 then gives
    θ^t of A4. ``round_gradient_diversity`` (FedAWARE, Def. 3.1) stays a measure of the clients' updates: its
    denominator is the uniform mean's norm, not Δ_t's (``shifts_mean``).

    Args:
        alpha: α (> 0, default 0.01), the same as the clients' :class:`FedDynClient`.

    Raises:
        ValueError: ``alpha`` not a finite number > 0; at fit start (:meth:`check_fit`), as :func:`check_feddyn`.

    Example: N = 4 clients, α = 0.5, two report Δ = [1] and [3] in the first round (h = 0)::

        >>> import torch
        >>> x = ClientDeltas([0, 3], [[torch.tensor([1.0])], [torch.tensor([3.0])]], torch.ones(2, dtype=torch.float64))
        >>> stage = FedDynCorrection(alpha=0.5)
        >>> delta, state = stage.apply(x, stage.init_state([torch.zeros(1)], 4), RoundInfo(0, 0, 4, 2))
        >>> state.h, delta  # h = 0 − (0.5/4)·(1 + 3) = −0.5;  Δ_t = (1 + 3)/2 − (−0.5)/0.5 = 3
        ([tensor([-0.5000])], [tensor([3.])])
    """

    kind = "reduce"
    #: Δ_t is the clients' mean shifted by −h/α: ``round_gradient_diversity`` is computed on the mean itself.
    shifts_mean = True

    class State(NamedTuple):
        """h, one tensor per parameter (``None`` before the first round)."""

        h: Optional[list[Tensor]] = None

    def __init__(self, alpha: float = 0.01) -> None:
        self.alpha = check_positive("alpha", alpha)

    def init_state(self, params: list[Tensor], num_clients: int) -> "FedDynCorrection.State":
        """h = 0 shaped like ``params``."""
        return self.State([torch.zeros(p.shape, dtype=state_dtype(p.dtype), device=p.device) for p in params])

    def check_fit(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """:func:`check_feddyn` (fit start, :meth:`Stage.check_fit <lightning_fed.server.aggregators.Stage.check_fit>`)."""
        check_feddyn(server)

    def apply(
        self, x: ClientDeltas, state: "FedDynCorrection.State", info: RoundInfo
    ) -> tuple[list[Tensor], "FedDynCorrection.State"]:
        """Δ_t and the new h (see the class doc)."""
        mean, _ = WeightedMean().apply(x, EmptyState(), info)
        first = x.deltas[0]
        h = state.h if state.h is not None else self.init_state(first, info.num_clients).h
        with torch.no_grad():
            h = [t.to(device=d.device) for t, d in zip(h, first)]
            total = weighted_sum(x.deltas, [1.0] * len(x.deltas))  # Σ_{k∈P_t} Δ_k, in float64
            scale = self.alpha / info.num_clients
            new_h = [(t.to(s.dtype) - scale * s).to(t.dtype) for t, s in zip(h, total)]  # A3
            out = [(m.to(s.dtype) - t.to(s.dtype) / self.alpha).to(m.dtype)  # A4
                   for m, t, s in zip(mean, new_h, total)]
        return out, self.State(new_h)


class FedDyn(FedAvg):
    """FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021, Algorithm 1): the
    composition ``FedAvg(lr, weighting="uniform", aggregators=[FedDynCorrection(alpha)])`` with
    ``FederatedTrainer(client_algorithms=[FedDynClient(alpha)])``; write that composition by hand to add client
    transforms (e.g. clipping) before the reducer, or give the two halves to another server rule.

    Client k of round t (cohort P_t, global model θ^{t−1}) runs its local work on the gradient
    ``∇L_k(θ) − g_k + α(θ − θ^{t−1})`` (Alg. 1's local objective L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2‖θ − θ^{t−1}‖²),
    then stores g_k ← g_k − α(θ_k^t − θ^{t−1}) (Alg. 1's local-gradient update); the server keeps h (zeros at the
    start) and takes::

        h   ← h − (α/N)·Σ_{k∈P_t} (θ_k^t − θ^{t−1})
        θ^t = θ^{t−1} + η·((1/|P_t|)·Σ_{k∈P_t} (θ_k^t − θ^{t−1}) − h/α)      (η = 1: θ^t = mean_k θ_k^t − h/α)

    N is the data module's ``num_clients``. Shapes: g_k is one flat vector of d numbers per client seen (d = the
    model's number of parameters, its dtype, kept on the CPU in the server optimizer's client-state table), h is one
    tensor per parameter on the model's device; both are checkpointed (``"client_algorithms"`` and
    ``"aggregators"`` in the server optimizer's state) and restored on resume. Conventions, and where the authors'
    code, Flower and FedLab differ: :mod:`lightning_fed.algorithms.feddyn`.

    Args:
        alpha: α (> 0, default 0.01, the authors' example value); Acar et al. search {0.1, 0.01, 0.001}.
        lr: Server learning rate η (> 0, default 1.0, Alg. 1; other values scale the corrected step).
        client: Further client algorithms, run after FedDyn's own (default ``None``).
        client_state_store: Where the g_k live: ``"memory"`` (default) or ``"disk"`` (one file per client row,
            checkpoints reference them; :class:`~lightning_fed.callbacks.ServerOptimizer`).
        client_state_dir: The ``"disk"`` store's directory (default ``None``: ``<default_root_dir>/client_state``).

    Raises:
        ValueError: ``alpha`` or ``lr`` not a finite number > 0, an unknown ``client_state_store``.

    Example: one client fits y = w·x on x = [1, 2], y = [2, 4] (loss mean((w·x − y)²), ∇ = 2·mean(x(w·x − y)))
    from w = 0, two full-batch SGD steps of γ = 0.1 per round, α = 0.5, N = 1::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Line(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return ((self.w * x - y) ** 2).mean()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)
        >>> data = TensorDataset(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64))
        >>> dm = FederatedDataModule(data, partitioner=IIDPartitioner(num_clients=1), clients_per_round=1,
        ...                          batch_size=2, local_epochs=2)
        >>> model, server = Line(), FedDyn(alpha=0.5)
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[server], logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(model, datamodule=dm)
        >>> w1 = 0 - 0.1 * (-10 + 0.5 * (0 - 0))             # ∇L = 5w − 10; g = 0, θ^{t−1} = 0: w1 = 1
        >>> w2 = w1 - 0.1 * (5 * w1 - 10 + 0.5 * (w1 - 0))   # 1 + 0.1·4.5 = 1.45
        >>> h = 0 - 0.5 / 1 * (w2 - 0)                       # −0.725
        >>> round(w2 - h / 0.5, 10), round(model.w.item(), 10)  # θ^1 = mean θ_k − h/α = 2·w2
        (2.9, 2.9)
        >>> round(server.client_algorithm_states["FedDynClient"].get(0).item(), 10)  # g_0 = 0 − α(θ_0^1 − θ^0)
        -0.725
        >>> FedDyn(alpha=0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `alpha` must be a finite number > 0, got 0.
    """

    state_key_fields = ("lr", "alpha")
    repr_fields = ("alpha", "lr")

    def __init__(self, alpha: float = 0.01, lr: float = 1.0, client: Optional[list[ClientAlgorithm]] = None,
                 client_state_store: str = "memory", client_state_dir: Optional[str] = None) -> None:
        self.alpha = check_positive("alpha", alpha)
        super().__init__(lr=lr, weighting="uniform", aggregators=[FedDynCorrection(self.alpha)], client=client,
                         client_state_store=client_state_store, client_state_dir=client_state_dir)
        self._own_client = [FedDynClient(self.alpha)]  # the client half (lightning_fed.algorithms.feddyn)
