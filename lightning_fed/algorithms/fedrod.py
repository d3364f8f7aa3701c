"""FedRoD (Chen, Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR 2022,
Fed-RoD): a shared feature extractor f(·; θ) and a generic head h(·; ψ), trained with the balanced risk
and federated, plus a personal head h(·; φ_i) per client, trained with the ordinary risk and kept local; the
personalised prediction adds the two heads' logits.

The method (round t, client i with class counts N_i,c, step size η; z = f(x; θ), g = h(z; ψ), p = h(z; φ_i))::

    L_i^BR(θ, ψ)  = mean over the batch of −log softmax(g + log N_i)_y        (balanced softmax)     
    L_i(φ_i)      = mean over the batch of −log softmax(sg(g) + p(sg(z)))_y   (the personal head only)
    every mini-batch:  (θ, ψ) ← (θ, ψ) − η·∇ L_i^BR,   φ_i ← φ_i − η·∇_φ L_i    (local training)
    server:  (θ, ψ) ← Σ_i (n_i / n)·(θ_i, ψ_i)                               (FedAvg of the generic model)
    prediction of client i:  ŷ = argmax (h(z; ψ) + h(z; φ_i))

What the module must look like (the structure is the user's; :class:`FedRoDClient` names its parts):

* two heads on the same features, ``generic_head`` and ``personal_head`` (submodule names, e.g. ``"head"`` and
  ``"personal_head"``), and a ``forward`` / ``training_step`` / ``validation_step`` whose logits are
  ``generic_head(z) + personal_head(z)``;
* ``training_step``'s loss is the cross-entropy of those logits against the labels, and a batch is ``(x, y, ...)``
  (the labels second);
* the personal head's initial parameters are all 0 (checked at fit start): the global model then predicts with the
  generic head alone (its ``val_*`` are the generic model's), and every client's personal head starts from 0;
* the data module has per-sample labels (``labels=``, the dataset's ``targets`` or a Hugging Face ``label_column``):
  N_i,c counts client i's training labels.

During a client's local work :class:`FedRoDClient` adds log N_i to the generic head's output (so the module's own
cross-entropy is the balanced softmax loss L^BR; a class the client lacks gets −∞, as in Balanced Softmax), sets the
personal head's contribution to the module's loss to 0, and adds L_i — computed from the same forward pass, with the
features and the generic logits detached — to ``training_step``'s loss: one backward pass gives ∇L^BR to θ, ψ and
∇L_i to φ_i, and the client optimizer updates all three in one step (simultaneous updates with the client's
learning rate). The personal head is a :class:`~lightning_fed.client.personal.LocalParts` (its update is 0 and
the client keeps its values); the body and the generic head are aggregated by any server rule (:class:`FedRoD` is
FedAvg with the n_i/n weights). The personal model (``fed_personal_<m>``) is the global model with the client's
personal head. Choices that differ from the paper or that it leaves open: the personal head's zero start; L^BR and
L_i stepped together (from one forward pass) by the client optimizer; what ``self.log`` records in
``training_step`` during training is the balanced loss; the authors' hyper-network variant (FedRoD with a
hyper-network generating φ_i) is not implemented.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_fed.callbacks.fedavg import FedAvg
from lightning_fed.checks import ArgumentError
from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.client.personal import LocalParts
from lightning_fed.server.aggregators.base import Stage

__all__ = ["FedRoD", "FedRoDClient"]


def _submodule_name(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ArgumentError(f"`{name}` must be the name of a submodule of the model (a non-empty str, e.g. 'head'), "
                            f"got {value!r}.")
    return value


class FedRoDClient(LocalParts):
    """FedRoD's client half (Chen & Chao 2022): the generic head trained with the balanced softmax loss of
    the client's class counts, the personal head (kept local) with the ordinary loss on top of the generic logits
    (see :mod:`lightning_fed.algorithms.fedrod` for what the module must provide).

    Args:
        generic_head: Name of the generic head submodule (federated), e.g. ``"head"``.
        personal_head: Name of the personal head submodule (kept per client, initialised to 0), e.g.
            ``"personal_head"``.

    Raises:
        ValueError: a name that is not a non-empty str, or the same name twice; at fit start, a name that is not a
            submodule, a personal head whose parameters are not all 0, a data module without labels.

    Example::

        >>> net = nn.ModuleDict({"head": nn.Linear(2, 3), "personal_head": nn.Linear(2, 3)})
        >>> nn.init.zeros_(net.personal_head.weight), nn.init.zeros_(net.personal_head.bias)  # doctest: +ELLIPSIS
        (...)
        >>> half = FedRoDClient(generic_head="head", personal_head="personal_head")
        >>> half.setup(net)
        >>> half, half.state_dim(0)
        (FedRoDClient(generic_head='head', personal_head='personal_head'), 9)
    """

    #: The personal head starts at 0 (checked at fit start), so the global model predicts with the generic head alone:
    #: it is the paper's generic model (G-FL), and its central `val_*` are no misreading (no GlobalModelPartsWarning).
    global_model_holds_unused_parts = False

    def __init__(self, generic_head: str = "head", personal_head: str = "personal_head") -> None:
        self.generic_head = _submodule_name("generic_head", generic_head)
        self.personal_head = _submodule_name("personal_head", personal_head)
        if self.generic_head == self.personal_head:
            raise ArgumentError(f"`generic_head` and `personal_head` must name two different submodules, got "
                                f"{generic_head!r} twice.")
        super().__init__(names=[self.personal_head])
        self._labels: Optional[np.ndarray] = None  # the training set's labels (from the data module, at fit start)
        self._log_counts: Optional[np.ndarray] = None  # log N_i,c of the client in local work
        self._hooks: list[Any] = []
        self._restore_step: Optional[Any] = None
        self._features: Optional[Tensor] = None
        self._generic: Optional[Tensor] = None
        self._personal: Optional[Tensor] = None
        self._inside = False
        self._counts = np.zeros(0, dtype=np.int64)

    def settings(self) -> dict[str, Any]:
        return {"generic_head": self.generic_head, "personal_head": self.personal_head}

    def _heads(self, module: nn.Module) -> tuple[nn.Module, nn.Module]:
        subs = dict(module.named_modules())
        for arg in ("generic_head", "personal_head"):
            if getattr(self, arg) not in subs or getattr(self, arg) == "":
                raise ValueError(f"FedRoDClient: `{arg}` {getattr(self, arg)!r} is not a submodule of "
                                 f"{type(module).__name__} (its submodules: {[n for n in subs if n][:8]}).")
        return subs[self.generic_head], subs[self.personal_head]

    def setup(self, module: nn.Module) -> None:
        """At fit start: find both heads, check the personal head starts at 0, read the training labels.

        Raises:
            ValueError: see the class doc.
        """
        _, personal = self._heads(module)
        super().setup(module)
        nonzero = [n for n, p in personal.named_parameters() if bool(p.detach().ne(0).any())]
        if nonzero:
            raise ValueError(
                f"FedRoDClient: the personal head {self.personal_head!r} must start at 0 (so the global model predicts "
                f"with the generic head alone and each client's personal head starts from 0); {nonzero} are not "
                f"(e.g. `nn.init.zeros_(self.{self.personal_head}.weight)` in the module's __init__).")
        try:
            trainer = module.trainer  # a LightningModule attached to the fit's trainer
        except (AttributeError, RuntimeError):
            trainer = None
        source = getattr(getattr(trainer, "datamodule", None), "data_source", None)
        if source is not None:
            labels = np.asarray(source.read_labels(needed_by="FedRoDClient (the class counts of its balanced softmax)"))
            if not np.issubdtype(labels.dtype, np.integer):
                raise ValueError(f"FedRoDClient counts each client's classes by their integer labels (the generic "
                                 f"head's output positions), but the data module's labels are {labels.dtype} "
                                 "(e.g. class names): give integer class indices (`labels=`, `targets`).")
            self._labels = labels

    # ------------------------------------------------------------------ a client's local work
    def start(self, module: Any, context: Any, state: Optional[Tensor]) -> None:
        """Load the client's personal head; install the balanced loss for its local work."""
        self._uninstall()  # a client that failed before its finish
        super().start(module, context, state)
        if self._labels is None:
            raise RuntimeError("FedRoDClient needs the data module's labels (read at fit start); it runs only inside "
                               "the federated loop of a fit.")
        dm = module.trainer.datamodule
        self._counts = np.bincount(self._labels[dm.client_indices(context.client_id)].astype(np.int64))
        generic, personal = self._heads(module)
        self._hooks = [generic.register_forward_hook(self._balance),
                       personal.register_forward_hook(self._personal_part)]
        step = module.training_step
        own = vars(module).get("training_step")

        def training_step(batch: Any, *args: Any, **kwargs: Any) -> Any:
            out = step(batch, *args, **kwargs)
            if not isinstance(batch, (tuple, list)) or len(batch) < 2:
                raise ValueError("FedRoDClient needs batches (x, y, ...) with the labels second, got a "
                                 f"{type(batch).__name__}.")
            if self._generic is None or self._personal is None:
                raise RuntimeError(f"FedRoDClient: training_step did not call both heads ({self.generic_head!r}, "
                                   f"{self.personal_head!r}).")
            y = batch[1].to(self._personal.device)
            personal_loss = F.cross_entropy(self._generic.detach() + self._personal, y)  # L_i, φ_i only
            self._generic = self._personal = None
            if isinstance(out, dict):
                return {**out, "loss": out["loss"] + personal_loss}
            return out + personal_loss

        module.training_step = training_step
        self._restore_step = (module, own)

    def _balance(self, head: nn.Module, inputs: Any, output: Tensor) -> Tensor:
        """The generic head's logits g + log N_i (the module's cross-entropy becomes L^BR); in train mode only (a
        client that raised before its ``finish`` leaves the hooks until the next client's ``start``)."""
        if not head.training:
            return None
        classes = output.shape[-1]
        if len(self._counts) > classes:
            raise ValueError(f"FedRoDClient: a label {len(self._counts) - 1} of client data is outside the generic "
                             f"head's {classes} classes.")
        self._generic = output
        with np.errstate(divide="ignore"):
            log_counts = np.log(np.pad(self._counts, (0, classes - len(self._counts))).astype(np.float64))
        return output + torch.as_tensor(log_counts, dtype=output.dtype, device=output.device)

    def _personal_part(self, head: nn.Module, inputs: Any, output: Tensor) -> Optional[Tensor]:
        """The personal head's logits on the detached features (kept for L_i); 0 in the module's own loss."""
        if self._inside or not head.training:  # the call below; eval mode (see _balance)
            return None
        self._inside = True
        try:
            self._personal = head(inputs[0].detach())
        finally:
            self._inside = False
        return torch.zeros_like(output)

    def finish(self, module: Any, context: Any) -> tuple[dict[str, Any], Optional[Tensor]]:
        """Remove the balanced loss; store the personal head (its update is 0)."""
        self._uninstall()
        return super().finish(module, context)

    def _uninstall(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._restore_step is not None:
            module, own = self._restore_step
            if own is None:
                vars(module).pop("training_step", None)
            else:
                module.training_step = own
            self._restore_step = None
        self._generic = self._personal = None


class FedRoD(FedAvg):
    """FedRoD (Chen & Chao, ICLR 2022): FedAvg (n_i/n) over the body and the generic head, trained with
    the balanced softmax loss; each client's personal head kept local (see :mod:`lightning_fed.algorithms.fedrod`).

    Args:
        generic_head: Name of the generic head submodule (default ``"head"``).
        personal_head: Name of the personal head submodule (default ``"personal_head"``).
        lr: Server learning rate (default 1.0).
        weighting: ``"num_samples"`` (default, n_i/n) or ``"uniform"``.
        aggregators: As :class:`FedAvg`.
        client: More client halves, run after FedRoD's (default ``None``).

    Example::

        >>> FedRoD()
        FedRoD(generic_head='head', personal_head='personal_head', lr=1.0, weighting='num_samples')
    """

    repr_fields = ("generic_head", "personal_head", "lr", "weighting")
    carried_client_half = ("FedRoDClient", {"generic_head": "generic_head", "personal_head": "personal_head"})

    def __init__(self, generic_head: str = "head", personal_head: str = "personal_head", lr: float = 1.0,
                 weighting: str = "num_samples", aggregators: Optional[list[Stage]] = None,
                 client: Optional[list[ClientAlgorithm]] = None) -> None:
        super().__init__(lr=lr, weighting=weighting, aggregators=aggregators, client=client)
        self._own_client = [FedRoDClient(generic_head, personal_head)]
        self.generic_head, self.personal_head = generic_head, personal_head
