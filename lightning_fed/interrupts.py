"""Interrupting a round: a per-client wall-clock limit (hung clients) and stop signals (SIGTERM/SIGINT).

Both work through POSIX signals, which Python delivers to the main thread between bytecodes: a client stuck in a
Python-level wait (``time.sleep``, a busy loop in ``training_step``, a blocking ``queue.get``) is interrupted by an
exception raised where it waits. A single long native call (one huge matrix product, a blocking C extension that
does not check for signals) is interrupted only when it returns to Python.
"""

from __future__ import annotations

import logging
import math
import numbers
import signal
import threading
import time
from types import FrameType
from typing import Any, Callable, Optional, Union

#: How often the per-client alarm fires again after the limit while the client still runs (a client that swallowed
#: the first :class:`ClientTimeout`, e.g. with a bare ``except:``, gets another one), in seconds.
REPEAT_S = 1.0

log = logging.getLogger(__name__)

_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, None]


class ClientTimeout(BaseException):
    """Raised inside a client's local work when it runs past the per-client time limit.

    A :class:`BaseException` (like :class:`KeyboardInterrupt`), so that an ``except Exception`` in a module's
    ``training_step`` does not swallow it; the executor catches it and drops the client.

    Attributes:
        client_id: The client's id.
        round_idx: The round (0-based).
        limit_s: The limit, seconds.

    Example::

        >>> error = ClientTimeout(client_id=3, round_idx=1, limit_s=0.5)
        >>> str(error), isinstance(error, Exception)  # not caught by ``except Exception``
        ('client 3 exceeded client_timeout_s=0.5 s in round 1', False)
    """

    def __init__(self, client_id: int, round_idx: int, limit_s: float) -> None:
        super().__init__(f"client {client_id} exceeded client_timeout_s={limit_s:g} s in round {round_idx}")
        self.client_id = int(client_id)
        self.round_idx = int(round_idx)
        self.limit_s = float(limit_s)


class RoundInterrupted(BaseException):
    """Raised inside a round's local work when the process receives SIGTERM or SIGINT (see :class:`StopSignals`).

    Attributes:
        signum: The signal received (``signal.SIGTERM`` or ``signal.SIGINT``).

    Example::

        >>> import signal
        >>> error = RoundInterrupted(signal.SIGTERM)
        >>> str(error), error.signum == signal.SIGTERM, isinstance(error, Exception)
        ('received SIGTERM', True, False)
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = int(signum)


def check_client_timeout(value: Any) -> Optional[float]:
    """Validate ``client_timeout_s``: ``None`` (no limit) or a finite number of seconds > 0.

    Raises:
        ValueError: anything else (booleans included).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"`client_timeout_s` must be None (no limit) or a finite number of seconds > 0, got {value!r}."
        )
    return float(value)


def signals_available() -> bool:
    """Whether this thread can install signal handlers and a real-time interval timer (the main thread of a
    process on a platform with ``SIGALRM``/``setitimer``: Linux, macOS; not Windows)."""
    return (
        hasattr(signal, "SIGALRM")
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )


class ClientTimeLimit:
    """Context manager: a wall-clock limit of ``limit_s`` seconds on one client's local work.

    In the main thread of a POSIX process it arms ``signal.setitimer(ITIMER_REAL, limit_s)`` with a ``SIGALRM``
    handler that raises :class:`ClientTimeout` wherever the client is (then again every :data:`REPEAT_S` seconds
    until the block is left); on exit the previous ``SIGALRM`` handler is reinstalled and a previously armed
    ``ITIMER_REAL`` timer is re-armed with its remaining time (at least 1 µs: if it should have fired during the
    client it fires right after). Elsewhere (not the main thread, or no ``SIGALRM``, e.g. Windows) there is no
    interruption: the executor calls :meth:`check` between local steps, so a client is stopped after the first step
    that ends past the limit and a client hung inside one step is not stopped.

    Args:
        limit_s: The limit, seconds (> 0).
        client_id: The client's id (for the message).
        round_idx: The round (for the message).

    Example: a client hung in ``time.sleep`` is interrupted after 0.05 s (in the main thread)::

        >>> import time
        >>> with ClientTimeLimit(0.05, client_id=3, round_idx=1) as limit:
        ...     time.sleep(5)
        Traceback (most recent call last):
        ...
        lightning_fed.interrupts.ClientTimeout: client 3 exceeded client_timeout_s=0.05 s in round 1
        >>> limit.interrupts
        True
    """

    def __init__(self, limit_s: float, client_id: int, round_idx: int) -> None:
        self.limit_s = float(limit_s)
        self.client_id = int(client_id)
        self.round_idx = int(round_idx)
        #: Whether the limit interrupts the client (``SIGALRM``) or is only checked between steps.
        self.interrupts = False
        self._deadline = math.inf
        self._start = 0.0
        self._active = False
        self._previous_handler: _Handler = None
        self._previous_timer: tuple[float, float] = (0.0, 0.0)

    def _timeout(self) -> ClientTimeout:
        return ClientTimeout(self.client_id, self.round_idx, self.limit_s)

    def _on_alarm(self, signum: int, frame: Optional[FrameType]) -> None:
        if self._active:
            raise self._timeout()

    def check(self) -> None:
        """Raise :class:`ClientTimeout` if the limit has passed.

        Raises:
            ClientTimeout: the client has run for ``limit_s`` seconds or more.
        """
        if time.monotonic() >= self._deadline:
            raise self._timeout()

    def __enter__(self) -> "ClientTimeLimit":
        self._start = time.monotonic()
        self._deadline = self._start + self.limit_s
        self.interrupts = signals_available()
        if self.interrupts:
            self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
            self._active = True
            self._previous_timer = signal.setitimer(signal.ITIMER_REAL, self.limit_s, REPEAT_S)
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self.interrupts:
            self._active = False
            signal.setitimer(signal.ITIMER_REAL, 0.0)
            previous = self._previous_handler
            signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
            delay, interval = self._previous_timer
            if delay > 0.0:
                remaining = delay - (time.monotonic() - self._start)
                signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-6), interval)
        return False


