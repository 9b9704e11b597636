"""A token budget for the LLM contexts of one worker process (``context.run_token_budget``)."""

from __future__ import annotations

import threading


class RunBudget:
    """A token budget for one run, shared by every thread that asks the model. Thread-safe.

    :meth:`take` reserves an estimate before a request; a request that does not fit in what is left is
    refused and reserves nothing, so a smaller one may still fit later.
    """

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must not be negative, got {max_tokens}")
        self._max_tokens = max_tokens
        self._spent = 0
        self._lock = threading.Lock()

    @property
    def spent(self) -> int:
        with self._lock:
            return self._spent

    @property
    def remaining(self) -> int:
        with self._lock:
            return self._max_tokens - self._spent

    def take(self, tokens: int) -> bool:
        """Reserve ``tokens``; False (and nothing reserved) when they do not fit in what is left."""
        with self._lock:
            if self._spent + tokens > self._max_tokens:
                return False
            self._spent += tokens
            return True
