"""The composable server side: aggregators (client updates → pseudo-gradient Δ_t) and, composed with them by a
:class:`~lightning_fed.callbacks.ServerOptimizer`, the server rule (Δ_t → x_{t+1}).

See :mod:`lightning_fed.server.aggregators` and ``docs/architecture.md``.
"""
