"""Child processes kept out of the terminal's process group, so that Ctrl-C reaches turnkit alone and turnkit drains.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group, and systemd's default stop and ``timeout``
send SIGTERM to the group. A child process that takes such a signal as its own shutdown ends its work while turnkit is
still draining it: vLLM's engine core (``--engine vllm``) ended every running stream with an error a few seconds after
Ctrl-C. Started inside :func:`shielded_children`, a child moves into a process group of its own as it starts, so the
group's signal reaches turnkit alone; turnkit drains, then stops the child itself (by its pid).

Two ways a child can start, two hooks:

* forked: a fork hook (:func:`os.register_at_fork`), armed only inside the block;
* spawned (a fresh interpreter, as vLLM's CPU build always starts its engine core): the block marks the environment
  with this process's pid, and the child calls :func:`leave_the_group_if_marked` early (turnkit's vLLM plugin does, in
  ``register``, which vLLM runs in every process it starts); only a direct child of the marked process leaves, so its
  own children stay in its group.

A child that leaves its parent's group no longer dies with the group when the parent is killed outright: it watches
its parent and sends itself SIGTERM (vLLM's own shutdown) once turnkit is gone, and SIGKILL if it is still there
:data:`ORPHAN_GRACE_SECONDS` later (vLLM's teardown was seen to hang, waiting for a worker that had exited).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

__all__ = ["leave_the_group_if_marked", "shielded_children"]

#: The environment variable a shielded block sets to its process's pid, for spawned children.
MARK = "TURNKIT_SHIELDED_PARENT"

#: How often a shielded child checks that its parent is still there.
PARENT_CHECK_SECONDS = 0.5

#: How long an orphaned child's own shutdown (SIGTERM) may take before it is killed.
ORPHAN_GRACE_SECONDS = 30.0

_armed = False
_hooked = False


def _leave_the_group() -> None:
    """A process group of its own, and a watch that stops this process once its parent is gone."""
    parent = os.getppid()
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_GRACE_SECONDS)  # still here: its own shutdown hangs (vLLM's waits on workers that are gone)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="turnkit-parent-watch", daemon=True).start()


def _after_fork() -> None:
    global _armed
    if _armed:
        _armed = False  # the child's own children stay in its group
        _leave_the_group()


def leave_the_group_if_marked() -> bool:
    """In a spawned child of a process inside :func:`shielded_children`: leave the group (see the module). Returns
    whether it left."""
    if os.environ.get(MARK) != str(os.getppid()):
        return False
    _leave_the_group()
    return True


@contextlib.contextmanager
def shielded_children() -> Iterator[None]:
    """While the block runs, every child this process forks, and every spawned child that calls
    :func:`leave_the_group_if_marked`, leaves the process group."""
    global _armed, _hooked
    if not _hooked:
        os.register_at_fork(after_in_child=_after_fork)
        _hooked = True
    _armed = True
    os.environ[MARK] = str(os.getpid())
    try:
        yield
    finally:
        _armed = False
        os.environ.pop(MARK, None)
