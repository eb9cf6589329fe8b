"""An arm's time share: the trainer's graceful stop (SIGUSR1) sent to this process once its seconds have passed."""
from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TimeShare:
    """A trainer's time share: SIGUSR1 (the trainer's graceful stop: a checkpoint at the next step, exit 75) once
    `seconds` have passed and the trainer's handler is installed (a start-up longer than the share still ends in
    the stop, not at the iteration cap), unless cancelled first. Outside the trainer's own handler (before it
    installs it, after it restores it) the signal is ignored, never the default action (the end of the process)."""

    seconds: float
    poll_s: float = 0.2
    fired: bool = False
    _thread: threading.Thread | None = field(default=None, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _previous: Any = field(default=None, repr=False)

    def __enter__(self) -> TimeShare:
        self._previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        if self._cancel.wait(self.seconds):
            return
        while signal.getsignal(signal.SIGUSR1) in (signal.SIG_IGN, signal.SIG_DFL, None):  # no handler yet
            if self._cancel.wait(self.poll_s):
                return
        self.fired = True
        os.kill(os.getpid(), signal.SIGUSR1)

    def __exit__(self, *exc: object) -> None:
        self._cancel.set()
        self._thread.join()
        signal.signal(signal.SIGUSR1, self._previous)
