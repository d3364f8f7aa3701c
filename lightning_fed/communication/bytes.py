"""Bytes counted: what travels between the server and the clients in each round (issue #56 item 1).

Per client of a round's cohort (every sampled client that was available, including one that then fails):

* **down** (the broadcast x_t; encoded, its size :meth:`~lightning_fed.communication.base.Compressor.size`, under
  :class:`~lightning_fed.communication.downlink.DownlinkCompression`): the federated parameters that travel — :func:`travelling_positions`: not frozen
  (:func:`~lightning_fed.client.runner.federated_parameters`, so only the trainable ones under LoRA) and not kept on
  the client by a personal half (:class:`~lightning_fed.client.personal.LocalParts`: FedPer's head, FedBN's norm
  layers) — and the module's buffers not kept local, each ``numel × element_size`` bytes, and what a client half
  receives besides (:meth:`~lightning_fed.client.ClientAlgorithm.download_bytes`: SCAFFOLD's control c);
* **up** (per client that reported back, kept or later dropped as non-finite or an outlier): Δ_i over the
  travelling parameters as encoded — ``ClientUpdate.delta_bytes`` when a compressor encoded it
  (:class:`~lightning_fed.communication.compression.Compression`), else ``numel × element_size`` — plus the buffers
  not kept local and every tensor of ``ClientUpdate.extras`` (SCAFFOLD's Δc_i, Fed-LAMB's moments), raw. The
  per-client states of client halves (``extras["client_state/..."]``) are not counted: a real client keeps them.

The loop logs, every round (step t, as the round metrics): ``round_bytes_down`` and ``round_bytes_up`` (the round's
sums over its clients) and ``total_bytes_down`` / ``total_bytes_up`` (since round 0, kept across a resume
in the loop's checkpoint state). They go to the trainer's loggers as Python numbers (:meth:`CommunicationLedger.log`;
exact in a CSV log, float32 in TensorBoard, which stores every scalar so; the HParams tab lists them with the round
metrics), not through ``LightningModule.log`` (whose float32 tensors round counts above 2^24 bytes), so they are not
in ``trainer.callback_metrics``; :class:`CommunicationLedger` on ``trainer.fit_loop.communication`` holds the exact
integers, per client too.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from torch import Tensor

__all__ = ["CommunicationLedger", "extras_bytes", "planned_bytes", "tensor_bytes", "travelling_positions"]


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Σ numel × element_size of ``tensors``.

    >>> import torch
    >>> tensor_bytes([torch.zeros(3), torch.zeros(2, dtype=torch.float16), torch.zeros(1, dtype=torch.int64)])
    24
    """
    return sum(t.numel() * t.element_size() for t in tensors)


def extras_bytes(extras: Any) -> int:
    """The raw bytes of the tensors in a client's ``extras`` (nested in dicts, lists and tuples), leaving out the
    client halves' states (keys ``"client_state/..."``: kept by the client, not sent).

    >>> import torch
    >>> extras_bytes({"delta_control": [torch.zeros(4)], "client_state/FedDynClient": torch.zeros(9), "note": "x"})
    16
    """
    if isinstance(extras, Tensor):
        return extras.numel() * extras.element_size()
    if isinstance(extras, dict):
        return sum(extras_bytes(v) for k, v in extras.items() if not str(k).startswith("client_state/"))
    if isinstance(extras, (list, tuple)):
        return sum(extras_bytes(v) for v in extras)
    return 0


def _kept(algorithms: Sequence[Any], what: str) -> set[int]:
    return {int(i) for a in algorithms for i in getattr(a, what, lambda: [])()}


def travelling_positions(federated_positions: Sequence[int], algorithms: Sequence[Any]) -> list[int]:
    """The indices into Δ_i (aligned with the federated parameters, whose positions in ``module.parameters()`` are
    ``federated_positions``) of the parameters that travel: those no client half keeps local
    (:meth:`~lightning_fed.client.ClientAlgorithm.local_parameters`).

    >>> from lightning_fed.client.personal import LocalParts
    >>> class Head(LocalParts):
    ...     def local_parameters(self):
    ...         return [3]
    >>> travelling_positions([1, 2, 3], [Head()])
    [0, 1]
    """
    local = _kept(algorithms, "local_parameters")
    return [j for j, position in enumerate(federated_positions) if position not in local]


def travelling_buffers(num_buffers: int, algorithms: Sequence[Any]) -> list[int]:
    """The positions in ``module.buffers()`` of the buffers no client half keeps local
    (:meth:`~lightning_fed.client.ClientAlgorithm.local_buffers`).

    >>> travelling_buffers(3, [])
    [0, 1, 2]
    """
    local = _kept(algorithms, "local_buffers")
    return [i for i in range(num_buffers) if i not in local]


def planned_bytes(runner: Any) -> tuple[int, int]:
    """``(download, upload)``: the bytes each client of the round receives and sends, known at the round's start
    (after the client runner's ``start_round``), for a simulated clock that plans the round before its clients train.
    ``download`` is exactly what :meth:`CommunicationLedger.record` counts; ``upload`` is Δ_i as the run's compressor
    encodes it (:meth:`~lightning_fed.communication.base.Compressor.size`; raw without one) plus the buffers — the
    update's extras (SCAFFOLD's Δc_i), counted after the round, are not in it."""
    algorithms = runner.client_halves.algorithms
    travelling = travelling_positions(runner.federated_positions, algorithms)
    buffers = tensor_bytes(runner.global_buffers[i] for i in travelling_buffers(len(runner.global_buffers), algorithms))
    sent = [runner.global_params[j] for j in travelling]
    downlink = getattr(runner, "downlink", None)  # the broadcast encoded (DownlinkCompression), else raw
    model = tensor_bytes(sent) if downlink is None else downlink.size(sent)
    download = model + buffers + sum(int(a.download_bytes(sent)) for a in algorithms)
    compression = getattr(runner, "compression", None)
    if compression is None or not sent:
        return download, tensor_bytes(sent) + buffers
    dtype = sent[0].dtype
    for t in sent[1:]:
        dtype = torch.promote_types(dtype, t.dtype)  # the flat vector's dtype (torch.cat's)
    size = compression.compressor.size(sum(t.numel() for t in sent), torch.empty((), dtype=dtype).element_size())
    return download, int(size) + buffers


