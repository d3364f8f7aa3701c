"""Compression of the client's update, with optional error feedback: a client half (issue #56 item 2).

``Compression(compressor, error_feedback=False, seed=0)`` is given like every client half,
``FederatedTrainer(client_algorithms=[Compression(QSGD(levels=15))])`` (CLI: ``trainer.client_algorithms``), so that
it composes with every server rule and every other client half, and swapping the server optimizer keeps it —
compression is what the client does to what it sends, not a property of the server's method. It is applied where
Δ_i is final on the client, in :meth:`~lightning_fed.client.runner.ClientRunner.build_update` (after every client
half's ``finish``): the update the server receives — and aggregates, clips, noises — holds the *decoded* Δ̂_i, and
``ClientUpdate.delta_bytes`` the size of its encoding, counted by
:class:`~lightning_fed.communication.bytes.CommunicationLedger`.

What is compressed: the flat vector v of Δ_i over the federated parameters that travel
(:func:`~lightning_fed.communication.bytes.travelling_positions`; a personal half's kept parts stay 0 and are not
sent), in ``module.parameters()`` order, on the CPU (Δ̂_i is put back on Δ_i's devices).

Error feedback (Karimireddy et al., ICML 2019, Alg. 2 EF-SGD l. 4-7; Stich et al., NeurIPS 2018, Alg. 1 Mem-SGD)
with ``error_feedback=True``: client i keeps the residual e_i (0 before its first round) and sends
C(p_i) for p_i = Δ_i + e_i, then keeps e_i ← p_i − C(p_i). The residual is the half's per-client state (``state_key``
``"Compression"``, one number per federated entry) in the run's
:class:`~lightning_fed.client.states.ClientStates` — in memory or on disk (``client_state_store="disk"``),
checkpointed, written when the update reaches the server (a client not sampled, or whose update is dropped, keeps its
residual).

Order with differential privacy: compression runs on the client, before the server's clipping and noise
(:mod:`lightning_fed.server.aggregators.dp`): each client's contribution is its clipped *decoded* update, so the clip
norm still bounds it and the accountant's (ε, δ) covers the released aggregate of the compressed updates as given.
Error feedback keeps that guarantee: e_i is a function of client i's own data, held for client i (never aggregated
or released: the simulation stores it in the per-client store as the client would keep it), and it reaches a
release only through client i's clipped contribution in a round that samples i — the per-round sensitivity stays
the clip norm and a round without client i does not depend on its residual, as Poisson-subsampled accounting
assumes. What is refused: signSGD's majority vote with a DP stage
(:class:`~lightning_fed.server.aggregators.sign.MajorityVote`).

Draws: a stochastic compressor draws from
:func:`~lightning_fed.communication.base.client_generator` ``(seed, round, client id)``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from lightning_fed.client.algorithm import ClientAlgorithm
from lightning_fed.communication.base import Compressor, client_generator
from lightning_fed.communication.bytes import travelling_positions

__all__ = ["Compression", "find_compression"]


class Compression(ClientAlgorithm):
    """The client compresses its update before sending it (see the module doc).

    Args:
        compressor: A :class:`~lightning_fed.communication.base.Compressor` (``Float16()``, ``BFloat16()``,
            ``QSGD(levels)``, ``UniformQuantization(bits)``, ``TopK(k | fraction)``, ``RandK(k | fraction)``,
            ``Sign()``).
        error_feedback: Keep each client's residual and add it to its next update (default ``False``).
        seed: The seed of stochastic compressors' draws (default 0; the draws of client i in round t are those of
            ``client_generator(seed, t, i)``).

    Raises:
        ArgumentError: ``compressor`` not a Compressor; ``error_feedback`` not a bool; ``seed`` not an integer ≥ 0.
        ValueError: at fit start, two ``Compression`` halves in one run.

    Example: the clients send top-1 % of their update with error feedback, under FedAvg::

        >>> from lightning_fed.communication import TopK
        >>> half = Compression(TopK(fraction=0.01), error_feedback=True)
        >>> half, half.state_dim(1000)
        (Compression(compressor=TopK(k=None, fraction=0.01), error_feedback=True, seed=0), 1000)
    """

    def __init__(self, compressor: Compressor, error_feedback: bool = False, seed: int = 0) -> None:
        from lightning_fed.checks import ArgumentError, check_int

        if not isinstance(compressor, Compressor):
            raise ArgumentError(
                "`compressor` must be a lightning_fed.communication Compressor (e.g. QSGD(levels=15), "
                f"TopK(fraction=0.01), BFloat16()), got {type(compressor).__name__}.")
        if not isinstance(error_feedback, bool):
            raise ArgumentError(f"`error_feedback` must be True or False, got {error_feedback!r}.")
        self.compressor, self.error_feedback, self.seed = compressor, error_feedback, check_int("seed", seed, 0)

    def state_dim(self, num_params: int) -> int:
        """The residual's size under error feedback (``num_params``), else 0."""
        return int(num_params) if self.error_feedback else 0

    def generator(self, round_idx: int, client_id: int) -> Optional[torch.Generator]:
        """The draws of client ``client_id`` in round ``round_idx`` (``None`` for a deterministic compressor)."""
        return client_generator(self.seed, round_idx, client_id) if self.compressor.stochastic else None

    def encode(self, delta: list[Tensor], travelling: list[int], client_id: int, round_idx: int,
               residual: Optional[Tensor] = None) -> tuple[list[Tensor], int, Optional[Tensor]]:
        """Client ``client_id``'s update in round ``round_idx`` as the server decodes it.

        Args:
            delta: Δ_i, one tensor per federated parameter.
            travelling: The indices of ``delta`` that are sent (the others must be 0: a personal half's kept parts).
            residual: e_i (flat, one number per entry of ``delta``; ``None``: zeros), read under error feedback.

        Returns:
            ``(decoded, nbytes, new_residual)``: Δ̂_i shaped, typed and placed like ``delta`` (0 outside
            ``travelling``), the encoding's size in bytes, and e_i ← p_i − Δ̂_i (flat, CPU; ``None`` without error
            feedback). A p_i with a NaN or an infinite entry is returned as ``delta`` itself (raw size, residual
            ``None``: unchanged), so that the loop's finiteness check drops it as it would without compression
            (the sign or top-k of a NaN vector would hide it).
        """
        flat = torch.cat([d.detach().reshape(-1).cpu() for d in delta])
        if self.error_feedback and residual is not None:
            flat = flat + residual.to(flat.dtype)
        sizes = [d.numel() for d in delta]
        if len(travelling) == len(delta):
            sent = flat
        else:
            starts = torch.tensor([0, *sizes]).cumsum(0).tolist()
            sent = torch.cat([flat[starts[j]:starts[j] + sizes[j]] for j in travelling])
        if not bool(torch.isfinite(sent.sum())) and not bool(torch.isfinite(sent).all()):  # sent as it is: the loop drops it as non-finite (a sign or a
            return delta, int(sent.numel() * sent.element_size()), None  # top-k would hide the NaN); e_i kept
        decoded, nbytes = self.compressor.compress(sent, self.generator(round_idx, client_id))
        if len(travelling) == len(delta):
            full = decoded
        else:
            parts = [torch.zeros(n, dtype=decoded.dtype) for n in sizes]
            offset = 0
            for j in travelling:
                parts[j] = decoded[offset:offset + sizes[j]]
                offset += sizes[j]
            full = torch.cat(parts)
        out, offset = [], 0
        for d, n in zip(delta, sizes):
            out.append(full[offset:offset + n].reshape(d.shape).to(device=d.device, dtype=d.dtype))
            offset += n
        return out, int(nbytes), (flat - full) if self.error_feedback else None

    def encode_update(self, runner: Any, client_id: int, delta: list[Tensor],
                      extras: dict[str, Any]) -> tuple[list[Tensor], dict[str, Any], int]:
        """The hook of :meth:`~lightning_fed.client.runner.ClientRunner.build_update`: :meth:`encode` with the
        runner's travelling parameters and the client's residual row; the new residual goes into ``extras`` as the
        half's client state (written when the update reaches the server)."""
        travelling = travelling_positions(runner.federated_positions, runner.client_halves.algorithms)
        residual = runner.client_halves.states.row(self.state_key, client_id) if self.error_feedback else None
        decoded, nbytes, new_residual = self.encode(delta, travelling, client_id, runner.round_idx, residual)
        if new_residual is not None:
            extras = {**extras, f"client_state/{self.state_key}": new_residual}
        return decoded, extras, nbytes


def find_compression(algorithms: list[Any]) -> Optional[Compression]:
    """The run's :class:`Compression` half among its client halves (``None``: updates are sent raw).

    Raises:
        ValueError: two of them (an update is encoded once; chain the compressors in one of your own instead).

    >>> from lightning_fed.communication import Float16
    >>> find_compression([Compression(Float16())]).compressor
    Float16()
    """
    found = [a for a in algorithms if isinstance(a, Compression)]
    if len(found) > 1:
        raise ValueError(f"The run has {len(found)} Compression client halves ({found}); an update is encoded once: "
                         "give one Compression in `client_algorithms`.")
    return found[0] if found else None
