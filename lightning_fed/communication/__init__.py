"""Communication: what travels between the server and the clients, counted in bytes, and compressed (issue #56).

* :mod:`~lightning_fed.communication.bytes` — the byte count of every round (``round_bytes_*``, ``total_bytes_*``);
* :mod:`~lightning_fed.communication.compression` — :class:`Compression`, the client half that encodes Δ_i, with
  error feedback;
* :mod:`~lightning_fed.communication.downlink` — :class:`DownlinkCompression`, the broadcast x_t encoded, each client
  starting from the decoded x̂_t;
* the compressors, one per module: :mod:`~.casts` (:class:`Float16`, :class:`BFloat16`), :mod:`~.qsgd`
  (:class:`QSGD`), :mod:`~.uniform` (:class:`UniformQuantization`), :mod:`~.topk` (:class:`TopK`), :mod:`~.randk`
  (:class:`RandK`), :mod:`~.sign` (:class:`Sign`; the server's majority vote is
  :class:`~lightning_fed.server.aggregators.sign.MajorityVote`).
"""

from lightning_fed.communication.base import Compressor, bits_to_bytes, client_generator
from lightning_fed.communication.bytes import CommunicationLedger, tensor_bytes, travelling_positions
from lightning_fed.communication.casts import BFloat16, Float16
from lightning_fed.communication.compression import Compression, find_compression
from lightning_fed.communication.downlink import DownlinkCompression, find_downlink
from lightning_fed.communication.qsgd import QSGD
from lightning_fed.communication.randk import RandK
from lightning_fed.communication.sign import Sign
from lightning_fed.communication.topk import TopK
from lightning_fed.communication.uniform import UniformQuantization

__all__ = ["BFloat16", "CommunicationLedger", "Compression", "Compressor", "DownlinkCompression", "Float16", "QSGD",
           "RandK", "Sign", "TopK", "UniformQuantization", "bits_to_bytes", "client_generator", "find_compression",
           "find_downlink", "tensor_bytes", "travelling_positions"]
