"""Personalisation: a client half that keeps parts of the model local (issue #41).

Personalised FL methods split the model into a shared part, averaged by the server, and a personal part each client
keeps: FedBN keeps its BatchNorm layers (Li et al., ICLR 2021), FedPer and FedRep the head (Arivazhagan et al. 2019;
Collins et al., ICML 2021). :class:`LocalParts` is that split as a :class:`~lightning_fed.client.ClientAlgorithm`:

* **which parts** — by name (``names=["head"]``: the parameters and buffers ``head.*``; a full name selects one
  tensor), by module type (``types=[nn.BatchNorm2d]``: every parameter and buffer of such submodules) or by a
  predicate over ``(name, tensor)`` (any callable from Python; from a config a registered name,
  :data:`PARTS_PREDICATES`); a tensor is kept when any of the three selects it. The selection
  is made once, at fit start (:meth:`LocalParts.setup`), and a selection that matches nothing is refused there.
* **per-client state sized by what it keeps** — one flat vector per client: the kept parameters, then the kept
  buffers, in ``module.named_parameters()`` / ``module.named_buffers()`` order (integer buffers such as BatchNorm's
  ``num_batches_tracked`` stored as the table's floating dtype, exact up to 2^24);
* **a round** — :meth:`LocalParts.start` puts the client's own values of the kept parts into the module (a client
  never seen starts from the global model's values of them, i.e. x_0's: the server never changes them);
  local training updates the whole model; :meth:`LocalParts.finish` stores the kept parts' new values as the client's
  state and puts x_t's values back into them, so the client's update Δ_i is 0 there (and its kept buffers equal the
  global ones): every server rule and aggregator leaves those parts of the global model unchanged, and only the
  shared part is averaged.

The global model therefore holds the shared part and the initial values of the personal parts; a client's personal
model is the global model with its own state's values in the kept parts (:meth:`LocalParts.personal_model`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from lightning_fed.client.algorithm import ClientAlgorithm

__all__ = ["LocalParts", "PARTS_PREDICATES", "check_disjoint_local_parts", "personal_step", "register_parts_predicate",
           "select_parts", "selected_parameters"]


def personal_step(module: Any, batch: Any, batch_idx: int = 0) -> Optional[Tensor]:
    """The module's ``training_step`` on ``batch`` for a personal model (a supported call for client halves that
    train one, e.g. Ditto): the batch is moved to the module's device, ``self.log`` / ``self.log_dict`` calls are
    dropped (they never reach the round's logged values, and do not raise outside Lightning's loop), and every ``torchmetrics`` metric of the module is put back as it was, so the
    global model's logged round values and metric states are unchanged. No backward pass and no optimizer step:
    the caller differentiates the returned loss and updates its personal parameters.

    Returns:
        The loss ``training_step`` returned (its ``"loss"`` entry for a dict), or ``None`` when it returned none.

    Example::

        >>> import lightning as L
        >>> class M(L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = nn.Parameter(torch.ones(1))
        ...     def training_step(self, batch, batch_idx):
        ...         loss = ((self.w * batch - 1.0) ** 2).mean()
        ...         self.log("train_loss", loss)  # would raise outside Lightning's loop
        ...         return loss
        >>> personal_step(M(), torch.tensor([2.0]))
        tensor(1., grad_fn=<MeanBackward0>)
    """
    from lightning.fabric.utilities.apply_func import move_data_to_device

    from lightning_fed.evaluation import _metric_states, _restore_metric_states

    saved = _metric_states(module)
    own = {name: vars(module)[name] for name in ("log", "log_dict") if name in vars(module)}
    module.log = lambda *args, **kwargs: None
    module.log_dict = lambda *args, **kwargs: None
    try:
        device = getattr(module, "device", None)
        if device is not None:
            batch = move_data_to_device(batch, device)
        out = module.training_step(batch, batch_idx)
    finally:
        for name in ("log", "log_dict"):
            if name in own:
                setattr(module, name, own[name])
            else:
                vars(module).pop(name, None)
        _restore_metric_states(saved)
    if isinstance(out, dict):
        out = out.get("loss")
    return out


def select_parts(module: nn.Module, names: Sequence[str] = (), types: Sequence[type] = (),
                 predicate: Optional[Callable[[str, Tensor], bool]] = None) -> tuple[list[int], list[int]]:
    """The positions (in ``module.parameters()`` and in ``module.buffers()``) of the tensors selected by name, module
    type or predicate (see the module doc).

    Args:
        module: The model.
        names: Qualified names of tensors or of submodules (``"head"`` selects ``head.weight``, ``head.bias``).
        types: Module classes whose own parameters and buffers are selected (e.g. ``nn.BatchNorm2d``).
        predicate: ``predicate(name, tensor) -> bool`` for each parameter and buffer (default none).

    Returns:
        ``(parameter positions, buffer positions)``, each ascending.

    Example::

        >>> net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Linear(2, 1))
        >>> select_parts(net, types=[nn.BatchNorm1d])  # BN's weight and bias; its three buffers
        ([2, 3], [0, 1, 2])
        >>> select_parts(net, names=["2"])
        ([4, 5], [])
    """
    types = tuple(types)
    typed: set[str] = set()
    if types:
        for prefix, sub in module.named_modules():
            if isinstance(sub, types):
                typed.update(f"{prefix}.{n}" if prefix else n for n, _ in sub.named_parameters(recurse=False))
                typed.update(f"{prefix}.{n}" if prefix else n for n, _ in sub.named_buffers(recurse=False))

    def chosen(name: str, tensor: Tensor) -> bool:
        if name in typed or any(name == n or name.startswith(n + ".") for n in names):
            return True
        return bool(predicate(name, tensor)) if predicate is not None else False

    params = [i for i, (n, p) in enumerate(module.named_parameters()) if chosen(n, p)]
    buffers = [i for i, (n, b) in enumerate(module.named_buffers()) if chosen(n, b)]
    return params, buffers


def selected_parameters(module: nn.Module, names: Sequence[str], owner: str, argument: str) -> list[int]:
    """At fit start: the positions (in ``module.parameters()``) of the parameters ``names`` select
    (:func:`select_parts`), for a client half that treats part of the model apart without keeping it (FedBABU's
    frozen head, FedALA's top layers).

    Raises:
        ValueError: nothing selected, naming ``owner``, its ``argument`` and the model's first parameter names.

    Example::

        >>> selected_parameters(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1)), ["1"], "FedBABUClient", "head")
        [2, 3]
    """
    params, _ = select_parts(module, names=names)
    if not params:
        raise ValueError(f"{owner}: `{argument}` {list(names)} selects no parameter of {type(module).__name__} "
                         f"(parameters: {[n for n, _ in module.named_parameters()][:8]}).")
    return params


def check_disjoint_local_parts(algorithms: Sequence[Any], module: nn.Module) -> None:
    """Fit-start check (from :meth:`ClientHalves.setup <lightning_fed.client.algorithm.ClientHalves.setup>`, after
    every half's ``setup``): no tensor is kept local by two personal halves (:class:`LocalParts` and its
    subclasses, FedBN's, FedPer's and FedRep's client halves). Each half puts its own per-client values into what it
    keeps at a client's start and x_t's values back at its finish, so with two halves on one tensor the second would
    put back the first's client values: the client's update would not be 0 there and its kept part would be
    averaged into the global model.

    Args:
        algorithms: The run's client halves (those that are not :class:`LocalParts` are ignored).
        module: The model the halves were set up on.

    Raises:
        ValueError: naming both halves and the parameter / buffer names they both keep.

    Example::

        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
        >>> a, b = LocalParts(names=["1"]), LocalParts(names=["1.bias"])
        >>> a.setup(net); b.setup(net)
        >>> check_disjoint_local_parts([a, b], net)
        Traceback (most recent call last):
        ...
        ValueError: Client halves LocalParts(names=['1'], types=[], predicate=None) and LocalParts(names=['1.bias'], types=[], predicate=None) both keep 1.bias local; each tensor must be kept by one personal half only (otherwise the second half puts the first's client values back into the global model, which then averages them). Drop it from one half's selection.
    """
    halves = [(a, a.kept_names(module)) for a in algorithms if isinstance(a, LocalParts) and a.selected]
    for i, (a, kept) in enumerate(halves):
        for b, other in halves[i + 1:]:
            both = [name for name in kept if name in set(other)]  # parameters, then buffers, in module order
            if both:
                raise ValueError(
                    f"Client halves {a!r} and {b!r} both keep {', '.join(both)} local; each tensor must be kept by "
                    "one personal half only (otherwise the second half puts the first's client values back into "
                    "the global model, which then averages them). Drop it from one half's selection."
                )


def bias_tensors(name: str, tensor: Tensor) -> bool:
    """A registered :class:`LocalParts` predicate (``"bias_tensors"``): the biases (names ending in ``bias``)."""
    return name.rsplit(".", 1)[-1] == "bias"


def vector_tensors(name: str, tensor: Tensor) -> bool:
    """A registered :class:`LocalParts` predicate (``"vector_tensors"``): tensors of at most one dimension (biases,
    normalisation layers' scales and running statistics)."""
    return tensor.ndim <= 1


#: The predicates a config may name as ``LocalParts(predicate=...)`` (``predicate: bias_tensors``): name -> function.
#: A config can name only these (any other name, or a ``class_path``, is refused: YAML must not pick an arbitrary
#: importable function to call at fit start); Python callers may pass any callable. Add your own with
#: :func:`register_parts_predicate`.
PARTS_PREDICATES: dict[str, Callable[[str, Tensor], bool]] = {"bias_tensors": bias_tensors,
                                                              "vector_tensors": vector_tensors}


def register_parts_predicate(name: str, predicate: Callable[[str, Tensor], bool]) -> Callable[[str, Tensor], bool]:
    """Make ``predicate`` nameable from configs as ``LocalParts(predicate=name)`` (see :data:`PARTS_PREDICATES`).
    Returns ``predicate``.

    Raises:
        TypeError: ``name`` not a non-empty str, or ``predicate`` not callable.
        ValueError: ``name`` already names another function.

    Example::

        >>> def head_only(name, tensor):
        ...     return name.startswith("head.")
        >>> _ = register_parts_predicate("head_only", head_only)
        >>> LocalParts(predicate="head_only").predicate is head_only
        True
        >>> del PARTS_PREDICATES["head_only"]
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"`name` must be a non-empty str, got {name!r}.")
    if not callable(predicate):
        raise TypeError(f"`predicate` must be callable as predicate(name, tensor) -> bool, got {predicate!r}.")
    if PARTS_PREDICATES.get(name, predicate) is not predicate:
        raise ValueError(f"A LocalParts predicate is already registered as {name!r}: {PARTS_PREDICATES[name]!r}.")
    PARTS_PREDICATES[name] = predicate
    return predicate


def resolve_parts_predicate(predicate: Any) -> Optional[Callable[[str, Tensor], bool]]:
    """``predicate`` as :class:`LocalParts` takes it: ``None``; a registered name (:data:`PARTS_PREDICATES`) as its
    function; any other callable as it is (Python callers).

    Raises:
        ValueError: a str that names no registered predicate, naming the allowed ones.
        TypeError: anything else that is not callable.
    """
    if predicate is None or (callable(predicate) and not isinstance(predicate, str)):
        return predicate
    if isinstance(predicate, str):
        if predicate in PARTS_PREDICATES:
            return PARTS_PREDICATES[predicate]
        raise ValueError(
            f"`predicate` {predicate!r} is not a registered LocalParts predicate; a config may name only "
            f"{sorted(PARTS_PREDICATES)} (register others in Python with "
            "lightning_fed.client.personal.register_parts_predicate, or pass a callable from Python)."
        )
    raise TypeError(f"`predicate` must be callable as predicate(name, tensor) -> bool, got {predicate!r}.")


class LocalParts(ClientAlgorithm):
    """A client half that keeps the selected parts of the model local to each client; the rest is averaged
    (see the module doc). FedBN, FedPer and FedRep are subclasses that fix the selection.

    Args:
        names: Tensor or submodule names kept local (default none).
        types: Module classes whose parameters and buffers are kept local (default none).
        predicate: ``predicate(name, tensor) -> bool`` (default none): from Python any callable; from a config
            only a registered name (:data:`PARTS_PREDICATES`: ``bias_tensors``, ``vector_tensors`` and those added
            with :func:`register_parts_predicate`), so YAML cannot pick an arbitrary importable function.

    Raises:
        TypeError: ``names`` not a list of strings, ``types`` not a list of classes, ``predicate`` not callable.
        ValueError: ``predicate`` a name that is not registered (naming the registered ones).
        ValueError: at fit start, a selection that matches no parameter or buffer of the model; a tensor that
            another personal half of the run keeps too (:func:`check_disjoint_local_parts`).

    Example: keep the last layer of each client (FedPer-style) under FedAdam::

        >>> from lightning_fed.callbacks import FedAdam
        >>> half = LocalParts(names=["net.2"])
        >>> half.setup(nn.Module())
        Traceback (most recent call last):
        ...
        ValueError: LocalParts(names=['net.2'], types=[], predicate=None) keeps nothing of Module: no parameter or buffer is selected by names ['net.2'], types [] or the predicate.
    """

    #: Whether the global model holds the kept parts at their initial values, which no client's model uses (FedBN,
    #: FedPer, FedRep, ...: :func:`lightning_fed.personal.warn_untrained_global_parts` then warns at fit start).
    #: ``False`` where the method defines the global model with them so (FedRoD: the personal head starts at 0, so the
    #: global model is the paper's generic model).
    global_model_holds_unused_parts: bool = True

    def __init__(self, names: Optional[Sequence[str]] = None, types: Optional[Sequence[type]] = None,
                 predicate: Optional[Union[str, Callable[[str, Tensor], bool]]] = None) -> None:
        names = [] if names is None else ([names] if isinstance(names, str) else list(names))
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"`names` must be a list of tensor or submodule names (str), got {names!r}.")
        types = [] if types is None else ([types] if isinstance(types, type) else list(types))
        if not all(isinstance(t, type) for t in types):
            raise TypeError(f"`types` must be a list of module classes (e.g. torch.nn.BatchNorm2d), got {types!r}.")
        predicate = resolve_parts_predicate(predicate)
        self.names, self.types, self.predicate = names, types, predicate
        self._params: list[int] = []
        self._buffers: list[int] = []
        self._dim = 0
        self._global: Optional[list[Tensor]] = None  # x_t's values of the kept tensors during a client's work

    # ------------------------------------------------------------------ which parts
    def select(self, module: nn.Module) -> tuple[list[int], list[int]]:
        """The kept parts: ``(parameter positions, buffer positions)`` (:func:`select_parts` with this half's
        ``names``, ``types`` and ``predicate``); a subclass may select otherwise."""
        return select_parts(module, self.names, self.types, self.predicate)

    def setup(self, module: nn.Module) -> None:
        """At fit start: select the kept parts of ``module`` and size the per-client state by them.

        Raises:
            ValueError: nothing selected.
        """
        self._params, self._buffers = self.select(module)
        if not self._params and not self._buffers:
            raise ValueError(
                f"{self!r} keeps nothing of {type(module).__name__}: no parameter or buffer is selected by names "
                f"{self.names}, types {[t.__name__ for t in self.types]} or the predicate."
            )
        params, buffers = list(module.parameters()), list(module.buffers())
        self._dim = sum(params[i].numel() for i in self._params) + sum(buffers[i].numel() for i in self._buffers)

    @property
    def selected(self) -> bool:
        """Whether :meth:`setup` has selected the kept parts."""
        return self._dim > 0

    def kept_names(self, module: nn.Module) -> list[str]:
        """The names of the kept parameters, then buffers (after :meth:`setup`)."""
        pnames = [n for n, _ in module.named_parameters()]
        bnames = [n for n, _ in module.named_buffers()]
        return [pnames[i] for i in self._params] + [bnames[i] for i in self._buffers]

    def local_parameters(self) -> list[int]:
        """The kept parameters' positions in ``module.parameters()`` (after :meth:`setup`): under a DP chain the
        server leaves them out of the clipping norm and the noise (:meth:`ClientAlgorithm.local_parameters
        <lightning_fed.client.algorithm.ClientAlgorithm.local_parameters>`)."""
        return list(self._params)

    def local_buffers(self) -> list[int]:
        """The kept buffers' positions in ``module.buffers()`` (after :meth:`setup`): not sent either way."""
        return list(self._buffers)

    def state_dim(self, num_params: int) -> int:
        """The number of kept values (parameters and buffers), known after :meth:`setup`."""
        return self._dim

    def _kept(self, module: nn.Module) -> list[Tensor]:
        params, buffers = list(module.parameters()), list(module.buffers())
        return [params[i] for i in self._params] + [buffers[i] for i in self._buffers]

    # ------------------------------------------------------------------ a round
    def start(self, module: Any, context: Any, state: Optional[Tensor]) -> None:
        """Put the client's own values of the kept parts into ``module`` (``state`` ``None``: keep x_t's)."""
        kept = self._kept(module)
        self._global = [t.detach().clone() for t in kept]
        if state is not None:
            self.load_state(kept, state)

    @staticmethod
    def load_state(kept: list[Tensor], state: Tensor) -> None:
        """Copy the flat ``state`` into the tensors ``kept`` (cast to each one's dtype and device)."""
        offset = 0
        with torch.no_grad():
            for t in kept:
                n = t.numel()
                t.copy_(state[offset:offset + n].reshape(t.shape).to(device=t.device, dtype=t.dtype))
                offset += n

    def finish(self, module: Any, context: Any) -> tuple[dict[str, Any], Optional[Tensor]]:
        """The kept parts' new values as the client's state; x_t's values back into them (Δ_i = 0 there)."""
        kept = self._kept(module)
        with torch.no_grad():
            state = torch.cat([t.detach().reshape(-1).cpu().to(torch.float64) for t in kept])
            for t, g in zip(kept, self._global or []):
                t.copy_(g)
        self._global = None
        return {}, state

    # ------------------------------------------------------------------ a client's personal model
    def personal_model(self, module: nn.Module, state: Optional[Tensor]) -> None:
        """Turn ``module`` (holding the global model) into a client's personal model in place: its ``state`` (a row
        of this half's table; ``None``: the client was never trained, the global model is its model) in the kept
        parts."""
        if state is not None:
            self.load_state(self._kept(module), state)

    def settings(self) -> dict[str, Any]:
        return {"names": self.names, "types": self.types, "predicate": self.predicate}

    def __repr__(self) -> str:
        if type(self) is not LocalParts:
            return super().__repr__()
        return (f"LocalParts(names={self.names!r}, types={[t.__name__ for t in self.types]!r}, "
                f"predicate={getattr(self.predicate, '__name__', None) if self.predicate else None})")
