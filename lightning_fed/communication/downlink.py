"""Downlink compression: the server broadcasts the global model encoded, and each client starts from what it decodes
(issue #56 item 2, last clause).

``DownlinkCompression(compressor)`` is given like every client half, ``FederatedTrainer(client_algorithms=[
DownlinkCompression(BFloat16())])`` (CLI: ``trainer.client_algorithms``), alone or with the uplink's
:class:`~lightning_fed.communication.compression.Compression`. In round t the server encodes x_t — the flat vector
of the federated parameters, in ``module.parameters()`` order — once, and every client of the cohort receives the
same encoding and decodes x̂_t = D(C(x_t)):

* the client loads x̂_t and trains from it; its client halves see x̂_t as ``context.global_params`` (FedProx's
  anchor, for one); it sends Δ_i = x_i − x̂_t (what a client that holds only x̂_t can compute);
* the server keeps the exact x_t and steps from it, x_{t+1} = ServerOpt(x_t, Δ_t) with Δ_t aggregated from the
  Δ_i: the broadcast's error does not accumulate in the global model; the model the run saves, validates and
  returns is x_t. (This is the simplest exact form, stated here rather than taken from one paper: no state beyond
  x_t, the same encoding for every client, the server's rule unchanged.)
* the ledger (:class:`~lightning_fed.communication.bytes.CommunicationLedger`) and the simulated clock count each
  client's download as the encoding's size (:meth:`~lightning_fed.communication.base.Compressor.size`) plus the
  buffers, sent raw.

The compressors: deterministic ones meant for a model, :class:`~lightning_fed.communication.casts.Float16`,
:class:`~lightning_fed.communication.casts.BFloat16` and
:class:`~lightning_fed.communication.uniform.UniformQuantization` (min-max over the whole vector); a sparsifier or
a sign would zero most of the model, and a stochastic one would need a draw shared by the cohort — refused.

Refused at fit start (``ValueError`` naming the half): client halves whose correctness rests on the client holding
the exact x_t or on a per-client quantity tied to it — those that keep per-client state (SCAFFOLD's c_i, FedDyn's
g_k, Ditto's personal model, ...; :meth:`~lightning_fed.client.ClientAlgorithm.state_dim` > 0), that receive more
than the model (:meth:`~lightning_fed.client.ClientAlgorithm.download_bytes` > 0: SCAFFOLD's c) or that keep
parts of the model local (:class:`~lightning_fed.client.personal.LocalParts`: FedPer, FedBN, ...). Their papers
assume the exact global model; with a lossy broadcast their state would drift from what they define.
:class:`~lightning_fed.communication.compression.Compression`'s error-feedback residual is about Δ_i, not x_t, and
composes. Asynchronous training refuses it (a client there starts from its exact model version).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.communication.base import Compressor

__all__ = ["DownlinkCompression", "find_downlink"]

#: The compressors a broadcast may use (their class names).
DOWNLINK_COMPRESSORS = ("Float16", "BFloat16", "UniformQuantization")


class DownlinkCompression(ClientAlgorithm):
    """The server broadcasts x_t encoded by ``compressor``; each client starts from the decoded x̂_t (see the
    module doc).

    Args:
        compressor: ``Float16()``, ``BFloat16()`` or ``UniformQuantization(bits)``.

    Raises:
        ArgumentError: ``compressor`` not one of these.
        ValueError: at fit start, with a client half that needs the exact x_t (see the module doc), or two
            ``DownlinkCompression`` halves.

    Example: x̂_t of a model in bfloat16, 2 bytes an entry::

        >>> from lightning_fed.communication import BFloat16
        >>> half = DownlinkCompression(BFloat16())
        >>> decoded, nbytes = half.broadcast([torch.tensor([1.0, 1.0 + 2**-9]), torch.tensor([[3.0]])])
        >>> decoded, nbytes
        ([tensor([1., 1.]), tensor([[3.]])], 6)
    """

    def __init__(self, compressor: Compressor) -> None:
        from lightning_fed.checks import ArgumentError

        if not isinstance(compressor, Compressor) or type(compressor).__name__ not in DOWNLINK_COMPRESSORS:
            raise ArgumentError(
                "`compressor` of DownlinkCompression must be one of Float16(), BFloat16(), "
                f"UniformQuantization(bits) (deterministic, meant for a model), got {compressor!r}.")
        self.compressor = compressor

    def size(self, params: Sequence[Tensor]) -> int:
        """The encoding's size in bytes of the flat vector of ``params`` (x_t's travelling parameters)."""
        if not params:
            return 0
        dtype = params[0].dtype
        for t in params[1:]:
            dtype = torch.promote_types(dtype, t.dtype)  # the flat vector's dtype (torch.cat's)
        return int(self.compressor.size(sum(t.numel() for t in params), torch.empty((), dtype=dtype).element_size()))

    def broadcast(self, params: Sequence[Tensor]) -> tuple[list[Tensor], int]:
        """``(decoded, nbytes)``: x̂_t shaped, typed and placed like ``params`` (x_t, one tensor per federated
        parameter) and the encoding's size in bytes."""
        if not params:
            return [], 0
        flat = torch.cat([p.detach().reshape(-1).cpu() for p in params])
        decoded, nbytes = self.compressor.compress(flat)
        out, offset = [], 0
        for p in params:
            out.append(decoded[offset:offset + p.numel()].reshape(p.shape).to(device=p.device, dtype=p.dtype))
            offset += p.numel()
        return out, int(nbytes)


def find_downlink(algorithms: Sequence[Any], num_params: int) -> Optional[DownlinkCompression]:
    """The run's :class:`DownlinkCompression` half among its client halves (``None``: x_t is broadcast raw), after
    checking that the others compose with it (see the module doc); ``num_params``: the federated entries.

    Raises:
        ValueError: two of them, or a half that needs the exact x_t (naming it and why).

    >>> from lightning_fed.communication import Float16
    >>> find_downlink([DownlinkCompression(Float16())], 10).compressor
    Float16()
    """
    found = [a for a in algorithms if isinstance(a, DownlinkCompression)]
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(f"The run has {len(found)} DownlinkCompression client halves ({found}); the broadcast is "
                         "encoded once: give one.")
    from lightning_fed.communication.compression import Compression

    for half in algorithms:
        if isinstance(half, (DownlinkCompression, Compression)):
            continue
        why = ("keeps parts of the model on the client" if list(half.local_parameters()) or list(half.local_buffers())
               else "keeps per-client state" if int(half.state_dim(num_params)) > 0
               else "receives more than the model" if int(half.download_bytes([torch.zeros(1)])) > 0 else None)
        if why is not None:
            raise ValueError(
                f"DownlinkCompression cannot be combined with the client half {type(half).__name__}: it {why}, "
                "defined against the exact global model x_t, while the clients receive the decoded x̂_t. Drop "
                "DownlinkCompression (or that method) from `client_algorithms` / the server optimizer.")
    return found[0]
