"""User-level privacy accounting for DP-FedAvg, from Google's ``dp-accounting`` library (RDP or PLD accountant).

One round of DP-FedAvg (McMahan et al. 2018, *Learning Differentially Private Recurrent Language Models*, Alg. 1)
is a sampled Gaussian mechanism: a cohort is sampled, each client's update is clipped to L2 norm S, and Gaussian
noise of standard deviation σS is added to their sum. The rounds compose; ε for a given δ is the library's answer,
from one of two accountants (``accounting=``) — nothing is computed here beyond building the library's ``DpEvent``:

* ``"rdp"`` (default): ``dp_accounting.rdp.RdpAccountant`` (Rényi DP; Mironov 2017, Mironov et al. 2019, Wang et
  al. 2019), converted to (ε, δ) by the library;
* ``"pld"``: ``dp_accounting.pld.PLDAccountant`` (privacy loss distributions, Koskela et al. 2020, Doroshenko et
  al. 2022; the library's default discretisation 1e-4, pessimistic estimate), a numerically tight ε (never above
  the RDP one for the same event up to the discretisation).

Two cohort samplings, each with its own accounting:

* ``"fixed_size"`` (what :class:`~lightning_fed.datamodules.FederatedDataModule` draws: C distinct clients of N,
  uniformly, independently every round): ``SampledWithoutReplacementDpEvent(N, C, GaussianDpEvent(σ/2))`` under
  the **replace-one** neighbouring relation (the only one for which a fixed cohort size is defined; dp-accounting
  supports no other for this event), Wang, Balle & Kasiviswanathan 2019, Thm. 27. Replacing one client's data
  changes the clipped sum by up to 2S, so the noise multiplier relative to that sensitivity is σS/(2S) = σ/2.
  The PLD accountant has no sampling-without-replacement event; it composes the dominating pair of this mechanism,
  (γ·N(1, (σ/2)²) + (1 − γ)·N(0, (σ/2)²), N(0, (σ/2)²)) with γ = C/N (subsampling without replacement under
  replace-one: Balle, Barthe & Gaboardi 2018, Thm. 10; Zhu, Dong & Wang 2022), which is the remove direction of
  ``PoissonSampledDpEvent(C/N, GaussianDpEvent(σ/2))``: that event is composed under add-or-remove-one (the
  library takes the larger ε of both directions, so the answer is this pair's ε or above it).
* ``"poisson"`` (every client joins independently with probability q = C/N, the sampling of McMahan et al. 2018,
  Alg. 1): ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` under **add-or-remove-one** (sensitivity S). Only
  valid when the cohorts really are Poisson-sampled; it is *not* applied to fixed-size cohorts as an approximation.

The two ε are not comparable: for the same (σ, q) replace-one ε is the larger (about that of σ/2).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from lightning_fed.checks import check_non_negative, check_positive_int

SAMPLINGS = ("fixed_size", "poisson")
ACCOUNTINGS = ("rdp", "pld")


def _dp():
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise ImportError("Privacy accounting needs Google's `dp-accounting` package: pip install dp-accounting") from err
    return dp_accounting, rdp


class PrivacyAccountant:
    """ε(δ) of ``rounds`` rounds of the sampled Gaussian mechanism of DP-FedAvg, from dp-accounting's RDP or PLD
    accountant.

    Args:
        noise_multiplier: σ (≥ 0), the noise standard deviation in units of the clip norm S (σS is added to the sum
            of clipped updates). σ = 0 gives ε = ∞.
        num_clients: N, the population size (≥ 1).
        clients_per_round: C, the (expected) cohort size, 1 ≤ C ≤ N.
        sampling: ``"fixed_size"`` (default; C of N without replacement, replace-one adjacency) or ``"poisson"``
            (q = C/N, add-or-remove-one adjacency). See the module doc for the events.
        accounting: ``"rdp"`` (default) or ``"pld"``: which of dp-accounting's accountants turns the composed
            rounds into ε (see the module doc).

    Attributes:
        rounds: The number of rounds composed so far with the arguments above.
        history: The rounds of the same run composed *before* this accountant's (under an earlier server optimizer,
            e.g. before an allowed change of class on resume), as segments ``{"rounds", "private", "noise_multiplier",
            "num_clients", "clients_per_round", "sampling"}`` (:meth:`segment`); ``private=False`` marks rounds
            aggregated without DP, which make ε = ∞. :meth:`epsilon` composes them with :attr:`rounds`. Default ``[]``.

    Raises:
        ValueError: naming the argument, for σ < 0, N < 1, C outside [1, N], an unknown ``sampling`` or
            ``accounting``.

    Example: 10 rounds of 10 of 100 clients with σ = 1 at δ = 1e-5, equal to the library's own answer::

        >>> import dp_accounting
        >>> acc = PrivacyAccountant(1.0, num_clients=100, clients_per_round=10, sampling="poisson")
        >>> acc.step(10)
        >>> lib = dp_accounting.rdp.RdpAccountant()
        >>> _ = lib.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), 10)
        >>> acc.epsilon(1e-5) == float(lib.get_epsilon(1e-5))
        True
        >>> pld = PrivacyAccountant(1.0, num_clients=100, clients_per_round=10, sampling="poisson", accounting="pld")
        >>> lib = dp_accounting.pld.PLDAccountant()
        >>> _ = lib.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), 10)
        >>> pld.epsilon(1e-5, rounds=10) == float(lib.get_epsilon(1e-5)) < acc.epsilon(1e-5)
        True
    """

    def __init__(self, noise_multiplier: float, num_clients: int, clients_per_round: int,
                 sampling: str = "fixed_size", accounting: str = "rdp") -> None:
        check_non_negative("noise_multiplier", noise_multiplier)
        for name, value in (("num_clients", num_clients), ("clients_per_round", clients_per_round)):
            check_positive_int(name, value)
        if clients_per_round > num_clients:
            raise ValueError(f"`clients_per_round` ({clients_per_round}) must be <= `num_clients` ({num_clients}).")
        if sampling not in SAMPLINGS:
            raise ValueError(f"`sampling` must be one of {SAMPLINGS}, got {sampling!r}.")
        if accounting not in ACCOUNTINGS:
            raise ValueError(f"`accounting` must be one of {ACCOUNTINGS}, got {accounting!r}.")
        self.accounting = accounting
        self._cache: dict[tuple, float] = {}
        self.noise_multiplier = float(noise_multiplier)
        self.num_clients = int(num_clients)
        self.clients_per_round = int(clients_per_round)
        self.sampling = sampling
        self.rounds = 0
        self.history: list[dict[str, Any]] = []

    @property
    def sampling_probability(self) -> float:
        """q = C/N, the chance a given client is in a round's cohort."""
        return self.clients_per_round / self.num_clients

    def round_event(self) -> Any:
        """The ``dp_accounting.DpEvent`` of one round that the accountant composes (see the module doc; for
        fixed-size cohorts under ``accounting="pld"``, the Poisson event whose remove direction is the dominating
        pair)."""
        dp, _ = _dp()
        if self.sampling == "poisson":
            return dp.PoissonSampledDpEvent(self.sampling_probability, dp.GaussianDpEvent(self.noise_multiplier))
        if self.accounting == "pld":
            return dp.PoissonSampledDpEvent(self.sampling_probability, dp.GaussianDpEvent(self.noise_multiplier / 2.0))
        return dp.SampledWithoutReplacementDpEvent(
            self.num_clients, self.clients_per_round, dp.GaussianDpEvent(self.noise_multiplier / 2.0)
        )

    def step(self, rounds: int = 1) -> None:
        """Compose ``rounds`` more rounds."""
        self.rounds += int(rounds)

    def epsilon(self, delta: float, rounds: int | None = None) -> float:
        """ε for ``delta`` after the :attr:`history` and ``rounds`` rounds (default: the rounds composed so far);
        0 for no round, ∞ for σ = 0 or a non-private round in the history.

        Raises:
            ValueError: ``delta`` not in (0, 1).
        """
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
            raise ValueError(f"`delta` (target_delta) must be a number in (0, 1), got {delta!r}.")
        rounds = self.rounds if rounds is None else int(rounds)
        history = [s for s in self.history if int(s["rounds"]) > 0]
        if rounds == 0 and not history:
            return 0.0
        if (rounds > 0 and self.noise_multiplier == 0.0) or any(_unbounded(s) for s in history):
            return math.inf
        key = (rounds, float(delta), self.noise_multiplier, self.num_clients, self.clients_per_round, self.sampling,
               self.accounting, tuple((int(s["rounds"]), float(s["noise_multiplier"]), int(s["num_clients"]),
                                       int(s["clients_per_round"]), s["sampling"]) for s in history))
        if key in self._cache:
            return self._cache[key]
        dp, rdp = _dp()
        if self.accounting == "pld":
            accountant = dp.pld.PLDAccountant(neighboring_relation=dp.NeighboringRelation.ADD_OR_REMOVE_ONE)
        else:
            relation = dp.NeighboringRelation.REPLACE_ONE if self.sampling == "fixed_size" \
                else dp.NeighboringRelation.ADD_OR_REMOVE_ONE
            accountant = rdp.RdpAccountant(neighboring_relation=relation)
        for s in history:  # the earlier rounds, each with its own (σ, N, C), under this accountant's `accounting`
            accountant.compose(PrivacyAccountant(s["noise_multiplier"], s["num_clients"], s["clients_per_round"],
                                                 s["sampling"], self.accounting).round_event(), int(s["rounds"]))
        if rounds > 0:
            accountant.compose(self.round_event(), rounds)
        eps = float(accountant.get_epsilon(delta))
        if len(self._cache) > 64:
            self._cache.clear()
        self._cache[key] = eps
        return eps

    def segment(self) -> dict[str, Any]:
        """This accountant's rounds as one :attr:`history` segment (``private=True``), for the run record."""
        return {"private": True, **self.state_dict()}

    def set_history(self, history: list[dict[str, Any]]) -> None:
        """Set :attr:`history` (the run's rounds before this accountant's, see there).

        Raises:
            ValueError: a private segment accounted with another ``sampling`` (its rounds cannot be composed under
                this accountant's neighbouring relation).

        Example: 2 rounds with σ = 1 under an earlier server optimizer, then 1 with σ = 2; a non-private round
        makes ε infinite::

            >>> earlier = PrivacyAccountant(1.0, num_clients=100, clients_per_round=10)
            >>> earlier.step(2)
            >>> acc = PrivacyAccountant(2.0, num_clients=100, clients_per_round=10)
            >>> acc.set_history([earlier.segment()])
            >>> acc.step(1)
            >>> 0 < earlier.epsilon(1e-5) < acc.epsilon(1e-5) < PrivacyAccountant(1.0, 100, 10).epsilon(1e-5, 3)
            True
            >>> acc.set_history([earlier.segment(), {"private": False, "rounds": 1}])
            >>> acc.epsilon(1e-5), acc.nonprivate_rounds()
            (inf, 1)
        """
        history = [dict(s) for s in history if int(s["rounds"]) > 0]
        for s in history:
            if s.get("private", True) and s["sampling"] != self.sampling:
                raise ValueError(
                    f"The run's earlier {s['rounds']} round(s) were accounted with sampling={s['sampling']!r}, this "
                    f"run has sampling={self.sampling!r}: their neighbouring relations differ, so they cannot be "
                    "composed into one ε. Keep the sampling of the run."
                )
        self.history = history

    def nonprivate_rounds(self) -> int:
        """The rounds of :attr:`history` aggregated without DP (``private=False``); any makes ε = ∞."""
        return sum(int(s["rounds"]) for s in self.history if not s.get("private", True))

    def state_dict(self) -> dict[str, Any]:
        """The rounds composed and the parameters they were composed with."""
        return {"rounds": self.rounds, "noise_multiplier": self.noise_multiplier, "num_clients": self.num_clients,
                "clients_per_round": self.clients_per_round, "sampling": self.sampling, "accounting": self.accounting}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :attr:`rounds` (the rounds are the same mechanism under either ``accounting``: a checkpoint of one
        resumes under the other).

        Raises:
            ValueError: the checkpoint was composed with other (σ, N, C, sampling): its rounds would be misaccounted.
        """
        mine = self.state_dict()
        for key in ("noise_multiplier", "num_clients", "clients_per_round", "sampling"):
            if state[key] != mine[key]:
                raise ValueError(
                    f"The checkpoint's privacy accountant was composed with {key}={state[key]!r}, this run has "
                    f"{mine[key]!r}; resuming would misaccount the rounds already run."
                )
        self.rounds = int(state["rounds"])

    def __repr__(self) -> str:
        return (f"PrivacyAccountant(noise_multiplier={self.noise_multiplier}, num_clients={self.num_clients}, "
                f"clients_per_round={self.clients_per_round}, sampling={self.sampling!r}, "
                f"accounting={self.accounting!r}, rounds={self.rounds})")


def _unbounded(segment: dict[str, Any]) -> bool:
    """A history segment without a finite ε: rounds aggregated without DP, or with σ = 0."""
    return not segment.get("private", True) or float(segment["noise_multiplier"]) == 0.0
