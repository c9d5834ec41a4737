"""Start ``lightspeed serve`` as a subprocess on a free loopback port (for the serve tests)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time


class ServerProcess:
    """A ``lightspeed serve`` process: ``url`` (after ``wait_ready``), ``proc``, its stderr lines in ``log``."""

    def __init__(self, args: list[str]):
        cmd = [sys.executable, "-m", "lightspeed", "serve", "--port", "0", *args]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log: list[str] = []
        self.url: str | None = None
        self._ready = ready = threading.Event()

        def read() -> None:  # keep draining stderr so that the server never blocks on a full pipe
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                m = re.search(r"on (http://\S+)/v1", line)
                if m and self.url is None:
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float = 300.0) -> str:
        """The server's base URL once it listens (RuntimeError with its log if it does not)."""
        if not self._ready.wait(timeout) or self.url is None:
            self.stop()
            raise RuntimeError("lightspeed serve did not start:\n" + "\n".join(self.log[-30:]))
        return self.url

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, then wait (SIGKILL after ``timeout``); the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode

    def wait_exit(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        return self.proc.poll()
