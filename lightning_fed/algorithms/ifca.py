"""IFCA (Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020,
Algorithm 1, option II: model averaging, with Algorithm 2's LocalUpdate): k cluster models at the server; each
client picks the cluster model with the lowest loss on its data, trains it, and the server averages the returned
models per cluster.

Algorithm 1, option II (round t, cohort M_t, k cluster models θ_j^{(t)}; s_i the one-hot cluster estimate of client i)::

    client i ∈ M_t:  ĵ = argmin_{j∈[k]} F_i(θ_j^{(t)})          (F_i: the empirical loss on the client's data)
                     θ̃_i = LocalUpdate(θ_ĵ^{(t)})                 (the client's local work: τ steps of SGD)
                     send (s_i, θ̃_i)
    server:          θ_j^{(t+1)} = Σ_{i∈M_t} s_{i,j}·θ̃_i / Σ_{i∈M_t} s_{i,j}   (a cluster nobody chose keeps θ_j^{(t)})

Where the k models live: the module's parameters are cluster 0 (the global model Lightning sees, checkpoints, and
``val_*`` measures), and the server half :class:`IFCAClusters` — the chain's reducer — keeps clusters 1 … k−1 in its
state (one flat float64 vector per cluster over the federated parameters, checkpointed with the chain's states).
:class:`IFCAClient` (the client half) loads each cluster model into the module in its ``start``, computes F_i as
the sample-weighted mean of the module's ``training_step`` loss over all the client's training samples (in the
module's eval mode, batches of the client's round batch size, index order), starts the local work from θ_ĵ and sends
ĵ (``extras["ifca_cluster"]``) with Δ_i = θ̃_i − θ_0^{(t)}. The reducer returns cluster 0's mean Δ (its server step
is the rule's) and sets θ_j ← θ_0^{(t)} + mean Δ of cluster j's clients for the others.

Choices and limits: the server rule must be plain SGD (:class:`~lightning_fed.server.rules.SGD`; ``lr`` = 1 is Alg.
2, another η moves every cluster by η times its mean update); a stateful rule (FedAdam, momentum) would need k rule
states and is refused at fit start, as are other aggregator stages (a transform would see Δ_i relative to cluster 0,
not to the client's cluster) and client halves with per-client state or personal models (what they keep would mix
clusters), and the update-norm guard (``max_update_norm_ratio``: updates are measured from cluster 0). θ_j^{(0)} for
j ≥ 1: the module's layers re-initialised by their own ``reset_parameters()`` with torch seeded by
:func:`cluster_seed` (the data module's seed, j); θ_0^{(0)} is the module as given — a federated parameter of a
module without ``reset_parameters`` is refused at fit start. Ties in the argmin go to the lowest j. The weights of
the per-cluster mean are the server optimizer's ``weighting`` (:class:`IFCA`'s default ``"uniform"`` is Alg. 1's).
The personal model of a client is the cluster model with the lowest loss on its training data. Option I (gradient
averaging) is not implemented.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor, nn

from lightning_fed.callbacks.server_optimizer import ServerOptimizer
from lightning_fed.checks import check_int
from lightning_fed.client.algorithm import ClientAlgorithm, flat, unflat
from lightning_fed.client.personal import personal_step
from lightning_fed.server.aggregators.base import ClientDeltas, RoundInfo, Stage, weighted_sum
from lightning_fed.server.rules.sgd import SGD

__all__ = ["IFCA", "IFCAClient", "IFCAClusters", "cluster_seed"]


def cluster_seed(seed: int, cluster: int) -> int:
    """The torch seed of cluster ``cluster``'s initial model (j ≥ 1), a pure function of the data module's seed.

    Example::

        >>> cluster_seed(0, 1) == cluster_seed(0, 1) != cluster_seed(0, 2)
        True
    """
    return int(np.random.SeedSequence([int(seed), 0x1FCA, int(cluster)]).generate_state(1, dtype=np.uint32)[0])


def _unreset_parameters(module: nn.Module) -> list[str]:
    """Names of the parameters that no submodule with ``reset_parameters`` owns directly."""
    covered = {id(p) for sub in module.modules() if callable(getattr(sub, "reset_parameters", None))
               for p in sub.parameters(recurse=False)}
    return [n for n, p in module.named_parameters() if p.requires_grad and id(p) not in covered]


class IFCAClusters(Stage):
    """IFCA's server half (Ghosh et al. 2020, Alg. 1, option II: the server's per-cluster mean): the reducer that
    returns cluster 0's mean update (for the server rule) and keeps clusters 1 … k−1 in its state.

    Args:
        num_clusters: k (an integer ≥ 2).

    Raises:
        ValueError: ``num_clusters`` not an integer ≥ 2; at fit start, see :meth:`check_fit`; in a round, an update
            without a cluster index in [0, k).

    Example::

        >>> IFCAClusters(num_clusters=3)
        IFCAClusters(num_clusters=3)
    """

    kind = "reduce"
    #: A resume needs the cluster models 1 … k−1.
    required_fields = ("models",)

    class State(NamedTuple):
        """Clusters 1 … k−1: float64 ``[k − 1, D]`` over the federated parameters (``None`` before round 0)."""

        models: Optional[Tensor] = None

    def __init__(self, num_clusters: int = 2) -> None:
        self.num_clusters = check_int("num_clusters", num_clusters, 2)
        self._x_t: Optional[list[Tensor]] = None
        self._lr = 1.0

    def init_state(self, params: list[Tensor], num_clients: int) -> "IFCAClusters.State":
        return self.State(None)

    def check_fit(self, trainer: Any, pl_module: Any, server: Any) -> None:
        """At fit start: the rule is plain SGD, this stage is the whole chain, the run's client halves are one
        :class:`IFCAClient` and stateless halves without personal models, no update-norm guard
        (``max_update_norm_ratio``), every federated parameter re-initialisable.

        Raises:
            ValueError: naming what cannot compose with IFCA.
        """
        name = type(server).__name__
        rule = getattr(server, "server_rule", None) or getattr(server, "rule", None)
        if type(rule) is not SGD:
            raise ValueError(f"IFCA keeps {self.num_clusters} cluster models, but {name}'s server rule "
                             f"{type(rule).__name__} has one state for one model; IFCA needs the plain SGD rule "
                             "(e.g. IFCA(lr=1.0), or FedAvg(aggregators=[IFCAClusters(k)]) with "
                             "FederatedTrainer(client_algorithms=[IFCAClient()])).")
        self._lr = float(rule.lr)
        others = [s for s in server.aggregators or () if s is not self]
        if others:
            raise ValueError(f"IFCAClusters must be {name}'s only aggregator stage; got also {others} (a stage would "
                             "see updates relative to cluster 0, not to each client's cluster).")
        halves = [*server.client_algorithms, *(getattr(trainer, "client_algorithms", None) or [])]
        if sum(isinstance(a, IFCAClient) for a in halves) != 1:
            raise ValueError(f"IFCAClusters needs exactly one IFCAClient among the run's client halves, got {halves}.")
        dim = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        bad = [a for a in halves if not isinstance(a, IFCAClient)
               and (a.state_dim(dim) > 0 or callable(getattr(a, "personal_model", None)))]
        if bad:
            raise ValueError(f"IFCA cannot run with the client half(s) {bad}: they keep per-client state or a "
                             "personal model, which would mix the clusters' models.")
        ratio = getattr(getattr(trainer, "fit_loop", None), "max_update_norm_ratio", None)
        if ratio is not None:
            raise ValueError(f"`max_update_norm_ratio`={ratio:g} compares the clients' update norms, but under IFCA a "
                             "client's update is measured from cluster 0, not from its own cluster, so clients of the "
                             "other clusters would be dropped as outliers: leave `max_update_norm_ratio=None`.")
        unreset = _unreset_parameters(pl_module)
        if unreset:
            raise ValueError(f"IFCA draws the initial models of clusters 1 … {self.num_clusters - 1} with the "
                             f"modules' reset_parameters(); {unreset} belong to no module that has one (put them in "
                             "an nn.Module with reset_parameters).")

    def models(self, server: Any, module: nn.Module, params: list[Tensor], seed: int) -> Tensor:
        """Clusters 1 … k−1 (``[k − 1, D]``, float64), drawn at the first call (see the module doc) into
        ``server``'s chain state."""
        index = server.stage_index(self)
        states = list(server.chain_state(params))
        if states[index].models is None:
            saved = [t.detach().clone() for t in (*module.parameters(), *module.buffers())]
            devices = [params[0].device] if params[0].device.type == "cuda" else []
            drawn = []
            try:
                for j in range(1, self.num_clusters):
                    with torch.random.fork_rng(devices=devices), torch.no_grad():
                        torch.manual_seed(cluster_seed(seed, j))
                        for sub in module.modules():
                            if callable(getattr(sub, "reset_parameters", None)):
                                sub.reset_parameters()
                    drawn.append(flat(params).to(torch.float64))
            finally:
                with torch.no_grad():
                    for t, s in zip((*module.parameters(), *module.buffers()), saved):
                        t.copy_(s)
            states[index] = self.State(torch.stack(drawn).to(params[0].device))
            server.aggregator_state = tuple(states)
        return states[index].models

    def prepare_round(self, server: Any, params: list[Tensor], updates: Any) -> None:
        """Remember x_t = θ_0^{(t)}; every update carries a cluster index in [0, k).

        Raises:
            ValueError: an update without ``extras["ifca_cluster"]`` in [0, k).
        """
        for u in updates:
            j = (getattr(u, "extras", None) or {}).get("ifca_cluster")
            if j is None or not 0 <= int(j) < self.num_clusters:
                raise ValueError(f"Client {u.client_id}'s update has no IFCA cluster index in [0, {self.num_clusters})"
                                 f" (extras['ifca_cluster'] = {j!r}); IFCAClusters needs IFCAClient on every client.")
        self._x_t = [p.detach().clone() for p in params]

    def apply(self, x: ClientDeltas, state: "IFCAClusters.State", info: RoundInfo) -> tuple[Any, ...]:
        clusters = [int(u.extras["ifca_cluster"]) for u in x.updates or []]
        shape = x.deltas[0] if x.deltas else x.template
        delta0 = [torch.zeros_like(t) for t in shape]
        models = state.models
        members = {j: [i for i, c in enumerate(clusters) if c == j] for j in range(self.num_clusters)}
        for j, chosen in members.items():
            if not chosen:
                continue
            counts = x.counts[chosen]
            mean = weighted_sum([x.deltas[i] for i in chosen], counts.tolist())  # as WeightedMean: Σ c_i·Δ_i / Σ c_i
            torch._foreach_div_(mean, float(counts.sum()))
            if j == 0:
                delta0 = [m.to(d.dtype) for m, d in zip(mean, shape)]
                continue
            target = flat(self._x_t).to(torch.float64).to(models.device) + torch.cat(
                [m.reshape(-1) for m in mean]).to(models.device)
            models = models.clone() if models is state.models else models
            models[j - 1] = target if self._lr == 1.0 else models[j - 1] + self._lr * (target - models[j - 1])
        report = {j: len(chosen) for j, chosen in members.items()}
        return delta0, self.State(models), report

    def round_metrics(self, report: Any) -> dict[str, float]:
        """``ifca_cluster_<j>_clients``: how many of the round's clients chose cluster j."""
        return {} if report is None else {f"ifca_cluster_{j}_clients": float(n) for j, n in report.items()}

    def __repr__(self) -> str:
        return f"IFCAClusters(num_clusters={self.num_clusters})"


