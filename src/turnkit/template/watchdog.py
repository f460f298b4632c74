"""A time limit for code that runs in the calling thread: one shared watchdog thread for all renders.

A chat template is a program; ``{% for i in range(99999) %}{% for j in range(99999) %}...`` never ends in practice.
Rendering runs in the caller's thread (a thread hop per render would cost more than the render), so the limit is
enforced from outside: a daemon thread looks at the running renders every few milliseconds and, when one is past its
deadline, raises :class:`Overrun` inside that thread with ``PyThreadState_SetAsyncExc``. Python checks for such an
exception between bytecodes, which is where a runaway template spends its time (Jinja compiles to Python).

Starting a guard is a dict insert under a lock, so the common case costs about a microsecond.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time

from turnkit.errors import Overrun

__all__ = ["time_limit"]

_TICK_SECONDS = 0.01


def _raise_in_thread(thread_id: int, exc: type[BaseException] | None) -> None:
    # With exc=None (a NULL pointer) a pending asynchronous exception is cleared instead.
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class _Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._guards: dict[int, tuple[float, int]] = {}  # ticket -> (deadline, thread id)
        self._fired: set[int] = set()
        self._tickets = itertools.count()
        self._busy = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> int:
        ticket = next(self._tickets)
        deadline = time.monotonic() + seconds
        with self._lock:
            self._guards[ticket] = (deadline, threading.get_ident())
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="turnkit-watchdog", daemon=True)
                self._thread.start()
        if not self._busy.is_set():
            self._busy.set()
        return ticket

    def disarm(self, ticket: int) -> bool:
        """Stop guarding; return True when the deadline had already fired for this ticket."""
        with self._lock:
            self._guards.pop(ticket, None)
            fired = ticket in self._fired
            if fired:
                self._fired.discard(ticket)
                _raise_in_thread(threading.get_ident(), None)  # drop it if it was not delivered yet
        return fired

    def _watch(self) -> None:
        while True:
            self._busy.wait()
            time.sleep(_TICK_SECONDS)
            now = time.monotonic()
            with self._lock:
                for ticket, (deadline, thread_id) in list(self._guards.items()):
                    if now >= deadline:
                        del self._guards[ticket]
                        self._fired.add(ticket)
                        _raise_in_thread(thread_id, Overrun)
                if not self._guards:
                    self._busy.clear()


_WATCHDOG = _Watchdog()


class time_limit:  # noqa: N801 - used like a function: `with time_limit(2.0): ...`
    """Run the block with a deadline; past it, :class:`Overrun` is raised inside the block.

    ``None`` means no limit. Code that sits in one long C call (a huge regex, say) is interrupted when it returns.
    A class rather than a generator-based context manager: it is entered once per render, on the hot path.
    """

    __slots__ = ("_seconds", "_ticket")

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._ticket: int | None = None

    def __enter__(self) -> None:
        if self._seconds is not None:
            self._ticket = _WATCHDOG.arm(self._seconds)

    def __exit__(self, *exc_info: object) -> None:
        if self._ticket is not None and _WATCHDOG.disarm(self._ticket):
            raise Overrun
