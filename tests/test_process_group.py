"""``turnkit.process_group``: a child started inside ``shielded_children`` leaves the terminal's process group (forked:
by the fork hook; spawned: by ``leave_the_group_if_marked``, which turnkit's vLLM plugin calls in vLLM's engine
process), so a signal to the group reaches the parent alone; and it ends by itself once its parent is killed outright.
Real processes, real signals: a parent script in a session of its own, as a terminal runs a command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from serve_harness import process_alive

PARENT = """
import multiprocessing, os, signal, sys, time
from turnkit.process_group import leave_the_group_if_marked, shielded_children

def child(ready):
    leave_the_group_if_marked()  # what turnkit's vLLM plugin does first in a process vLLM spawns
    open(os.path.join(ready, str(os.getpid())), "w").close()  # running its own code: a SIGINT now is not lost
    time.sleep(600)

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal starts it (a test runner may ignore it)
    with shielded_children():
        process = multiprocessing.get_context(sys.argv[1]).Process(target=child, args=(sys.argv[2],))
        process.start()
    unshielded = multiprocessing.get_context(sys.argv[1]).Process(target=child, args=(sys.argv[2],))
    unshielded.start()
    signal.signal(signal.SIGINT, lambda *_: print("parent: SIGINT", flush=True))  # the children keep Python's own
    print(process.pid, unshielded.pid, flush=True)
    time.sleep(600)
"""


def _wait(condition, seconds: float = 120) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_shielded_child_leaves_the_group_and_ends_with_its_parent(method, tmp_path):
    """SIGINT to the group (Ctrl-C) reaches the parent and the child started outside the block, not the shielded
    child; the parent killed outright, the shielded child ends by itself (its parent watch)."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT, encoding="utf-8")
    parent = subprocess.Popen(
        [sys.executable, str(script), method, str(tmp_path)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    children: list[int] = []
    try:
        assert parent.stdout is not None
        children += [int(pid) for pid in parent.stdout.readline().split()]
        shielded, unshielded = children
        group = os.getpgid(parent.pid)
        assert _wait(lambda: os.getpgid(shielded) != group), "the shielded child stays in the parent's group"
        assert os.getpgid(unshielded) == group  # a child started after the block stays, as before
        # Ctrl-C once both children run their own code: Python drops a SIGINT that reaches a forked child before its
        # fork hooks are done (pending signals are cleared after fork(); an exception in a hook is unraisable), so a
        # signal sent the instant after start() can be lost on a loaded machine
        assert _wait(lambda: all((tmp_path / str(pid)).exists() for pid in children)), "the children did not start"
        os.killpg(group, signal.SIGINT)
        assert parent.stdout.readline().strip() == "parent: SIGINT"
        assert _wait(lambda: not process_alive(unshielded), 60)  # Ctrl-C reached the child in the group ...
        assert process_alive(shielded)  # ... not the shielded one
        parent.kill()
        parent.wait(timeout=30)
        assert _wait(lambda: not process_alive(shielded)), "the shielded child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in children:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
