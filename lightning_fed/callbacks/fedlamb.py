"""Fed-LAMB and Fed-AMS (Karimi, Li, Li, *Layerwise and Dimensionwise Locally Adaptive Optimization*, Alg. 1):
adaptive local optimizers on the clients, model averaging and max-averaged second moments on the server."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from lightning_fed.algorithms.fedlamb import (
    BIAS_CORRECTIONS,
    RATIO_DENOMINATORS,
    AMSGradClient,
    FedLAMBClient,
    LocalAdaptiveClient,
    LocalAMSGrad,
    MaxSecondMoment,
    check_choice,
    check_in_range,
    check_phi_bounds,
)
from lightning_fed.callbacks.server_optimizer import ServerOptimizer, check_positive, check_unit_interval, none_if_infinite
from lightning_fed.server.rules.sgd import SGD

#: Accepted values of ``first_moment``: m restarts at 0 every round, or the server broadcasts the clients' mean m.
FIRST_MOMENTS = ("reset", "average")


class LocalAdaptiveServer(ServerOptimizer):
    """Karimi et al., Algorithm 1, with the client optimizer left to subclasses (:class:`FedLAMB`,
    :class:`FedAMS`); not used directly.

    **Clients** (Alg. 1, l. 5-14). At fit start the callback replaces the module's client optimizer (whatever
    ``configure_optimizers`` returned, e.g. SGD) by ``client_optimizer_class`` over the same parameter groups,
    with learning rate α = ``client_lr`` or, if ``None``, the user's optimizer's learning rate per group
    (:meth:`install_client_optimizer`). Each client of round r starts from the global model θ̄_r (l. 5) with
    the optimizer state seeded by the client half
    (:class:`~lightning_fed.algorithms.fedlamb.LocalAdaptiveClient`): local step 0, v⁰ = v̂⁰ = v̂_r, the broadcast second
    moment (l. 6), and m⁰ = 0 (``first_moment="reset"``) or the broadcast m̄_r (``"average"``). It then takes its
    local steps (l. 7-13, :class:`~lightning_fed.algorithms.fedlamb.LocalAMSGrad`) and sends back its model
    and its uncorrected second moment v_i^T (l. 14; the client half
    :class:`~lightning_fed.algorithms.fedlamb.LocalAdaptiveClient`, ``ClientUpdate.extras``).

    **Server** (Alg. 1, l. 16): a composition ``ServerOptimizer(aggregators=[MaxSecondMoment(...)], rule=SGD(lr))``
    — the reducer :class:`~lightning_fed.server.aggregators.MaxSecondMoment` (:attr:`moment_stage`, whose state
    holds v̂ and m̄) and the server SGD rule — with w_i the aggregation weights (1/|S| by default, the paper's plain mean)::

        θ̄_{r+1} = θ̄_r + η·Σ_i w_i·(θ_i^T − θ̄_r)       (η = ``lr`` = 1: model averaging, as the paper)
        v̂_{r+1} = max(v̂_r, Σ_i w_i·v_i^T)               (v̂_0 = ``initial_second_moment`` = ε·1, l. 2)
        m̄_{r+1} = Σ_i w_i·m_i^T                          (only with ``first_moment="average"``)

    Server state: ``second_moment`` (v̂) and, with ``first_moment="average"``, ``first_moment`` (m̄); one tensor
    per parameter, checkpointed with the callback.

    Choices where Algorithm 1 is ambiguous (the alternatives are options):

    * **m across rounds** (l. 9 writes m_i^t without a round index): the bias correction 1 − β₁ᵗ of l. 9 counts
      t = 1..T within the round (l. 7), which is only a correction for an m restarted at 0, and clients of a
      cross-device cohort keep no state between rounds; so by default m restarts at 0 every round
      (``first_moment="reset"``). ``"average"`` broadcasts the clients' weighted mean final m instead (the
      bias correction still counts local steps).
    * **The ratio's denominator** (l. 11 writes v̂_r^t, defined nowhere else): by default the client runs
      AMSGrad's max v̂^t = max(v̂^{t−1}, v^t) from v̂^0 = v̂_r (``ratio_denominator="amsgrad"``, which keeps the
      denominator ≥ the broadcast v̂_r as the max of l. 16 intends); ``"broadcast"`` divides by the broadcast
      v̂_r for the whole round (then round 0 divides by √ε + ε: enormous steps for Fed-AMS).
    * **Bias corrections** (l. 9-10 overwrite m, v with their corrected values): read as Adam's temporaries;
      m, v are kept uncorrected, the max and the message to the server use uncorrected values (sending the
      corrected v^T would multiply v̂ by about β₂^T/(1 − β₂^T) every round). The correction of v, applied as the
      paper says (``bias_correction="both"``, default), also divides the broadcast-initialised v̂ by 1 − β₂ᵗ:
      early in rounds r ≥ 1 it shrinks the steps (up to √(1/(1 − β₂)) ≈ 32× at t = 1 for β₂ = 0.999).
      Without it (``"first_moment"``/``"none"``) v is under-estimated by 1 − β₂^(local steps so far) until some
      1/(1 − β₂) local steps have accumulated, so the first round's steps are up to 32× larger — Fed-AMS with
      α = 1e-3 diverged that way on Fashion-MNIST Hybrid+, and trained with ``"both"``. For Fed-LAMB with
      λ = 0 a per-tensor rescaling of p is normalised away, so the choice matters little.
    * l. 8 computes g at θ^0 and l. 10 uses v_{r−1,i}^t: read as θ^{t−1} and v^{t−1} (typos).
    * "Layers" are parameter tensors (a weight and its bias are two layers), as in LAMB implementations.

    Args:
        client_lr: α > 0 for every parameter group; ``None`` (default): the learning rate(s) of the module's own
            optimizer.
        beta1: β₁ in [0, 1) (default 0.9, the paper's Sec. 4).
        beta2: β₂ in [0, 1) (default 0.999, the paper's Sec. 4).
        eps: ε > 0 (default 1e-8).
        weight_decay: λ ≥ 0 (default 0; the paper tunes it in {0, 0.01, 0.1}).
        bias_correction: ``"both"`` (default, l. 9-10), ``"first_moment"`` or ``"none"``.
        ratio_denominator: ``"amsgrad"`` (default) or ``"broadcast"``.
        first_moment: ``"reset"`` (default) or ``"average"``.
        initial_second_moment: v̂_0 ≥ 0 (default ``None``: ε, Alg. 1, l. 2).
        lr: Server learning rate η > 0 (default 1: plain model averaging, l. 16).
        weighting: ``"uniform"`` (default, the paper's 1/n mean in l. 16) or ``"num_samples"``; used for both
            the models and the second moments.

    Raises:
        ValueError: an argument outside its range (the message names it and what is allowed).

    Example: the shared arguments and their checks (use :class:`FedLAMB` or :class:`FedAMS`)::

        >>> server = FedLAMB(client_lr=0.01, first_moment="average")
        >>> server.initial_second_moment, server.client_optimizer_class.__name__  # v̂_0 = ε by default
        (1e-08, 'FedLAMBClient')
        >>> FedAMS(first_moment="keep")
        Traceback (most recent call last):
        ...
        ValueError: `first_moment` must be one of ('reset', 'average'), got 'keep'.
        >>> FedAMS(beta2=1.0)
        Traceback (most recent call last):
        ...
        ValueError: `beta2` must be a number in [0, 1), got 1.0.
    """

    state_key_fields = ("lr", "client_lr", "beta1", "beta2", "eps", "weight_decay", "first_moment", "weighting")
    repr_fields = ("lr", "weighting", "client_lr", "beta1", "beta2", "eps", "weight_decay", "bias_correction",
                   "ratio_denominator", "first_moment", "initial_second_moment")

    #: The client optimizer class the callback installs.
    client_optimizer_class: type[LocalAMSGrad] = LocalAMSGrad

    def __init__(
        self,
        client_lr: Optional[float] = None,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        bias_correction: str = "both",
        ratio_denominator: str = "amsgrad",
        first_moment: str = "reset",
        initial_second_moment: Optional[float] = None,
        lr: float = 1.0,
        weighting: str = "uniform",
    ) -> None:
        #: The reducer stage (:class:`~lightning_fed.server.aggregators.MaxSecondMoment`): Δ, v̂ and m̄.
        self.moment_stage = MaxSecondMoment(owner=type(self).__name__)
        super().__init__(weighting=weighting, aggregators=[self.moment_stage], rule=SGD(lr))
        #: The client half: installs the client optimizer at fit start, seeds it, sends v_i^T back.
        self._own_client = [LocalAdaptiveClient()]
        self._own_aggregators = [self.moment_stage]  # its own chain: another one is refused at fit start
        self.client_lr = None if client_lr is None else check_positive("client_lr", client_lr)
        self.beta1 = check_unit_interval("beta1", beta1)
        self.beta2 = check_unit_interval("beta2", beta2)
        self.eps = check_positive("eps", eps)
        self.weight_decay = check_in_range("weight_decay", weight_decay, low=0.0, low_open=False)
        self.bias_correction = check_choice("bias_correction", bias_correction, BIAS_CORRECTIONS)
        self.ratio_denominator = check_choice("ratio_denominator", ratio_denominator, RATIO_DENOMINATORS)
        self.first_moment = check_choice("first_moment", first_moment, FIRST_MOMENTS)
        if initial_second_moment is None:
            initial_second_moment = self.eps
        self.initial_second_moment = check_in_range(
            "initial_second_moment", initial_second_moment, low=0.0, low_open=False
        )
        self.moment_stage.initial_second_moment = self.initial_second_moment
        self.moment_stage.average_first_moment = self.first_moment == "average"

    def _stage_state(self) -> MaxSecondMoment.State:
        fields = self.stage_state_fields(self.moment_stage)  # the live state, or the one loaded before it is re-made
        return MaxSecondMoment.State() if fields is None else MaxSecondMoment.State(**fields)

    @property
    def state(self) -> dict[str, list[Tensor]]:
        """``{"second_moment": v̂}`` plus ``"first_moment": m̄`` with ``first_moment="average"`` (the stage
        state's tensors; ``{}`` before the first client)."""
        st = self._stage_state()
        out = {} if st.second_moment is None else {"second_moment": st.second_moment}
        if st.first_moment is not None:
            out["first_moment"] = st.first_moment
        return out

    @state.setter
    def state(self, value: dict[str, list[Tensor]]) -> None:
        self.aggregator_state = (MaxSecondMoment.State(value.get("second_moment"), value.get("first_moment")),)

    # ------------------------------------------------------------------ the client optimizer
    def client_optimizer_kwargs(self) -> dict[str, Any]:
        """The client optimizer's hyper-parameters other than ``params`` and ``lr``."""
        return dict(
            betas=(self.beta1, self.beta2),
            eps=self.eps,
            weight_decay=self.weight_decay,
            bias_correction=self.bias_correction,
            ratio_denominator=self.ratio_denominator,
            initial_second_moment=self.initial_second_moment,
        )

    def install_client_optimizer(self, trainer: Any) -> LocalAMSGrad:
        """Replace the trainer's single optimizer by ``client_optimizer_class`` and return it (done by the client
        half at fit start: :meth:`LocalAdaptiveClient.install_optimizer
        <lightning_fed.algorithms.fedlamb.LocalAdaptiveClient.install_optimizer>`, where the rules are).

        Raises:
            ValueError: not exactly one optimizer, or one without parameters.
        """
        return self._own_client[0].install_optimizer(trainer, self)

    # ------------------------------------------------------------------ bookkeeping


class FedLAMB(LocalAdaptiveServer):
    """Fed-LAMB (Karimi, Li, Li, *Layerwise and Dimensionwise Locally Adaptive Optimization*, Algorithm 1).

    Clients run :class:`~lightning_fed.algorithms.fedlamb.FedLAMBClient` — local AMSGrad moments and the
    layerwise step θ^ℓ ← θ^ℓ − α·φ(‖θ^ℓ‖)·(p^ℓ + λθ^ℓ)/‖p^ℓ + λθ^ℓ‖ (l. 8-12) — from the global model and the
    broadcast second moment v̂_r; the server averages the models and sets v̂_{r+1} = max(v̂_r, mean_i v_i^T)
    (l. 16). The module's own ``configure_optimizers`` (e.g. SGD) is replaced at fit start; see
    :class:`LocalAdaptiveServer` for the whole rule, the choices made where the paper is ambiguous, and the
    shared arguments.

    Paper settings (Sec. 4): β₁ = 0.9, β₂ = 0.999, φ = identity, λ ∈ {0, 0.01, 0.1}, α tuned on a log grid,
    uniform averaging, 50 clients with half of them per round, batch size 32.

    Args:
        phi_min: γ_l ≥ 0 of φ(z) = min(max(z, γ_l), γ_u) (default 0; the paper's H4 asks φ ≥ φ_m > 0).
        phi_max: γ_u > 0 (default ``None``: ∞; φ = identity by default, as the paper's experiments).
        client_lr, beta1, beta2, eps, weight_decay, bias_correction, ratio_denominator, first_moment,
        initial_second_moment, lr, weighting: see :class:`LocalAdaptiveServer`.

    Raises:
        ValueError: an argument outside its range (the message names it).

    Example: one client, one local step from θ = [3, 4] with g = [−1, −2], α = 0.1 and the defaults (β₁ = 0.9,
    β₂ = 0.999, ε = v̂_0 = 1e-8), against l. 9-12 and 16 by hand::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Lin(L.LightningModule):  # loss −θ·x, so g = −x
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.theta = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         return -(self.theta * batch[0]).sum()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)  # replaced; its lr is α
        >>> dm = FederatedDataModule(TensorDataset(torch.tensor([[1.0, 2.0]], dtype=torch.float64)),
        ...                          partitioner=IIDPartitioner(num_clients=1), clients_per_round=1, batch_size=1)
        >>> model, server = Lin(), FedLAMB()
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[server], logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(model, datamodule=dm)
        >>> g = torch.tensor([-1.0, -2.0], dtype=torch.float64)
        >>> v = 0.999 * 1e-8 + 0.001 * g**2                     # l. 10 from v⁰ = v̂_0 = ε (max(v̂, v) = v)
        >>> p = (0.1 * g / 0.1) / ((v / 0.001).sqrt() + 1e-8)  # l. 11: m/(1 − β₁), v̂/(1 − β₂) at t = 1
        >>> theta = torch.tensor([3.0, 4.0], dtype=torch.float64)
        >>> theta - 0.1 * theta.norm() / p.norm() * p          # l. 12: θ − α·φ(‖θ‖)·p/‖p‖, ‖θ‖ = 5
        tensor([3.3536, 4.3536], dtype=torch.float64)
        >>> model.theta.detach()
        tensor([3.3536, 4.3536], dtype=torch.float64)
        >>> v_hat = torch.maximum(torch.full_like(v, 1e-8), v)  # l. 16: v̂_1 = max(v̂_0, v_1^T), one client
        >>> torch.allclose(server.state["second_moment"][0], v_hat, rtol=1e-12, atol=0)
        True
    """

    repr_fields = LocalAdaptiveServer.repr_fields + ("phi_min", "phi_max")
    repr_formats = {"phi_max": none_if_infinite}

    client_optimizer_class = FedLAMBClient

    def __init__(
        self,
        client_lr: Optional[float] = None,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        phi_min: float = 0.0,
        phi_max: Optional[float] = None,
        bias_correction: str = "both",
        ratio_denominator: str = "amsgrad",
        first_moment: str = "reset",
        initial_second_moment: Optional[float] = None,
        lr: float = 1.0,
        weighting: str = "uniform",
    ) -> None:
        super().__init__(
            client_lr=client_lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
            bias_correction=bias_correction, ratio_denominator=ratio_denominator, first_moment=first_moment,
            initial_second_moment=initial_second_moment, lr=lr, weighting=weighting,
        )
        self.phi_min, self.phi_max = check_phi_bounds(phi_min, phi_max)

    def client_optimizer_kwargs(self) -> dict[str, Any]:
        kwargs = super().client_optimizer_kwargs()
        kwargs.update(phi_min=self.phi_min, phi_max=none_if_infinite(self.phi_max))
        return kwargs


class FedAMS(LocalAdaptiveServer):
    """Fed-AMS, the baseline of Karimi et al. (Sec. 4): Algorithm 1 with plain local AMSGrad on the clients
    (:class:`~lightning_fed.algorithms.fedlamb.AMSGradClient`, θ ← θ − α·(p + λθ), no layerwise
    normalisation; the Local AMSGrad of Chen, Li, Li 2020), the same model averaging and v̂ max-averaging on
    the server. (Not the server-side AMSGrad that Wang et al. 2022 also call FedAMS.)

    See :class:`LocalAdaptiveServer` for the rule, the ambiguity choices and the arguments. The paper's
    settings: β₁ = 0.9, β₂ = 0.999, α tuned on a log grid.

    Example: one client, one local step from θ = [3, 4] with g = [−1, −2] and α = 0.1: the first AMSGrad step
    moves each coordinate by about α (|m̃/√ṽ| = |g|/|g|), against l. 9-11 by hand::

        >>> import lightning as L, torch
        >>> from torch.utils.data import TensorDataset
        >>> from lightning_fed import FederatedTrainer
        >>> from lightning_fed.datamodules import FederatedDataModule, IIDPartitioner
        >>> class Lin(L.LightningModule):  # loss −θ·x, so g = −x
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.theta = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
        ...     def training_step(self, batch, batch_idx):
        ...         return -(self.theta * batch[0]).sum()
        ...     def configure_optimizers(self):
        ...         return torch.optim.SGD(self.parameters(), lr=0.1)  # replaced; its lr is α
        >>> dm = FederatedDataModule(TensorDataset(torch.tensor([[1.0, 2.0]], dtype=torch.float64)),
        ...                          partitioner=IIDPartitioner(num_clients=1), clients_per_round=1, batch_size=1)
        >>> model, server = Lin(), FedAMS()
        >>> trainer = FederatedTrainer(max_epochs=1, callbacks=[server], logger=False, enable_progress_bar=False,
        ...                            enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
        >>> trainer.fit(model, datamodule=dm)
        >>> type(trainer.optimizers[0]).__name__
        'AMSGradClient'
        >>> g = torch.tensor([-1.0, -2.0], dtype=torch.float64)
        >>> v = 0.999 * 1e-8 + 0.001 * g**2
        >>> p = g / ((v / 0.001).sqrt() + 1e-8)
        >>> torch.allclose(model.theta, torch.tensor([3.0, 4.0], dtype=torch.float64) - 0.1 * p, rtol=0, atol=1e-12)
        True
        >>> model.theta.detach()
        tensor([3.1000, 4.1000], dtype=torch.float64)
    """

    client_optimizer_class = AMSGradClient
