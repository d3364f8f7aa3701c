"""Client failures (issue #52: moved out of ``client/runner.py``): the failure policy ``on_client_failure`` and its
checks, the :class:`ClientFailure` record of a dropped client, each sampled client's history (:class:`ClientRecord`)
and the decisions that stop a run for failing clients — a round whose every client raised alike
(:meth:`ClientFailureHandling.stop_if_all_failed_alike`), a client failing in each of its last n sampled rounds
(:meth:`ClientFailureHandling.stop_if_failed_repeatedly`).

:class:`ClientFailureHandling` is a part of :class:`~lightning_fed.client.runner.ClientRunner` (its base class); every
name here stays importable from ``lightning_fed.client.runner``.
"""

from __future__ import annotations

import traceback
from typing import Any, Optional

import torch  # noqa: F401  (the examples)
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_fed.checks import check_consecutive_limit
from lightning_fed.checkpoint import MidRoundCheckpointError
from lightning_fed.server.client_state import ClientStateStoreError, MissingClientStateError

#: ``on_client_failure`` values: ``"skip"`` drops a failing client from its round, but stops the run when every client
#: of a round raised the same exception type at the same place (:meth:`ClientRunner.stop_if_all_failed_alike`);
#: ``"raise"`` stops at the first failing client; ``"skip_all"`` always drops (fault-injection studies).
FAILURE_POLICIES = ("skip", "raise", "skip_all")

#: ``max_consecutive_client_failures`` under ``on_client_failure="skip"`` when it is not given.
DEFAULT_MAX_CONSECUTIVE_CLIENT_FAILURES = 3


def check_max_consecutive_client_failures(value: Any, on_client_failure: str = "skip") -> Optional[int]:
    """Validate ``max_consecutive_client_failures``: under ``on_client_failure="skip"``, a client that fails in each
    of its last n sampled rounds (raises, times out or sends a non-finite update; an update-norm outlier does not
    count) stops the run, naming the client and its error — its data or its code fails every time, and the run would
    otherwise "succeed" without it. ``None`` (default) means :data:`DEFAULT_MAX_CONSECUTIVE_CLIENT_FAILURES` (3)
    under ``"skip"``. ``"skip_all"`` keeps dropping such a client (fault-injection studies) and ``"raise"`` stops at
    the first failure, so neither takes a value (returns ``None``).

    Raises:
        ArgumentError (a ValueError): anything but ``None`` or an integer >= 1 (booleans included), or a value
            with another ``on_client_failure`` than ``"skip"``, naming both arguments and the allowed values.

    Example::

        >>> check_max_consecutive_client_failures(None), check_max_consecutive_client_failures(5)
        (3, 5)
        >>> check_max_consecutive_client_failures(None, "skip_all") is None
        True
        >>> check_max_consecutive_client_failures(2, "skip_all")
        Traceback (most recent call last):
        ...
        lightning_fed.checks.ArgumentError: `max_consecutive_client_failures`=2 applies only with on_client_failure='skip' (of ('skip', 'raise', 'skip_all')): 'skip_all' never stops for a failing client, 'raise' stops at its first failure. Leave it None.
    """
    return check_consecutive_limit(
        "max_consecutive_client_failures", value, default=DEFAULT_MAX_CONSECUTIVE_CLIENT_FAILURES,
        policy_name="on_client_failure", policy=on_client_failure, active="skip", policies=FAILURE_POLICIES,
        why="'skip_all' never stops for a failing client, 'raise' stops at its first failure. Leave it None.",
    )


def error_notes(error: BaseException) -> list[str]:
    """The notes on ``error`` (``BaseException.add_note``) other than the client runner's hint: what the data source
    knows about where the error came from, e.g. ``"Image column 'image', row 12."``.

    Example::

        >>> error = ValueError("bad image")
        >>> error.add_note("Image column 'image', row 12.")
        >>> error.add_note("Hint: a hint.")
        >>> error_notes(error), error_notes(KeyError("x"))
        (["Image column 'image', row 12."], [])
    """
    return [str(n) for n in getattr(error, "__notes__", ()) if not str(n).startswith("Hint: ")]


