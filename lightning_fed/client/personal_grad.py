"""Gradients of the client's loss at another point than the model's (issue #55): what a client half needs when the
paper's local step differentiates the loss at a personal model (APFL's mixed model v̄, pFedMe's θ, Per-FedAvg's
adapted w̃) on the same mini-batch as the step.

* :class:`StepBatches` — the client's batches of the round (``ClientContext.client_batches``), one per local step
  in the order the local work takes them (a client's local step is one batch: ``accumulate_grad_batches`` other
  than 1 is refused at fit start), so a half's ``before_optimizer_step`` knows the step's mini-batch ξ;
* :func:`loss_gradient_at` — ∇f(θ; ξ) for any point θ, by the module's own ``training_step``
  (:func:`~lightning_fed.client.personal.personal_step`: ``self.log`` and torchmetrics states kept apart) and
  ``torch.autograd.grad``; the module's parameters, their ``.grad`` and its buffers are as they were afterwards;
* :func:`hessian_vector_product_at` — ∇²f(θ; ξ)·u by double backward (Pearlmutter's exact product);
* :class:`PointGradients` — several of them on one module with one save and restore of its parameters (pFedMe's K
  inner steps).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence

import torch
from torch import Tensor

from lightning_fed.client.personal import personal_step

__all__ = ["PointGradients", "StepBatches", "hessian_vector_product_at", "loss_gradient_at", "parameter_names",
           "parameters_named"]


def parameter_names(module: Any, params: Sequence[Tensor]) -> list[str]:
    """The names of ``params`` (e.g. the federated parameters, ``ClientContext.parameters(module)``) in ``module``,
    in ``module.named_parameters()`` order: what a half keeps to find them again in :func:`parameters_named`."""
    chosen = {id(p) for p in params}
    return [n for n, p in module.named_parameters() if id(p) in chosen]


def parameters_named(module: Any, names: Optional[Sequence[str]]) -> list[Tensor]:
    """``module``'s parameters called ``names`` (:func:`parameter_names`); ``None`` (a half that saw no client in
    this process, e.g. after a resume or in ``trainer.validate``): those that require grad — the federated
    parameters unless some trainable one is in no optimizer group.

    Example::

        >>> net = torch.nn.Linear(2, 1)
        >>> net.bias.requires_grad_(False)
        Parameter containing:
        tensor([...])
        >>> [p.shape for p in parameters_named(net, None)], parameter_names(net, [net.bias])
        ([torch.Size([1, 2])], ['bias'])
    """
    if names is None:
        return [p for p in module.parameters() if p.requires_grad]
    named = dict(module.named_parameters())
    return [named[n] for n in names]


class StepBatches:
    """The client's mini-batches of the round, handed out one per local step (``(batch_idx, batch)``).

    Args:
        context: The client's ``ClientContext`` (its ``client_batches()`` iterates the round's batches again, the
            same batches in the same order as the local work).
        owner: The client half's name, for the errors.

    Raises:
        RuntimeError: outside the federated loop (no ``client_batches``); :meth:`next` after the round's last batch.

    Example::

        >>> from types import SimpleNamespace
        >>> steps = StepBatches(SimpleNamespace(client_batches=lambda: iter(["b0", "b1"])), "Half")
        >>> steps.next(), steps.next()
        ((0, 'b0'), (1, 'b1'))
    """

    def __init__(self, context: Any, owner: str) -> None:
        batches = getattr(context, "client_batches", None)
        if batches is None:
            raise RuntimeError(f"{owner} needs the client's batches (ClientContext.client_batches); it runs only "
                               "inside the federated loop.")
        self.owner = owner
        self._batches: Iterator[Any] = iter(batches())
        self._index = 0

    def next(self) -> tuple[int, Any]:
        """The current local step's ``(batch_idx, batch)``."""
        try:
            batch = next(self._batches)
        except StopIteration:
            raise RuntimeError(f"{self.owner}: the client took more local steps than it has batches this round "
                               f"({self._index}); one local step must be one mini-batch.") from None
        self._index += 1
        return self._index - 1, batch


def _differentiate_at(module: Any, params: list[Tensor], point: Sequence[Tensor], batch: Any, batch_idx: int,
                      vector: Optional[Sequence[Tensor]] = None) -> Optional[list[Tensor]]:
    """∇f(θ; ξ) (``vector`` ``None``) or ∇²f(θ; ξ)·``vector`` at θ = ``point``, the module put back afterwards."""
    with PointGradients(module, params) as at:
        return at.gradient(point, batch, batch_idx, vector)


