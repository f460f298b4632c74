"""``python -m turnkit.doctor.runtimes setup``: install ``@huggingface/jinja`` and build llama.cpp's Jinja runtime.

Both go into turnkit's cache folder, once (a second run finds them and does nothing). Each runtime that cannot be set
up is named with why, and the exit status is 1; the runtimes that could be set up stay usable.
"""

from __future__ import annotations

import sys
import time

from turnkit.doctor.runtimes import hfjs, llama_cpp


def main(argv: list[str]) -> int:
    if argv != ["setup"]:
        print("usage: python -m turnkit.doctor.runtimes setup", file=sys.stderr)
        return 2
    status = 0
    for what, step in (
        (f"@huggingface/jinja {hfjs.VERSION}", hfjs.install),
        (f"llama.cpp's Jinja runtime (llama-cpp-python {llama_cpp.LLAMA_CPP_PYTHON})", llama_cpp.build),
    ):
        started = time.perf_counter()
        try:
            path = step()
        except (RuntimeError, OSError, ValueError) as exc:
            print(f"turnkit runtimes: {what}: not set up: {exc}", file=sys.stderr)
            status = 1
            continue
        except Exception as exc:  # noqa: BLE001 - pip's or the compiler's own failure, named
            print(f"turnkit runtimes: {what}: not set up: {type(exc).__name__}: {exc}", file=sys.stderr)
            status = 1
            continue
        took = time.perf_counter() - started
        if took > 1:
            print(f"turnkit runtimes: {what}: ready in {took:.0f} s ({path})", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