class FrozenParameterChangedError(RuntimeError):
    """A client changed a parameter that is not federated (frozen: ``requires_grad=False`` or in no client optimizer
    at fit start): its change would be neither averaged nor undone, so the run stops (never a silent drift of a
    shared tensor). Not a client failure: ``on_client_failure`` does not drop it.

    Example: raised by :meth:`ClientRunner.check_frozen` when a frozen tensor's version counter moved::

        >>> frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
        >>> version = frozen._version
        >>> with torch.no_grad():
        ...     _ = frozen.add_(1.0)  # what a client must not do
        >>> frozen._version != version, issubclass(FrozenParameterChangedError, RuntimeError)
        (True, True)
    """


def failure_origin(error: BaseException) -> str:
    """Where ``error`` was raised: its type and the innermost frame of its traceback, ``"<module>.<Type> at
    <file>:<line>"`` (just the type when it carries no traceback). Two clients whose local work raised with the same
    origin failed the same way, whatever their messages (e.g. a ``KeyError`` naming different keys).

    Example::

        >>> try:
        ...     {}["x"]
        ... except KeyError as error:
        ...     origin = failure_origin(error)
        >>> origin.startswith("builtins.KeyError at "), failure_origin(ValueError("no traceback"))
        (True, 'builtins.ValueError')
    """
    kind = f"{type(error).__module__}.{type(error).__qualname__}"
    frames = traceback.extract_tb(error.__traceback__)
    return f"{kind} at {frames[-1].filename}:{frames[-1].lineno}" if frames else kind


class ClientFailure(tuple):
    """``(client id, reason)`` of a client dropped from a round — a plain pair to unpack and compare — that also
    says, for a client whose local work raised, where (:attr:`origin`, :func:`failure_origin`) and how
    (:attr:`traceback`, the formatted traceback as text, so that it crosses DDP ranks).

    Attributes:
        origin: ``"<module>.<Type> at <file>:<line>"`` for a client that raised, ``None`` otherwise (a timeout, a
            non-finite update, an update-norm outlier).
        traceback: The exception's formatted traceback (``""`` when ``origin`` is ``None``).
        error: The exception itself, on the process that trained the client only (never pickled).

    Example::

        >>> failure = ClientFailure(3, "timed out")
        >>> failure == (3, "timed out"), failure.origin, failure.client_id, failure.reason
        (True, None, 3, 'timed out')
        >>> import pickle
        >>> pickle.loads(pickle.dumps(ClientFailure(4, "KeyError: 'x'", origin="builtins.KeyError at m.py:7"))).origin
        'builtins.KeyError at m.py:7'
    """

    origin: Optional[str]
    traceback: str
    error: Optional[BaseException]

    def __new__(cls, client_id: int, reason: str, origin: Optional[str] = None, traceback_text: str = "",
                error: Optional[BaseException] = None) -> "ClientFailure":
        self = super().__new__(cls, (int(client_id), str(reason)))
        self.origin, self.traceback, self.error = origin, traceback_text, error
        return self

    def __reduce__(self) -> Any:  # the exception (and its frames) stays on its process
        return ClientFailure, (self[0], self[1], self.origin, self.traceback)

    @property
    def client_id(self) -> int:
        """The client's id in the partition."""
        return self[0]

    @property
    def reason(self) -> str:
        """Why it was dropped (``"<Type>: <message>"`` for an exception)."""
        return self[1]


