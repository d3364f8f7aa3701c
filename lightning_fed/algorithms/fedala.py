"""FedALA (Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI 2023, Algorithm 1): before its local training, each client mixes the global model into its own
local model element-wise, with weights it learns on a random share of its data (adaptive local aggregation, ALA).

Algorithm 1 (round t, cohort I^t; Θ^{t−1} the global model, Θ_i^{t−1} client i's local model; the top p layers
mixed, the lower layers taking the global values; η the ALA step size, s the sampled share of the data)::

    Θ̂_i^t = Θ_i^{t−1} + (Θ^{t−1} − Θ_i^{t−1}) ⊙ [1^{|Θ|−p}; W_i^p]                           (ALA: the mix)
    W_i^p ← clip(W_i^p − η·∇_{W_i^p} L(Θ̂_i^t, D_i^{s,t}), 0, 1)  once per mini-batch of D_i^{s,t}  (ALA: W's step)
            (∇_W L = ∇_{Θ̂^p} L ⊙ (Θ^{t−1,p} − Θ_i^{t−1,p}); Θ̂ recomputed from W before every batch)
    Θ_i^t = local training from Θ̂_i^t (the client's local work of the round)
    server:  Θ^t = Σ_{i∈I^t} (n_i / Σ_j n_j)·Θ_i^t

In a client's first ALA (the start phase) the passes over D_i^{s,t} repeat until the standard deviation of the
last ``num_pre_loss`` batch losses is below ``threshold``; afterwards one pass per round. W_i^p starts at 1.

Here :class:`FedALAClient` runs ALA in its ``start`` (the module holds Θ^{t−1}) with the module's own
``training_step`` (:func:`~lightning_fed.client.personal.personal_step`: its ``self.log`` calls and metric states
kept apart), then the client's ordinary local work trains the whole model; Θ_i^t − Θ^{t−1} is its update, so the
server step is any server rule (:class:`FedALA` is FedAvg with the n_i/n weights). The top p layers are named
(``top``, submodules or tensors, e.g. ``["classifier"]``), as FedPer names its head. Per-client state: Θ_i^{t,p}
(the top layers after local training), W_i^p and whether the start phase is over. D_i^{s,t}: ``⌊s·n_i⌋`` (at least
one) of the client's training samples drawn without replacement by a generator seeded by (seed, round, client)
(:func:`ala_batches`), in batches of the client's round batch size, the same order in every pass. Choices that
differ from the paper or that it leaves open:

* a client's first round starts from Θ^{t−1} as its local model (the paper initialises every local model to Θ^0);
  ALA is then the identity (Θ^{t−1} − Θ_i = 0), and the start phase happens at its first ALA after that — as the
  authors' code skips ALA while the local and the global model agree. (It keeps a resume exact without storing Θ^0.)
* the start phase stops after ``max_start_epochs`` passes at the latest (default 100).
* the personal model of a client (``fed_personal_<m>``) is ALA's mix with its stored W_i^p and Θ_i^{t,p} against the
  current global model, without a new ALA step (the lower layers are the global model's).
* buffers (BatchNorm statistics) are the global model's throughout.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.checks import check_fraction, check_int, check_names, check_positive
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.client.personal import personal_step, selected_parameters
from lightning_fed.server.aggregators.base import Stage

__all__ = ["FedALA", "FedALAClient", "ala_batches"]


def ala_batches(indices: np.ndarray, share: float, batch_size: int, seed: int, round_idx: int,
                client_id: int) -> list[np.ndarray]:
    """D_i^{s,t} of FedALA: ``max(1, ⌊share·n⌋)`` of the client's sample ``indices`` (``[n]``) drawn without
    replacement by NumPy's generator seeded by ``(seed, round_idx, client_id)``, cut into batches of
    ``batch_size`` (the last one smaller), as int64 index arrays.

    Example::

        >>> [b.tolist() for b in ala_batches(np.arange(10, 20), 0.5, 2, seed=0, round_idx=3, client_id=1)]
        [[13, 17], [16, 15], [19]]
    """
    rng = np.random.default_rng([int(seed), 0xA1A, int(round_idx), int(client_id)])
    chosen = rng.choice(np.asarray(indices, dtype=np.int64), size=max(1, int(share * len(indices))), replace=False)
    return [chosen[i:i + batch_size] for i in range(0, len(chosen), batch_size)]


class FedALAClient(ClientAlgorithm):
    """FedALA's client half (Zhang et al., AAAI 2023, Alg. 1): adaptive local aggregation of the top layers before
    the local training (see :mod:`lightning_fed.algorithms.fedala`).

    Args:
        top: Names of the top p layers ALA mixes (submodules or tensors, e.g. ``["classifier"]``), a non-empty list.
        share: s, the share of the client's training data ALA learns W on (in (0, 1]; default 0.8).
        lr: η, the step size of W (> 0; default 1.0).
        threshold: The start phase ends when the standard deviation of the last ``num_pre_loss`` batch losses is
            below it (> 0; default 0.1).
        num_pre_loss: How many batch losses that standard deviation covers (an integer ≥ 2; default 10).
        max_start_epochs: The start phase's most passes (an integer ≥ 1; default 100).

    Raises:
        ValueError: a bad argument (named); at fit start, ``top`` selecting no parameter of the model.

    Example::

        >>> net = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
        >>> half = FedALAClient(top=["1"])
        >>> half.setup(net)
        >>> half.state_dim(0)  # Θ_i^p (3), W_i^p (3), the start-phase flag
        7
    """

    def __init__(self, top: Sequence[str], share: float = 0.8, lr: float = 1.0, threshold: float = 0.1,
                 num_pre_loss: int = 10, max_start_epochs: int = 100) -> None:
        self.top = check_names("top", top)
        self.share = 1.0 if share == 1 and not isinstance(share, bool) else check_fraction("share", share)
        self.lr = check_positive("lr", lr)
        self.threshold = check_positive("threshold", threshold)
        self.num_pre_loss = check_int("num_pre_loss", num_pre_loss, 2)
        self.max_start_epochs = check_int("max_start_epochs", max_start_epochs, 1)
        self._top: list[int] = []
        self._size = 0

    def setup(self, module: nn.Module) -> None:
        """At fit start: the positions of the top layers' parameters.

        Raises:
            ValueError: ``top`` selects no parameter of ``module``.
        """
        self._top = selected_parameters(module, self.top, "FedALAClient", "top")
        params = list(module.parameters())
        self._size = sum(params[i].numel() for i in self._top)

    def state_dim(self, num_params: int) -> int:
        """Θ_i^p, W_i^p and the start-phase flag: 2·|top| + 1 numbers."""
        return 2 * self._size + 1

    def _tops(self, module: nn.Module) -> list[Tensor]:
        params = list(module.parameters())
        return [params[i] for i in self._top]

    def _split(self, state: Tensor, like: list[Tensor]) -> tuple[list[Tensor], list[Tensor], bool]:
        out, offset = [], 0
        for _ in range(2):
            part = []
            for t in like:
                part.append(state[offset:offset + t.numel()].reshape(t.shape).to(device=t.device, dtype=t.dtype))
                offset += t.numel()
            out.append(part)
        return out[0], out[1], bool(state[-1] > 0)

    def start(self, module: Any, context: Any, state: Optional[Tensor]) -> None:
        """ALA: learn W_i^p on D_i^{s,t} and start the local work from Θ̂_i^t (``state`` ``None``: the client's
        first round, Θ_i = Θ^{t−1}: nothing to mix)."""
        tops = self._tops(module)
        self._weights = [torch.ones_like(t) for t in tops]
        self._started = False
        if state is None:
            return
        local, self._weights, self._started = self._split(state, tops)
        with torch.no_grad():
            glob = [t.detach().clone() for t in tops]
        diff = [g - l for g, l in zip(glob, local)]
        dm, cid, round_idx = module.trainer.datamodule, int(context.client_id), int(context.round_idx)
        batches = ala_batches(dm.client_indices(cid), self.share, dm.client_work(cid, round_idx).batch_size,
                              dm.seed, round_idx, cid)
        losses: list[float] = []
        grads = [p.grad for p in tops]
        try:
            for epoch in range(1 if self._started else self.max_start_epochs):
                for batch_idx, batch in enumerate(dm.train_batches_loader(batches)):
                    with torch.no_grad():
                        for p, l, d, w in zip(tops, local, diff, self._weights):
                            p.copy_(l + d * w)  # ALA's mix
                    with torch.enable_grad():
                        loss = personal_step(module, batch, batch_idx)
                        g = torch.autograd.grad(loss, tops, allow_unused=True)
                    with torch.no_grad():
                        # W's step, clipped to [0, 1]
                        self._weights = [w if gi is None else torch.clamp(w - self.lr * gi * d, 0, 1)
                                         for w, gi, d in zip(self._weights, g, diff)]
                    losses.append(float(loss.detach()))
                if self._started or (len(losses) > self.num_pre_loss
                                     and np.std(losses[-self.num_pre_loss:]) < self.threshold):
                    break
            with torch.no_grad():
                for p, l, d, w in zip(tops, local, diff, self._weights):
                    p.copy_(l + d * w)  # Θ̂_i^t with the learned W
        finally:
            for p, g in zip(tops, grads):
                p.grad = g
        self._started = True

    def finish(self, module: Any, context: Any) -> tuple[dict[str, Any], Optional[Tensor]]:
        """The new state: Θ_i^{t,p} (after local training), W_i^p, the start-phase flag."""
        tops = self._tops(module)
        parts = [t.detach().reshape(-1).cpu().to(torch.float64) for t in [*tops, *self._weights]]
        flag = torch.tensor([1.0 if self._started else 0.0], dtype=torch.float64)
        return {}, torch.cat([*parts, flag])

    def personal_model(self, module: Any, state: Optional[Tensor]) -> None:
        """``module`` (the global model) becomes the client's personal model in place: ALA's mix with its stored W_i^p
        and Θ_i^{t,p} (``None``: never trained, the global model)."""
        if state is None:
            return
        if not self._top:
            self.setup(module)
        tops = self._tops(module)
        local, weights, _ = self._split(state, tops)
        with torch.no_grad():
            for p, l, w in zip(tops, local, weights):
                p.copy_(l + (p - l) * w)


class FedALA(FedAvg):
    """FedALA (Zhang et al., AAAI 2023, Alg. 1): FedAvg (n_i/n) whose clients start each round from their adaptive
    local aggregation of the global model (see :mod:`lightning_fed.algorithms.fedala`).

    Args:
        top: Names of the top p layers ALA mixes, e.g. ``["classifier"]``.
        share, ala_lr, threshold, num_pre_loss, max_start_epochs: As :class:`FedALAClient` (``ala_lr`` is its
            ``lr``, η).
        lr: Server learning rate (default 1.0).
        weighting: ``"num_samples"`` (default) or ``"uniform"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after FedALA's (default ``None``).

    Example::

        >>> FedALA(top=["net.1"])
        FedALA(top=['net.1'], share=0.8, ala_lr=1.0, lr=1.0, weighting='num_samples')
    """

    repr_fields = ("top", "share", "ala_lr", "lr", "weighting")
    carried_client_half = ("FedALAClient", {"top": "top", "share": "share", "lr": "ala_lr", "threshold": "threshold",
                                            "num_pre_loss": "num_pre_loss", "max_start_epochs": "max_start_epochs"})

    def __init__(self, top: Sequence[str], share: float = 0.8, ala_lr: float = 1.0, threshold: float = 0.1,
                 num_pre_loss: int = 10, max_start_epochs: int = 100, lr: float = 1.0, weighting: str = "num_samples",
                 aggregators: Optional[list[Stage]] = None, client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedALAClient(top, share, ala_lr, threshold, num_pre_loss, max_start_epochs)]
        half = self._own_client[0]
        self.top, self.share, self.ala_lr = half.top, half.share, half.lr
        self.threshold, self.num_pre_loss, self.max_start_epochs = threshold, num_pre_loss, max_start_epochs
