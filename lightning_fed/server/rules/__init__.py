"""Server rules: x_{t+1} = ServerOpt(x_t, Δ_t) (Reddi et al. 2021, Alg. 1, l. 11), each a pure update over one typed
state (:class:`Rule`), composed with an aggregator chain by :class:`~lightning_fed.callbacks.ServerOptimizer`.

One module per family: :mod:`~.sgd` (FedAvg), :mod:`~.momentum` (heavy ball, Nesterov), :mod:`~.adaptive`
(Adagrad / Adam / Yogi, Reddi et al. Alg. 2 and the Flower / TFF conventions), :mod:`~.lamb` (LAMB),
:mod:`~.stepsize` (Malitsky & Mishchenko's adaptive stepsize).
"""

from lightning_fed.server.rules.adaptive import Adagrad, Adam, AdaptiveRule, AdaptiveState, Yogi
from lightning_fed.server.rules.base import NoState, Rule
from lightning_fed.server.rules.lamb import LAMB, LAMBState
from lightning_fed.server.rules.momentum import Momentum, MomentumState
from lightning_fed.server.rules.sgd import SGD
from lightning_fed.server.rules.stepsize import AdaptiveStepSize, StepSizeState

__all__ = [
    "LAMB",
    "SGD",
    "Adagrad",
    "Adam",
    "AdaptiveRule",
    "AdaptiveState",
    "AdaptiveStepSize",
    "LAMBState",
    "Momentum",
    "MomentumState",
    "NoState",
    "Rule",
    "StepSizeState",
    "Yogi",
]
