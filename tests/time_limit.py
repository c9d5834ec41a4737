"""``time_limit``: a block that runs too long raises TimeoutError (a hang becomes a test failure)."""
from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def time_limit(seconds: float, what: str):
    """TimeoutError if the block runs longer than ``seconds`` (SIGALRM: main thread, Unix)."""
    def expire(signum, frame):
        raise TimeoutError(f"{what} took longer than {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