class ClientRecord:
    """Each sampled client's history over a run, kept by the federated loop from the rounds' cohorts and failures:
    how many rounds it was sampled in, how many it reported back in (an update that passed the finiteness and
    norm checks), its current run of failing rounds and its last failure. Read by
    :meth:`ClientRunner.stop_if_failed_repeatedly` and by the loop's end-of-fit summary of the clients that never
    trained.

    Example: client 2 fails twice in a row; client 5 once, then reports::

        >>> record = ClientRecord()
        >>> record.end_round(0, cohort=[2, 5], reported=[], failures=[(2, "KeyError: 'x'"), (5, "timed out")])
        >>> record.end_round(1, cohort=[2, 5], reported=[5], failures=[(2, "KeyError: 'x'")])
        >>> record.failing(2), record.streak_rounds[2], record.never_trained()
        ([2], [0, 1], [2])
    """

    def __init__(self) -> None:
        #: client id -> rounds it was sampled in.
        self.sampled: dict[int, int] = {}
        #: client id -> rounds it reported back in.
        self.reported: dict[int, int] = {}
        #: client id -> the rounds of its current run of failures (emptied by a round in which it did not fail).
        self.streak_rounds: dict[int, list[int]] = {}
        #: client id -> its last failure, ``(client id, reason)`` (a :class:`ClientFailure`).
        self.last_failure: dict[int, tuple[int, str]] = {}

    def end_round(self, round_idx: int, cohort: Any, reported: Any, failures: Any, counted: Any = None) -> None:
        """Record round ``round_idx``: its ``cohort`` (client ids), the ids that ``reported`` back and its
        ``failures`` (``(client id, reason)``); ``counted`` (default all) the failures that extend a client's run
        of failures (an update-norm outlier trained: it does not)."""
        failed = {}
        for failure, counts in zip(failures, counted if counted is not None else [True] * len(failures)):
            cid = int(failure[0])
            self.last_failure[cid] = failure
            if counts:
                failed[cid] = failure
        for cid in (int(c) for c in cohort):
            self.sampled[cid] = self.sampled.get(cid, 0) + 1
            if cid in failed:
                self.streak_rounds.setdefault(cid, []).append(int(round_idx))
            else:
                self.streak_rounds.pop(cid, None)
        for cid in (int(c) for c in reported):
            self.reported[cid] = self.reported.get(cid, 0) + 1

    def failing(self, n: int) -> list[int]:
        """The clients whose last ``n`` (or more) sampled rounds all failed, in increasing id order."""
        return sorted(cid for cid, rounds in self.streak_rounds.items() if len(rounds) >= n)

    def never_trained(self) -> list[int]:
        """The clients sampled at least once that never reported back, in increasing id order."""
        return sorted(cid for cid in self.sampled if not self.reported.get(cid))

