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
from lightning_fed.server.aggregators.sign import MajorityVote

#: Server halves that live with their client half and ready-made name in a module of :mod:`lightning_fed.algorithms`
#: (name -> module), re-exported here on first use (PEP 562): those modules build on the server optimizer, which
#: imports this package, so it cannot import them while it loads.
ALGORITHM_STAGES = {"ScaffoldControl": "scaffold", "control_dtype": "scaffold", "MaxSecondMoment": "fedlamb",
                    "FedAWAREMinNorm": "fedaware"}


def __getattr__(name: str):
    """A name of :data:`ALGORITHM_STAGES`, from its method's module.

    Raises:
        AttributeError: any other name.
    """
    if name in ALGORITHM_STAGES:
        import importlib

        value = getattr(importlib.import_module(f"lightning_fed.algorithms.{ALGORITHM_STAGES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(ALGORITHM_STAGES))

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
    "MajorityVote",
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