class StopSignals:
    """Context manager: while a round's clients train, SIGTERM and SIGINT raise :class:`RoundInterrupted`.

    Installed only when ``enabled`` and in the main thread; a signal whose current disposition is ``SIG_IGN`` (a
    process started to ignore it) stays ignored. For SIGTERM the previous handler (Lightning's, which sets
    ``trainer.received_sigterm`` and forwards the signal to launched processes) runs first. On exit the previous
    handlers are reinstalled.

    Args:
        enabled: Install the handlers (the loop passes ``False`` under several processes, see
            :class:`~lightning_fed.FederatedFitLoop`).

    Example: a SIGTERM inside the block stops it; the previous handler (here a recording one, standing in for
    Lightning's) runs first and is reinstalled at the end::

        >>> import signal
        >>> seen = []
        >>> def previous(signum, frame):
        ...     seen.append(signal.Signals(signum).name)
        >>> original = signal.signal(signal.SIGTERM, previous)
        >>> with StopSignals():
        ...     signal.raise_signal(signal.SIGTERM)
        Traceback (most recent call last):
        ...
        lightning_fed.interrupts.RoundInterrupted: received SIGTERM
        >>> seen, signal.getsignal(signal.SIGTERM) is previous
        (['SIGTERM'], True)
        >>> _ = signal.signal(signal.SIGTERM, original)
    """

    SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGINT", None)) if s is not None)

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self._previous: dict[int, _Handler] = {}

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        previous = self._previous.get(signum)
        if signum == getattr(signal, "SIGTERM", None) and callable(previous):
            try:
                previous(signum, frame)
            except Exception:  # noqa: BLE001 - the round must still stop
                log.warning("The previous SIGTERM handler %r raised; stopping the round anyway.", previous,
                            exc_info=True)
        raise RoundInterrupted(signum)

    def __enter__(self) -> "StopSignals":
        if self.enabled:
            for signum in self.SIGNALS:
                current = signal.getsignal(signum)
                if current is signal.SIG_IGN:
                    continue
                self._previous[signum] = current
                signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: Any) -> bool:
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
        return False


class DeferSigterm:
    """Context manager: a SIGTERM received inside the block is held back and handed to the previous handler when
    the block ends.

    The loop wraps the global model's validation in it: Lightning's evaluation loop stops at the next batch once
    ``trainer.received_sigterm`` is set, which would end the run in the middle of a round's end (after the server
    update, before the round's callbacks and checkpoints) — neither resumable from the round's start nor from its
    end. Deferred, the SIGTERM reaches Lightning's handler after validation, and the loop stops at the round's end
    with a checkpoint. Not installed when disabled, outside the main thread, or when SIGTERM is ignored.

    Args:
        enabled: Install the handler (the loop passes ``False`` under several processes).

    Example: the SIGTERM is held back inside the block and handed to the previous handler when it ends::

        >>> import signal
        >>> seen = []
        >>> def previous(signum, frame):
        ...     seen.append(signal.Signals(signum).name)
        >>> original = signal.signal(signal.SIGTERM, previous)
        >>> with DeferSigterm() as defer:
        ...     signal.raise_signal(signal.SIGTERM)
        ...     print(defer.received, seen)
        True []
        >>> seen, signal.getsignal(signal.SIGTERM) is previous
        (['SIGTERM'], True)
        >>> _ = signal.signal(signal.SIGTERM, original)
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = (
            enabled and hasattr(signal, "SIGTERM") and threading.current_thread() is threading.main_thread()
        )
        self.received = False
        self._previous: _Handler = None
        self._installed = False

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.received = True

    def __enter__(self) -> "DeferSigterm":
        if self.enabled and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> bool:
        if self._installed:
            previous = self._previous
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
            self._installed = False
            if self.received:
                if callable(previous):
                    previous(signal.SIGTERM, None)
                elif previous in (signal.SIG_DFL, None):
                    signal.raise_signal(signal.SIGTERM)  # the default action: terminate, as it would have
        return False
