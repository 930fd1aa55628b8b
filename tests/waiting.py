"""Polling helpers the tests share: wait for a condition, or for a studio pair to finish."""

from __future__ import annotations

import time

from db.records import TERMINAL_STATUSES


def wait_until(check, timeout_s: float = 240, interval_s: float = 0.1, what: str = "condition"):
    """`check()`'s first truthy value, polled every `interval_s`; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def finished_pair(service, pair_id: str, timeout_s: float = 240):
    """The pair's view once it is completed or failed."""
    return wait_until(lambda: (p := service.get_pair(pair_id)).status in TERMINAL_STATUSES and p, timeout_s,
                      what=f"pair {pair_id}")