class IFCAClient(ClientAlgorithm):
    """IFCA's client half (Ghosh et al. 2020, Alg. 1, the client's lines): the cluster model with the lowest loss
    on the client's training data is where its local work starts; its index travels with the update. Needs
    :class:`IFCAClusters` in the server optimizer's chain (refused at fit start otherwise).

    Example::

        >>> from lightning_fed.callbacks import FedAvg
        >>> IFCAClient().check(FedAvg())
        Traceback (most recent call last):
        ...
        ValueError: IFCAClient() (IFCA's client half) needs IFCA's server half in FedAvg's `aggregators`: `aggregators=[IFCAClusters(num_clusters=k)]` (or use IFCA(num_clusters=k)).
    """

    #: Its personal model (the best cluster) is chosen on the client's data: ``personal_model`` takes the trainer
    #: and the client id.
    personal_needs_client = True

    def __init__(self) -> None:
        self._server: Any = None
        self._stage: Optional[IFCAClusters] = None
        self._cluster = 0

    def check(self, server: Any) -> None:
        """Find :class:`IFCAClusters` in ``server``'s chain.

        Raises:
            ValueError: none there.
        """
        stage = next((s for s in getattr(server, "aggregators", None) or () if isinstance(s, IFCAClusters)), None)
        if stage is None:
            raise ValueError(f"{self!r} (IFCA's client half) needs IFCA's server half in {type(server).__name__}'s "
                             "`aggregators`: `aggregators=[IFCAClusters(num_clusters=k)]` (or use "
                             "IFCA(num_clusters=k)).")
        self._server, self._stage = getattr(server, "composer", server), stage

    def _choose(self, module: Any, params: list[Tensor], cluster0: list[Tensor], dm: Any, cid: int,
                round_idx: int) -> int:
        """ĵ = argmin_j F_i(θ_j); the module holds θ_ĵ afterwards."""
        if self._stage is None:
            raise RuntimeError("IFCAClient runs only inside a server optimizer's fit (its `check` binds it).")
        models = self._stage.models(self._server, module, params, dm.seed)
        indices, size = dm.client_indices(cid), dm.client_work(cid, round_idx).batch_size
        batches = [indices[i:i + size] for i in range(0, len(indices), size)]
        was_training, losses = module.training, []
        module.eval()
        try:
            for j in range(self._stage.num_clusters):
                values = cluster0 if j == 0 else unflat(models[j - 1], params)
                with torch.no_grad():
                    for p, v in zip(params, values):
                        p.copy_(v)
                    total = 0.0
                    for b, (batch, idx) in enumerate(zip(dm.train_batches_loader(batches), batches)):
                        total += float(personal_step(module, batch, b)) * len(idx)
                losses.append(total / len(indices))
        finally:
            module.train(was_training)
        best = int(np.argmin(losses))
        with torch.no_grad():
            for p, v in zip(params, cluster0 if best == 0 else unflat(models[best - 1], params)):
                p.copy_(v)
        return best

    def start(self, module: Any, context: Any, state: Optional[Tensor]) -> None:
        """ĵ on the client's data; the local work starts from θ_ĵ."""
        params = context.parameters(module)
        self._cluster = self._choose(module, params, list(context.global_params), module.trainer.datamodule,
                                     int(context.client_id), int(context.round_idx))

    def finish(self, module: Any, context: Any) -> tuple[dict[str, Any], Optional[Tensor]]:
        return {"ifca_cluster": torch.tensor(self._cluster)}, None

    def personal_model(self, module: Any, state: Optional[Tensor], trainer: Any = None,
                       client_id: Optional[int] = None) -> None:
        """``module`` (cluster 0) becomes the cluster model with the lowest loss on client ``client_id``'s training
        data, in place.

        Raises:
            ValueError: no ``trainer`` or ``client_id``.
        """
        if trainer is None or client_id is None:
            raise ValueError("IFCA's personal model is the best cluster model on the client's data: pass `trainer` "
                             "and `client_id`.")
        if self._stage is None:  # outside a fit (trainer.validate(ckpt_path=...)): bind to the run's server optimizer
            self.check(next(cb for cb in trainer.callbacks if hasattr(cb, "client_algorithm_states")))
        params = [p for p in module.parameters() if p.requires_grad]
        cluster0 = [p.detach().clone() for p in params]
        self._choose(module, params, cluster0, trainer.datamodule, int(client_id), int(trainer.current_epoch))


