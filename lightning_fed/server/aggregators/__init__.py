"""Aggregators: stages that turn a round's client updates into the pseudo-gradient Δ_t, chained as in optax.

A chain is ``client transforms* → one reducer → delta transforms*`` (e.g. clip → median → noise), each stage a
small update over one typed state (:class:`Stage`). ``ServerOptimizer(aggregators=[...])`` runs the chain in place
of its default sample-weighted mean.
"""

from lightning_fed.server.aggregators.base import (
    ClientDeltas,
    EmptyState,
    RoundInfo,
    RoundReport,
    Stage,
    WeightedMean,
    chain_states,
    check_chain,
    run_chain,
)
from lightning_fed.server.aggregators.dp import (
    AdaptiveClip,
    ClipUpdates,
    DPMean,
    GaussianNoise,
    update_noise_multiplier,
)
from lightning_fed.server.aggregators.normalized import NormalizedDirections, normalized_direction
from lightning_fed.server.aggregators.robust import CoordinateMedian, Krum, NormBoundedMean, TrimmedMean
# SCAFFOLD's server half lives with its client half (lightning_fed.algorithms.scaffold); re-exported here
from lightning_fed.algorithms.scaffold import ScaffoldControl, control_dtype  # noqa: E402
from lightning_fed.algorithms.fedlamb import MaxSecondMoment  # noqa: E402  (Fed-LAMB's server half)
from lightning_fed.algorithms.fedaware import FedAWAREMinNorm  # noqa: E402  (FedAWARE's server half)

__all__ = [
    "AdaptiveClip",
    "ClipUpdates",
    "DPMean",
    "GaussianNoise",
    "update_noise_multiplier",
    "ClientDeltas",
    "CoordinateMedian",
    "EmptyState",
    "FedAWAREMinNorm",
    "Krum",
    "MaxSecondMoment",
    "NormBoundedMean",
    "NormalizedDirections",
    "normalized_direction",
    "RoundInfo",
    "RoundReport",
    "ScaffoldControl",
    "control_dtype",
    "Stage",
    "TrimmedMean",
    "WeightedMean",
    "chain_states",
    "check_chain",
    "run_chain",
]
