"""The train tests' harness: each @case runs at once, reports ok/FAIL with its traceback, and
finish() exits 1 naming the failures."""
import sys
import traceback

FAILURES = []


def case(fn):
    try:
        fn()
        print("ok  ", fn.__name__)
    except Exception:  # noqa: BLE001 (each case reports its own failure)
        FAILURES.append(fn.__name__)
        print("FAIL", fn.__name__)
        traceback.print_exc()
    return fn


def finish():
    if FAILURES:
        print("failed:", ", ".join(FAILURES))
        sys.exit(1)
    print("all cases passed")