class PointGradients:
    """A context for several :func:`loss_gradient_at` calls on one module (pFedMe's K inner steps): the parameters
    and buffers are saved once on entry and put back once on exit (each call saves and restores them), the buffers
    also before each gradient, so every :meth:`gradient` equals :func:`loss_gradient_at` with the same arguments
    bit for bit (issue #55: the per-call saves and ``module.buffers()`` walks were a pFedMe round's cost).

    Args:
        module: The LightningModule (its ``training_step`` defines f).
        params: The parameters to differentiate (tensors of ``module`` that require grad).

    Attributes:
        saved: The parameters' values on entry (detached clones, one per parameter).

    Example: Lightning's ``BoringModel`` (a ``Linear(32, 2)``, the MSE to 1) at the point 0 with the input 1:
    ∇_bias = 2·(0 − 1)/2 = −1 per output, ∇_weight = −1·x; the module keeps its own weights::

        >>> from lightning.pytorch.demos.boring_classes import BoringModel
        >>> m = BoringModel()
        >>> params, before = list(m.parameters()), m.layer.bias.detach().clone()
        >>> with PointGradients(m, params) as at:
        ...     w_grad, b_grad = at.gradient([torch.zeros_like(p) for p in params], torch.ones(1, 32))
        >>> b_grad, bool((w_grad == -1).all()), torch.equal(m.layer.bias, before)
        (tensor([-1., -1.]), True, True)
    """

    def __init__(self, module: Any, params: Sequence[Tensor]) -> None:
        self.module, self.params = module, list(params)
        self.saved: list[Tensor] = []
        self._buffers: list[Tensor] = []
        self._saved_buffers: list[Tensor] = []

    def __enter__(self) -> "PointGradients":
        self._buffers = list(self.module.buffers())
        with torch.no_grad():
            self.saved = [p.detach().clone() for p in self.params]
            self._saved_buffers = [b.detach().clone() for b in self._buffers]
        return self

    def __exit__(self, *exc: Any) -> None:
        with torch.no_grad():
            for p, v in zip(self.params, self.saved):
                p.copy_(v)
            self._restore_buffers()

    def _restore_buffers(self) -> None:
        for b, v in zip(self._buffers, self._saved_buffers):
            b.copy_(v)

    def gradient(self, point: Sequence[Tensor], batch: Any, batch_idx: int = 0,
                 vector: Optional[Sequence[Tensor]] = None) -> Optional[list[Tensor]]:
        """∇f(θ; ξ) (``vector`` ``None``) or ∇²f(θ; ξ)·``vector`` at θ = ``point``, as :func:`loss_gradient_at` /
        :func:`hessian_vector_product_at` (``None`` when ``training_step`` returned no loss)."""
        params = self.params
        with torch.no_grad():
            self._restore_buffers()
            for p, v in zip(params, point):
                p.copy_(v)
        with torch.enable_grad():
            loss = personal_step(self.module, batch, batch_idx)
            if loss is None:
                return None
            out = torch.autograd.grad(loss, params, create_graph=vector is not None, allow_unused=True)
            if vector is not None:
                used = [(g * u.to(g)).sum() for g, u in zip(out, vector) if g is not None and g.requires_grad]
                out = torch.autograd.grad(sum(used), params, allow_unused=True) if used else [None] * len(params)
        return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, out)]


def loss_gradient_at(module: Any, params: Sequence[Tensor], point: Sequence[Tensor], batch: Any,
                     batch_idx: int = 0) -> Optional[list[Tensor]]:
    """∇_θ f(θ; ξ) at θ = ``point``: the gradient of the module's ``training_step`` loss on ``batch`` with respect to
    ``params`` (tensors of ``module`` that require grad), evaluated with ``point`` in them.

    Args:
        module: The LightningModule (its ``training_step`` defines f).
        params: The parameters to differentiate (e.g. ``ClientContext.parameters(module)``).
        point: θ, one tensor per parameter (shapes as ``params``).
        batch: The mini-batch ξ.
        batch_idx: Passed to ``training_step``.

    Returns:
        One gradient per parameter (zeros where the loss does not depend on it), detached; ``None`` when
        ``training_step`` returned no loss. ``params`` (values and ``.grad``) and the module's buffers (BatchNorm
        statistics) are unchanged.

    Example: f(w) = (w·x − 1)² at w = 2, x = 3: ∇ = 2·(6 − 1)·3 = 30::

        >>> import lightning as L
        >>> class M(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1))
        ...     def training_step(self, batch, batch_idx):
        ...         return ((self.w * batch - 1.0) ** 2).sum()
        >>> m = M()
        >>> loss_gradient_at(m, [m.w], [torch.tensor([2.0])], torch.tensor([3.0])), m.w
        ([tensor([30.])], Parameter containing:
        tensor([0.], requires_grad=True))
    """
    return _differentiate_at(module, list(params), point, batch, batch_idx)


def hessian_vector_product_at(module: Any, params: Sequence[Tensor], point: Sequence[Tensor], vector: Sequence[Tensor],
                              batch: Any, batch_idx: int = 0) -> Optional[list[Tensor]]:
    """∇²f(θ; ξ)·u at θ = ``point`` for u = ``vector``: the exact Hessian-vector product by differentiating
    ⟨∇f(θ; ξ), u⟩ once more (Pearlmutter 1994), as :func:`loss_gradient_at` (same arguments, same guarantees).

    Example: f(w) = (w·x − 1)² has ∇²f = 2x² = 18 at x = 3, so ∇²f·u = 36 for u = 2::

        >>> import lightning as L
        >>> class M(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = torch.nn.Parameter(torch.zeros(1))
        ...     def training_step(self, batch, batch_idx):
        ...         return ((self.w * batch - 1.0) ** 2).sum()
        >>> m = M()
        >>> hessian_vector_product_at(m, [m.w], [torch.tensor([0.5])], [torch.tensor([2.0])], torch.tensor([3.0]))
        [tensor([36.])]
    """
    return _differentiate_at(module, list(params), point, batch, batch_idx, vector)