class CommunicationLedger:
    """The exact byte counts of a run (see the module doc), kept by the federated loop
    (``trainer.fit_loop.communication``) and saved in its checkpoint state.

    Attributes:
        bytes_down / bytes_up: The last round's sums over its clients.
        total_bytes_down / total_bytes_up: Sums since round 0.
        round_client_bytes_down / round_client_bytes_up: The last round's bytes per client,
            ``{client id: bytes}`` (the upload sizes a simulated clock turns into upload times).
        client_bytes_down / client_bytes_up: Per client since round 0.

    Example: two clients download 40 bytes each; one uploads a Δ_i of 10 float32 entries::

        >>> import torch
        >>> from lightning_fed import ClientUpdate
        >>> ledger = CommunicationLedger()
        >>> ledger.record_round([3, 5], 40, [ClientUpdate(3, [torch.zeros(10)], 1, 1, 0.0)], [0], [])
        >>> ledger.round_metrics()
        {'round_bytes_down': 80.0, 'round_bytes_up': 40.0, 'total_bytes_down': 80.0, 'total_bytes_up': 40.0}
        >>> ledger.round_client_bytes_up
        {3: 40}
    """

    def __init__(self) -> None:
        self.bytes_down = self.bytes_up = self.total_bytes_down = self.total_bytes_up = 0
        self.round_client_bytes_down: dict[int, int] = {}
        self.round_client_bytes_up: dict[int, int] = {}
        self.client_bytes_down: dict[int, int] = {}
        self.client_bytes_up: dict[int, int] = {}

    @staticmethod
    def upload_bytes(update: Any, travelling: Sequence[int], buffers: Sequence[int]) -> int:
        """Client ``update``'s upload: its Δ_i as encoded over ``travelling`` (indices into ``delta``), the buffers
        at ``buffers`` (positions in ``update.buffers``) and its extras' tensors."""
        encoded = getattr(update, "delta_bytes", None)
        delta = encoded if encoded is not None else tensor_bytes(update.delta[j] for j in travelling)
        sent_buffers = tensor_bytes(update.buffers[i] for i in buffers if i < len(update.buffers))
        return int(delta) + sent_buffers + extras_bytes(update.extras)

    def record_round(self, cohort: Iterable[int], download: int, updates: Sequence[Any], travelling: Sequence[int],
                     buffers: Sequence[int]) -> None:
        """Count a round: each client of ``cohort`` downloaded ``download`` bytes; each of ``updates`` uploaded
        :meth:`upload_bytes`."""
        self.round_client_bytes_down = {int(c): int(download) for c in cohort}
        self.round_client_bytes_up = {int(u.client_id): self.upload_bytes(u, travelling, buffers) for u in updates}
        self.bytes_down = sum(self.round_client_bytes_down.values())
        self.bytes_up = sum(self.round_client_bytes_up.values())
        self.total_bytes_down += self.bytes_down
        self.total_bytes_up += self.bytes_up
        for mine, now in ((self.client_bytes_down, self.round_client_bytes_down),
                          (self.client_bytes_up, self.round_client_bytes_up)):
            for c, b in now.items():
                mine[c] = mine.get(c, 0) + b

    def record(self, runner: Any, cohort: Iterable[int], updates: Sequence[Any]) -> None:
        """:meth:`record_round` from the client runner of the round (its x_t, buffers and client halves)."""
        download, _ = planned_bytes(runner)
        algorithms = runner.client_halves.algorithms
        travelling = travelling_positions(runner.federated_positions, algorithms)
        buffers = travelling_buffers(len(runner.global_buffers), algorithms)
        self.record_round(cohort, download, updates, travelling, buffers)

    def round_metrics(self) -> dict[str, float]:
        """The round's logged values (floats; see the module doc)."""
        return {"round_bytes_down": float(self.bytes_down), "round_bytes_up": float(self.bytes_up),
                "total_bytes_down": float(self.total_bytes_down), "total_bytes_up": float(self.total_bytes_up)}

    def log(self, trainer: Any, round_idx: int) -> None:
        """:meth:`round_metrics` to each of ``trainer.loggers`` at step ``round_idx`` (the round's step)."""
        metrics = self.round_metrics()
        for logger in getattr(trainer, "loggers", ()):
            logger.log_metrics(metrics, step=int(round_idx))

    def state_dict(self) -> dict[str, Any]:
        """The totals since round 0 (per client too), for a resume."""
        return {"total_bytes_down": self.total_bytes_down, "total_bytes_up": self.total_bytes_up,
                "client_bytes_down": dict(self.client_bytes_down), "client_bytes_up": dict(self.client_bytes_up)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total_bytes_down = int(state.get("total_bytes_down", 0))
        self.total_bytes_up = int(state.get("total_bytes_up", 0))
        self.client_bytes_down = {int(k): int(v) for k, v in state.get("client_bytes_down", {}).items()}
        self.client_bytes_up = {int(k): int(v) for k, v in state.get("client_bytes_up", {}).items()}