class IFCA(ServerOptimizer):
    """IFCA (Ghosh et al., NeurIPS 2020, Alg. 1, option II: model averaging): ``num_clusters`` cluster models, each
    client training the one with the lowest loss on its data (see :mod:`lightning_fed.algorithms.ifca`).

    Args:
        num_clusters: k (an integer ≥ 2; default 2).
        lr: Server learning rate (default 1.0, Alg. 1's per-cluster mean).
        weighting: ``"uniform"`` (default, Alg. 1) or ``"num_samples"``.

    Example::

        >>> IFCA(num_clusters=3)
        IFCA(num_clusters=3, lr=1.0, weighting='uniform')
    """

    repr_fields = ("num_clusters", "lr", "weighting")

    def __init__(self, num_clusters: int = 2, lr: float = 1.0, weighting: str = "uniform") -> None:
        #: The reducer stage (:class:`IFCAClusters`): cluster 0's update, clusters 1 … k−1.
        self.cluster_stage = IFCAClusters(num_clusters)
        super().__init__(weighting=weighting, aggregators=[self.cluster_stage], rule=SGD(lr))
        self._own_client = [IFCAClient()]
        self._own_aggregators = [self.cluster_stage]
        self.num_clusters, self.lr = self.cluster_stage.num_clusters, lr