class ClientFailureHandling:
    """The failure part of :class:`~lightning_fed.client.runner.ClientRunner`: the failure policy applied in one
    place (:meth:`report_failure`, :meth:`client_failed`) and the two decisions that stop a run for failing clients.
    Reads the runner's ``trainer``, ``datamodule``, ``on_client_failure``, ``max_consecutive_client_failures`` and
    ``client_record``. Not used on its own.

    Example: the runner is one::

        >>> from lightning_fed.client.runner import ClientRunner
        >>> issubclass(ClientRunner, ClientFailureHandling), ClientRunner("raise").raises_on_failure
        (True, True)
    """

    @property
    def raises_on_failure(self) -> bool:
        """Whether a failing client stops training (``on_client_failure="raise"``)."""
        return self.on_client_failure == "raise"

    def report_failure(self, client_id: int, reason: str, error: Optional[BaseException] = None) -> ClientFailure:
        """Client ``client_id`` failed: warn and return the :class:`ClientFailure` record that drops it from the
        round (policies ``"skip"`` and ``"skip_all"``), or raise (policy ``"raise"``). ``error``: the exception its
        local work raised, if any (recorded with its :func:`failure_origin` and traceback).

        Raises:
            RuntimeError: with policy ``"raise"``.
        """
        message = f"Client {client_id} failed in round {self.trainer.current_epoch}: {reason}"
        if self.raises_on_failure:
            raise RuntimeError(message + " (on_client_failure='raise').")
        rank_zero_warn(message + "; dropped from the round's aggregate.")  # (reason: with the data source's notes)
        if error is None:
            return ClientFailure(client_id, reason)
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        return ClientFailure(client_id, reason, failure_origin(error), text, error)

    def client_failed(self, client_id: int, error: BaseException) -> ClientFailure:
        """Client ``client_id``'s local work raised ``error``: re-raise it under ``"raise"`` (and always for a
        mid-round checkpoint attempt, a frozen parameter changed, and an on-disk client-state row missing, damaged
        or not writable — the run's store, not the client, is at fault), else :meth:`report_failure`."""
        hint = getattr(self.datamodule, "batch_hint", None)  # e.g. a dict batch read as a tuple
        hint = hint(error) if callable(hint) else None
        if hint:
            error.add_note(f"Hint: {hint}.")
        if self.raises_on_failure or isinstance(error, (MidRoundCheckpointError, FrozenParameterChangedError,
                                                        MissingClientStateError, ClientStateStoreError)):
            raise error
        notes = "".join(f" [{note}]" for note in error_notes(error))  # e.g. the image row the data source names
        return self.report_failure(client_id, f"{type(error).__name__}: {error}{notes}" +
                                   (f" (hint: {hint})" if hint else ""), error)

    def stop_if_failed_repeatedly(self, round_idx: int) -> None:
        """Under policy ``"skip"``: stop the run when a client failed in each of its last n sampled rounds
        (n = :attr:`max_consecutive_client_failures`, as :attr:`client_record` counts them; the loop records each
        round's cohort and failures first). Its data or code fails every time (a corrupt or odd-sized sample, a
        one-sample batch through BatchNorm), and dropping it round after round would end the run "successfully"
        without it. Under several processes the record is built from the gathered failures, so every rank decides
        alike.

        Raises:
            RuntimeError: naming the client, its failing rounds, the last error (with the row where the data source
                named it) and its traceback text, ``max_consecutive_client_failures`` and the way to keep dropping
                it (``on_client_failure='skip_all'``).
        """
        n = self.max_consecutive_client_failures
        if n is None:
            return
        failing = self.client_record.failing(n)
        if not failing:
            return
        cid = failing[0]
        rounds = self.client_record.streak_rounds[cid]
        last = self.client_record.last_failure[cid]
        others = f" (and client(s) {', '.join(map(str, failing[1:]))})" if len(failing) > 1 else ""
        message = (
            f"Round {round_idx}: client {cid}{others} failed in each of its last {n} sampled rounds (rounds "
            f"{', '.join(map(str, rounds[-n:]))}), last with: {last[1]}. It would be dropped from every round while the "
            f"run goes on without it, so the run stops (max_consecutive_client_failures={n}). Fix its data or the "
            "error; on_client_failure='skip_all' keeps dropping such clients and goes on."
        )
        traceback_text = getattr(last, "traceback", "")
        self.reset_to_global()  # the module holds x_t of the round, not the last client's local model
        self.trainer.strategy.barrier("lightning_fed.stop_if_failed_repeatedly")
        raise RuntimeError(message + (f"\nClient {cid}'s last traceback:\n{traceback_text}" if traceback_text else ""))

    def stop_if_all_failed_alike(self, num_updates: int, failures: list[tuple[int, str]], round_idx: int) -> None:
        """Under policy ``"skip"``: stop the run when no client of round ``round_idx`` reported back and every one
        of its ``failures`` (at least one) is a client whose local work raised the same exception type at the same
        place (the same :func:`failure_origin`). Such an error is deterministic — a bug in ``training_step``, a
        data field every client lacks — and would fail every round the same way; dropping the clients would only
        end the run after ``max_epochs`` rounds of warnings. A cohort of one client counts: its error stops the run
        too. Failures that differ between clients (or that are timeouts, non-finite or outlier updates) keep the
        per-client drop. Under several processes ``failures`` are the gathered ones of every rank, so every rank
        takes the same decision.

        Raises:
            RuntimeError: naming the round, the number of clients and the error, raised from the first client's
                exception (its traceback is shown above the message; on a rank that did not train that client, the
                message holds the traceback's text).
        """
        if self.on_client_failure != "skip" or num_updates or not failures:
            return
        origins = {getattr(f, "origin", None) for f in failures}
        if len(origins) != 1 or None in origins:
            return
        first = failures[0]
        count = f"all {len(failures)} clients" if len(failures) > 1 else "its only client"
        message = (
            f"Round {round_idx}: {count} failed with the same error, {first.reason} (raised at the same place: "
            f"{first.origin}) -- a deterministic error, not a flaky client, so the run stops here instead of after "
            "max_epochs rounds of dropped clients. Fix the error; on_client_failure='skip_all' drops such clients "
            "and goes on (fault-injection studies)."
        )
        # Under several processes every rank gets here (same gathered failures): wait until each has read the others'
        # gathered buffers (a rank that left at once would remove its /dev/shm segment before a peer had mapped it).
        self.trainer.strategy.barrier("lightning_fed.stop_if_all_failed_alike")
        if first.error is None:  # trained on another rank
            raise RuntimeError(f"{message}\nClient {first.client_id}'s traceback:\n{first.traceback}")
        raise RuntimeError(message) from first.error
