"""pFedMe (Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020, Algorithm 1):
each client's personal model θ_i solves the Moreau-envelope problem min_θ f_i(θ) + λ/2·‖θ − w‖² around its local
copy w of the global model, and w moves towards θ_i; the server mixes the clients' w into the global model with β.

Algorithm 1 (round t, R local rounds, K inner steps, personal step size ν, step size η)::

    w_{i,0}^t = w_t                                                                     (l. 4: server sends w_t)
    for r = 0 … R − 1:
        sample a mini-batch D_i; θ̃_i ≈ argmin_θ f_i(θ; D_i) + λ/2·‖θ − w_{i,r}^t‖²       (l. 6-7, eq. (7))
            by K gradient steps  θ ← θ − ν·(∇f_i(θ; D_i) + λ(θ − w_{i,r}^t))
        w_{i,r+1}^t = w_{i,r}^t − ηλ·(w_{i,r}^t − θ̃_i)                                      (l. 8)
    server:  w_{t+1} = (1 − β)·w_t + β·(1/S)·Σ_{i∈S^t} w_{i,R}^t                           (l. 10-11)

Here each local round r is one local step of the client's local work (its mini-batch D_i): :class:`PFedMeClient`
runs the K inner steps in ``before_optimizer_step`` on the step's batch
(:class:`~lightning_fed.client.personal_grad.StepBatches`, the gradients by the module's ``training_step``,
:func:`~lightning_fed.client.personal_grad.loss_gradient_at`) and replaces the gradient by λ(w − θ̃_i), so the client
optimizer's step with learning rate η is l. 8 (plain SGD, no momentum or weight decay, is the paper's; another
optimizer applies its own rule to that gradient). l. 10-11 is FedAvg with server learning rate β and the uniform
mean: x_{t+1} = x_t + β·(mean_i w_{i,R} − x_t) = (1 − β)·x_t + β·mean_i w_{i,R} exactly, so
:class:`~lightning_fed.algorithms.pfedme.PFedMe` is ``FedAvg(lr=β, weighting="uniform")`` with the client half;
any other server rule takes the same pseudo-gradient (pFedMe's w under FedAdam). β is ``PFedMe(lr=β)``, the server
learning rate, named as every server optimizer's. θ̃_i of the client's last local
step is its per-client state and its personal model (``fed_personal_<m>``), as the authors evaluate
(``persionalized_model_bar``).

Choices the paper leaves open or that differ from it:

* the inner problem starts from w_t at the round's start and each local round warm-starts from the previous θ̃_i (the
  authors' code, github.com/CharlieDinh/pFedMe ``userpFedMe.py``: ``self.model`` is set to w_t and kept across the
  local rounds); the training step's own forward/backward at w is computed and discarded;
* all N clients train every round in Alg. 1 (only S^t send); here only the round's cohort trains, which gives the
  same global model — a client's personal model is then that of the last round it was sampled;
* the authors' optional L2 term μ of the inner problem is not offered (μ = 0);
* buffers (BatchNorm statistics) are the global model's during the inner steps and are put back afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import Tensor

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.checks import check_positive, check_positive_int
from lightning_fed.client.algorithm import ClientAlgorithm, flat, unflat
from lightning_fed.client.personal_grad import PointGradients, StepBatches, parameter_names, parameters_named
from lightning_fed.server.aggregators.base import Stage

if TYPE_CHECKING:  # pragma: no cover
    from lightning_fed.client.runner import ClientContext

__all__ = ["PFedMe", "PFedMeClient"]


class PFedMeClient(ClientAlgorithm):
    """pFedMe's client half (Dinh et al. 2020, Alg. 1, l. 6-8): at every local step, K gradient steps on the
    personal model θ for f_i(θ; D_i) + λ/2‖θ − w‖² on the step's mini-batch D_i, then the gradient of the client's
    step becomes λ(w − θ̃) (l. 8 when the client optimizer is SGD with learning rate η).

    Args:
        lam: λ (> 0), the Moreau envelope's regularisation (default 15.0).
        inner_steps: K, the inner gradient steps per local step (an integer ≥ 1; default 5).
        personal_lr: ν, the inner steps' step size (> 0; default 0.09). λ = 15 and ν = 0.09 (with η = 0.005,
            β = 1, batch size 20, R = 20 local rounds) are the authors' MNIST command (github.com/CharlieDinh/pFedMe
            README, non-convex case).

    Raises:
        ValueError: ``lam`` or ``personal_lr`` not a finite number > 0, ``inner_steps`` not an integer ≥ 1; in a
            fit, a half run outside the federated loop (no client batches).

    Example::

        >>> PFedMeClient(lam=15.0, inner_steps=5, personal_lr=0.05)
        PFedMeClient(lam=15.0, inner_steps=5, personal_lr=0.05)
    """

    def __init__(self, lam: float = 15.0, inner_steps: int = 5, personal_lr: float = 0.09) -> None:
        self.lam = check_positive("lam", lam)
        self.inner_steps = check_positive_int("inner_steps", inner_steps)
        self.personal_lr = check_positive("personal_lr", personal_lr)
        self._names: Optional[list[str]] = None  # the federated parameters' names (θ covers them only)
        self._params: list[Tensor] = []
        self._theta: list[Tensor] = []
        self._batches: Optional[StepBatches] = None

    def state_dim(self, num_params: int) -> int:
        """θ̃_i: one number per federated parameter entry."""
        return num_params

    def start(self, module: Any, context: "ClientContext", state: Optional[Tensor]) -> None:
        """θ starts from w_t (the stored θ̃_i is the client's personal model only)."""
        self._params = context.parameters(module)
        self._names = parameter_names(module, self._params)
        self._theta = [p.detach().clone() for p in self._params]
        self._batches = StepBatches(context, type(self).__name__)

    def before_optimizer_step(self, module: Any, optimizer: Any) -> None:
        """l. 6-7 (K inner steps from the previous θ̃) and l. 8's gradient λ(w − θ̃) into ``.grad``."""
        if self._batches is None:
            return
        batch_idx, batch = self._batches.next()
        with torch.no_grad():
            theta = [t.clone() for t in self._theta]
        with PointGradients(module, self._params) as at:  # one save/restore of w for the K gradients
            w = at.saved
            for _ in range(self.inner_steps):
                g = at.gradient(theta, batch, batch_idx)
                if g is None:
                    return
                with torch.no_grad():  # θ ← θ − ν·(g + λ(θ − w)), in place: the same operations in the same order
                    for t, gi, wi in zip(theta, g, w):
                        t.sub_(torch.sub(t, wi).mul_(self.lam).add_(gi).mul_(self.personal_lr))
        self._theta = theta
        with torch.no_grad():
            for p, wi, t in zip(self._params, w, theta):
                p.grad = self.lam * (wi - t)

    def finish(self, module: Any, context: "ClientContext") -> tuple[dict[str, Any], Optional[Tensor]]:
        """θ̃_i of the last local step, the client's personal model."""
        state = flat(self._theta)
        self._batches, self._theta = None, []
        return {}, state

    def personal_model(self, module: Any, state: Optional[Tensor]) -> None:
        """``module`` (the global model) becomes client i's personal model θ̃_i in place (``None``: never trained,
        the global model)."""
        if state is None:
            return
        params = parameters_named(module, self._names)
        with torch.no_grad():
            for p, t in zip(params, unflat(state, params)):
                p.copy_(t)


class PFedMe(FedAvg):
    """pFedMe (Dinh et al., NeurIPS 2020, Alg. 1): the server's β-mixing x ← (1 − β)x + β·mean_i w_i (FedAvg with
    server learning rate β and the uniform mean) over clients that run :class:`PFedMeClient` (see
    :mod:`lightning_fed.algorithms.pfedme`).

    Args:
        lam: λ (default 15.0).
        inner_steps: K (default 5).
        personal_lr: ν (default 0.09).
        lr: β (> 0, default 1.0: the plain mean; the paper also runs β > 1), the server learning rate of FedAvg,
            which is l. 11's β-mixing.
        weighting: ``"uniform"`` (default, l. 11) or ``"num_samples"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after pFedMe's (default ``None``).

    Raises:
        ValueError: ``lr`` (β) not a finite number > 0; what :class:`PFedMeClient` refuses.

    Example::

        >>> PFedMe(lam=15.0, lr=2.0)  # β = 2
        PFedMe(lam=15.0, inner_steps=5, personal_lr=0.09, lr=2.0, weighting='uniform')
    """

    repr_fields = ("lam", "inner_steps", "personal_lr", "lr", "weighting")
    #: The client half a CLI swap of the server optimizer carries into ``trainer.client_algorithms`` (its argument:
    #: this class's); β, the server rule's lr, is what the swap replaces.
    carried_client_half = ("PFedMeClient", {"lam": "lam", "inner_steps": "inner_steps", "personal_lr": "personal_lr"})

    def __init__(self, lam: float = 15.0, inner_steps: int = 5, personal_lr: float = 0.09, lr: float = 1.0,
                 weighting: str = "uniform", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [PFedMeClient(lam, inner_steps, personal_lr)]
        self.lam, self.inner_steps, self.personal_lr = lam, inner_steps, personal_lr
