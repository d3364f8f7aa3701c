"""Simulated time: the device model, the round deadline and the clock, a part of
:class:`~lightning_fed.datamodules.FederatedDataModule` (issue #53; the planner is :mod:`lightning_fed.clock`)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Optional

import numpy as np

from lightning_fed.asynchronous.simulation import AsyncConfig
from lightning_fed.checks import ArgumentError, check_choice
from lightning_fed.clock import DEADLINE_POLICIES, MISSED_DEADLINE, OFFLINE, RoundPlan, SimulatedClock, \
    check_round_deadline, plan_round
from lightning_fed.datamodules.cohorts import CohortSelection
from lightning_fed.datamodules.devices.base import DeviceModel

__all__ = ["SimulatedTime"]


class SimulatedTime:
    """Each round's simulated time on the clients' devices, and what a round deadline does to the cohort.

    Off (``device_model=None``, the default) it does nothing: no planning, no clock metrics, no settings in the run
    record or HParams, no state in checkpoints — runs are bit for bit as without it.

    On, at each round's start (the loop's one call, :meth:`start_round`), it plans the round
    (:func:`~lightning_fed.clock.plan_round`) for the clients the cohort sampler left — every candidate that did
    not drop out when ``over_selection`` > 0 (the first ``clients_per_round`` to finish are kept, instead of the
    first in sample order), else the cohort — from the clients' local steps (the samples of each of their
    ``client_batches``), the bytes that travel and the devices (``device_model.profiles``). Only the kept clients
    train; under ``deadline_policy="partial"`` a client runs the first k_i of its batches (:meth:`step_limit`, read
    by ``client_batches``: its update is the one after k_i steps, and ``ClientUpdate.num_steps`` = k_i, what
    FedNova normalises by). Clients that missed the deadline or went offline count as unavailable
    (``round_clients_unavailable``). A round nobody could be asked in (every client drawn offline at selection) waits,
    without a deadline, until the first of them comes online (``DeviceModel.next_online``; see
    :mod:`lightning_fed.clock` for empty rounds). At the round's end (:meth:`end_round`) the clock advances by the
    round's time and the round metrics :data:`~lightning_fed.clock.CLOCK_METRICS` are returned (with
    ``clock/offline_at_selection``, the cohort sampler's count of clients drawn offline).

    Args:
        device_model: A :class:`~lightning_fed.datamodules.devices.DeviceModel`, or ``None`` (default: off).
        round_deadline: The deadline D of every round, simulated seconds after its start, ``> 0``, or ``None``
            (default: none). Needs a ``device_model``.
        deadline_policy: ``"drop"`` (default: a client finishing after D is left out; it does not train) or
            ``"partial"`` (it runs the steps that fit before D). ``"partial"`` needs a ``round_deadline``.
        asynchronous: An :class:`~lightning_fed.asynchronous.AsyncConfig` (issue #54): the loop trains
            asynchronously on this clock, one epoch per server step (:mod:`lightning_fed.asynchronous.loop_mode`),
            or ``None`` (default: rounds). Needs a ``device_model`` and no ``round_deadline``.

    Raises:
        ArgumentError: ``device_model`` not a DeviceModel; a deadline ``<= 0``; an unknown ``deadline_policy``; a
            ``round_deadline`` or ``deadline_policy="partial"`` without a ``device_model``; ``"partial"`` without a
            ``round_deadline``; ``asynchronous`` not an AsyncConfig, without a ``device_model`` or with a
            ``round_deadline``.

    Example::

        >>> from lightning_fed.datamodules.devices import ParametricDeviceModel
        >>> part = SimulatedTime(ParametricDeviceModel(seconds_per_sample=0.01), round_deadline=60.0)
        >>> part.settings()  # doctest: +NORMALIZE_WHITESPACE
        {'device_model': 'ParametricDeviceModel', 'device_model/seconds_per_sample': 0.01,
         'device_model/download_bytes_per_s': 1250000.0, 'device_model/upload_bytes_per_s': 125000.0,
         'device_model/latency_s': 0.0, 'device_model/compute_sigma': 0.0, 'device_model/network_sigma': 0.0,
         'device_model/slow_fraction': 0.0, 'device_model/slowdown': 1.0, 'device_model/seed': 0,
         'round_deadline': 60.0, 'deadline_policy': 'drop'}
        >>> SimulatedTime(round_deadline=60.0)
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `round_deadline` (60.0) needs a `device_model`: without one there is no simulated time to set a deadline in.
    """

    #: The settings, each an attribute the data module forwards.
    setting_names: ClassVar[tuple[str, ...]] = ("device_model", "round_deadline", "deadline_policy", "asynchronous")

    def __init__(self, device_model: Optional[DeviceModel] = None, round_deadline: Optional[float] = None,
                 deadline_policy: str = "drop", asynchronous: Optional[AsyncConfig] = None) -> None:
        if device_model is not None and not isinstance(device_model, DeviceModel):
            raise ArgumentError(f"`device_model` must be a DeviceModel (e.g. ParametricDeviceModel) or None, got "
                                f"{type(device_model).__name__}.")
        deadline = check_round_deadline(round_deadline)
        policy = check_choice("deadline_policy", deadline_policy, DEADLINE_POLICIES)
        if device_model is None and deadline is not None:
            raise ArgumentError(f"`round_deadline` ({deadline!r}) needs a `device_model`: without one there is no "
                                "simulated time to set a deadline in.")
        if policy == "partial" and deadline is None:
            raise ArgumentError("`deadline_policy='partial'` needs a `round_deadline` (and a `device_model`): it says "
                                "how many steps fit before the deadline.")
        check_asynchronous(asynchronous, device_model, deadline)
        self.device_model = device_model
        self.round_deadline = deadline
        self.deadline_policy = policy
        self.asynchronous = asynchronous
        #: The :class:`~lightning_fed.asynchronous.AsyncSimulation` of the fit under ``asynchronous`` (built at fit
        #: start by the loop; its state is in :meth:`state_dict`), else ``None``.
        self.async_simulation: Any = None
        self._async_state: Optional[dict[str, Any]] = None  # loaded before the fit built the simulation
        #: The run's simulated time (saved in checkpoints through the data module's ``state_dict``).
        self.clock = SimulatedClock()
        self._limits: tuple[Optional[int], dict[int, int]] = (None, {})  # (round, {client: k_i < K_i})

    @property
    def active(self) -> bool:
        """Whether a device model is set."""
        return self.device_model is not None

    # ------------------------------------------------------------------ settings
    def settings(self) -> dict[str, Any]:
        """The settings for TensorBoard's HParams, flat: ``device_model`` (class name), ``device_model/<arg>``,
        ``round_deadline``, ``deadline_policy``; ``{}`` when off."""
        if not self.active:
            return {}
        model = self.device_model
        out: dict[str, Any] = {"device_model": type(model).__name__}
        out.update({f"device_model/{k}": v for k, v in model.settings().items()})
        out.update(async_settings(self.asynchronous, "/"))
        return {**out, "round_deadline": self.round_deadline, "deadline_policy": self.deadline_policy}

    def run_config(self) -> dict[str, Any]:
        """The settings for the checkpoints' run record (compared on resume): ``device_model`` (class path),
        ``device_model.<name>`` (its ``run_settings()``: the constructor arguments, and a trace's content hash),
        ``round_deadline``, ``deadline_policy``; ``{}`` when off."""
        if not self.active:
            return {}
        model = self.device_model
        out: dict[str, Any] = {"device_model": f"{type(model).__module__}.{type(model).__qualname__}"}
        out.update({f"device_model.{k}": v for k, v in model.run_settings().items()})
        out.update(async_settings(self.asynchronous, "."))
        return {**out, "round_deadline": self.round_deadline, "deadline_policy": self.deadline_policy}

    def check_data_module(self, datamodule: Any) -> None:
        """At fit start: ``deadline_policy="partial"`` cuts a client's work through the data module's own
        ``client_batches``, so a data module overriding ``client_batches`` or ``client_dataloader`` is refused
        (its clients would run all their steps while the clock counts k_i).

        Raises:
            ValueError: naming the overridden method and ``deadline_policy``.
        """
        if self.deadline_policy != "partial":
            return
        from lightning_fed.datamodules.federated import FederatedDataModule

        kind = type(datamodule)
        for name in ("client_batches", "client_dataloader"):
            if getattr(kind, name) is not getattr(FederatedDataModule, name):
                raise ValueError(
                    f"deadline_policy='partial' cuts each client's local work to the steps that fit before the "
                    f"deadline through FederatedDataModule.client_batches, but {kind.__name__} overrides `{name}`; "
                    "use deadline_policy='drop' or keep the data module's own batches.")

    # ------------------------------------------------------------------ a round
    def start_round(self, datamodule: Any, selection: CohortSelection, round_idx: int, download_bytes: Any,
                    upload_bytes: Any) -> tuple[CohortSelection, RoundPlan]:
        """Plan round ``round_idx`` (see the class doc): the selection of the clients that train, and the plan.

        Args:
            datamodule: The data module (its cohort sampler and ``client_batches``).
            selection: The cohort sampler's selection of the round.
            round_idx: The round.
            download_bytes: Bytes each client downloads (one number or ``[n]``).
            upload_bytes: Bytes each client uploads (one number or ``[n]``, for the planned clients in order).
        """
        cohorts = datamodule.cohorts
        over = cohorts.over_selection > 0 and cohorts.cohort_sampling == "fixed_size"
        ids = cohorts.available(selection.candidates, round_idx) if over else selection.cohort
        self._limits = (None, {})  # the clients' whole local work while it is read
        steps = [np.fromiter((len(b) for b in datamodule.client_batches(int(c), round_idx)), dtype=np.int64)
                 for c in ids.tolist()]
        model, now = self.device_model, self.clock.elapsed_seconds
        online_until = model.online_until(ids, now) if model.has_availability else None
        plan = plan_round(now, ids, steps, download_bytes, upload_bytes, model.profiles(ids), self.round_deadline,
                          self.deadline_policy, cohorts.clients_per_round if over else None, online_until,
                          self._idle_until(selection, ids), selection.offline)
        cut = {int(c): int(k) for c, k, s in zip(ids.tolist(), plan.steps.tolist(), steps) if 0 < k < len(s)}
        self._limits = (int(round_idx), cut)
        lost = int(np.isin(plan.status, (MISSED_DEADLINE, OFFLINE)).sum())
        return dataclasses.replace(selection, cohort=plan.kept, unavailable=selection.unavailable + lost), plan

    def _idle_until(self, selection: CohortSelection, ids: np.ndarray) -> Optional[float]:
        """A round nobody could be asked in, without a deadline: when the first client drawn offline comes online
        (``None``, 0 s: someone is asked, there is a deadline, nobody was drawn offline, or none of them is ever
        online again — nobody to wait for)."""
        if len(ids) or len(selection.candidates) or self.round_deadline is not None or not len(selection.offline_ids):
            return None
        back = float(np.min(self.device_model.next_online(selection.offline_ids, self.clock.elapsed_seconds)))
        return back if np.isfinite(back) else None

    def forecast(self, datamodule: Any, rounds: int, payload: Any) -> list[dict[int, int]]:
        """The first ``rounds`` rounds planned from a fresh clock, without changing this part's state: per round
        ``{client id: local steps}`` of the clients that train (what ``FederatedTrainer.estimated_stepping_batches``
        counts). ``payload``: the bytes each client downloads and uploads.

        Raises:
            ValueError: under ``asynchronous`` (there are no rounds to plan: which clients train in a server step
                depends on the staleness drops and failures of the run).
        """
        if self.asynchronous is not None:
            raise ValueError("The local steps of an asynchronous run cannot be forecast round by round (e.g. for "
                             "Trainer.estimated_stepping_batches): there are no rounds; use a scheduler that does "
                             "not need the total number of steps.")
        clock, limits = self.clock, self._limits
        self.clock, out = SimulatedClock(), []
        try:
            for t in range(int(rounds)):
                _, plan = self.start_round(datamodule, datamodule.select_cohort(t), t, payload, payload)
                out.append({int(c): int(k) for c, k in zip(plan.kept.tolist(), plan.steps[plan.status == 0].tolist())})
                self.end_round(plan)
        finally:
            self.clock, self._limits = clock, limits
        return out

    def step_limit(self, client_id: int, round_idx: int) -> Optional[int]:
        """The local steps client ``client_id`` runs in round ``round_idx`` when the deadline cut its work
        (``"partial"``), else ``None`` (its whole local work)."""
        planned, cut = self._limits
        return cut.get(int(client_id)) if planned == int(round_idx) else None

    def end_round(self, plan: RoundPlan) -> dict[str, float]:
        """Advance the clock by the round's time; the round's :data:`~lightning_fed.clock.CLOCK_METRICS`."""
        self.clock.advance(plan.round_seconds)
        return plan.metrics()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """``{"clock": ...}`` when on, else ``{}``; under ``asynchronous`` also ``"asynchronous"``, the simulation's
        state (its buffer, clients in flight, model versions and event clock)."""
        if not self.active:
            return {}
        out: dict[str, Any] = {"clock": self.clock.state_dict()}
        if self.async_simulation is not None:
            out["asynchronous"] = self.async_simulation.state_dict()
        elif self._async_state is not None:
            out["asynchronous"] = self._async_state
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the clock of a resumed run)."""
        if "clock" in state:
            self.clock.load_state_dict(state["clock"])
        if "asynchronous" in state:  # the loop's fit start builds the simulation and loads it (async_state)
            self._async_state = state["asynchronous"]
            if self.async_simulation is not None:
                self.async_simulation.load_state_dict(state["asynchronous"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(device_model={self.device_model!r}, round_deadline={self.round_deadline!r}, "
                f"deadline_policy={self.deadline_policy!r})")


def check_asynchronous(config: Any, device_model: Any, round_deadline: Optional[float]) -> None:
    """``asynchronous`` is ``None`` or an AsyncConfig with a device model and no round deadline.

    Raises:
        ArgumentError: naming ``asynchronous`` and why.
    """
    if config is None:
        return
    if not isinstance(config, AsyncConfig):
        raise ArgumentError(f"`asynchronous` must be an AsyncConfig or None, got {type(config).__name__}.")
    if device_model is None:
        raise ArgumentError("`asynchronous` needs a `device_model`: clients report at their simulated device times.")
    if round_deadline is not None:
        raise ArgumentError(f"`asynchronous` has no rounds to set a deadline on: drop `round_deadline` "
                            f"({round_deadline!r}; `max_staleness` drops late updates instead).")


def async_settings(config: Optional[AsyncConfig], sep: str) -> dict[str, Any]:
    """``asynchronous`` (``True``) and ``asynchronous<sep><field>`` (staleness as ``staleness<sep>name|a|b``);
    ``{}`` for ``None``."""
    if config is None:
        return {}
    out: dict[str, Any] = {"asynchronous": True}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name == "staleness":
            out.update({f"asynchronous{sep}staleness{sep}{k}": v for k, v in value.settings().items()})
        else:
            out[f"asynchronous{sep}{field.name}"] = value
    return out
