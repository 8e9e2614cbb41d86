"""One thread makes every engine call of a picker, and batches the calls that wait for it.

A vLLM ``LLM`` is not safe to call from several threads: its engine loop collects every
finished request, so two concurrent calls can take each other's outputs. Callers therefore
never call the engine themselves; they queue their job here and wait on a future.

Kept instead of Ray Serve's ``serve.batch``: that forms each batch when its requests arrive,
so under load many small batches queue behind the running one (measured by
benchmarks/bench_serve.py: a mean batch of 4 at concurrency 32). Here a batch is formed when
the engine is free to take it.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any


class Batcher:
    """Jobs queued while the engine is busy go into its next call, up to ``max_batch_size``,
    in arrival order; an idle engine waits ``wait_s`` for company. ``fn`` maps a list of jobs
    to their results, in order. A job whose future was cancelled before its call is dropped;
    an error of ``fn`` reaches every job of that call, and the next call is still made."""

    def __init__(
        self, fn: Callable[[list[Any]], Sequence[Any]], max_batch_size: int, wait_s: float
    ) -> None:
        self.check(max_batch_size, wait_s)
        self.fn, self.max_batch_size, self.wait_s = fn, max_batch_size, wait_s
        self._cond = threading.Condition()
        self._pending: deque[tuple[Any, Future]] = deque()
        self._running = False

    @staticmethod
    def check(max_batch_size: int, wait_s: float) -> None:
        # A NaN wait never times out (an idle engine spins); an infinite one overflows
        # Condition.wait and kills the engine's thread.
        if max_batch_size < 1 or not (math.isfinite(wait_s) and wait_s >= 0):
            raise ValueError("Batcher: max_batch_size >= 1 and a finite wait_s >= 0")

    def submit(self, job: Any) -> Future:
        """``job``'s result, as a future (``asyncio.wrap_future`` awaits it)."""
        done: Future = Future()
        with self._cond:
            self._pending.append((job, done))
            self._cond.notify()
            if not self._running:
                # The thread ends when the queue is empty, so an idle picker holds none and a
                # dropped one can be collected.
                self._running = True
                threading.Thread(target=self._serve, name="picker-engine", daemon=True).start()
        return done

    def _next_batch(self) -> list[tuple[Any, Future]]:
        with self._cond:
            if not self._pending:
                self._running = False
                return []
            deadline = time.monotonic() + self.wait_s
            while len(self._pending) < self.max_batch_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            size = min(len(self._pending), self.max_batch_size)
            return [self._pending.popleft() for _ in range(size)]

    def _serve(self) -> None:
        while batch := self._next_batch():
            # From here a caller's cancel() no longer succeeds: each future gets its result.
            live = [(job, done) for job, done in batch if done.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                results = list(self.fn([job for job, _ in live]))
                if len(results) != len(live):
                    raise RuntimeError(f"{len(results)} results for a batch of {len(live)}")
            except BaseException as err:  # whatever fails, the thread lives on to serve others
                for _, done in live:
                    done.set_exception(err)
                continue
            for (_, done), result in zip(live, results, strict=True):
                done.set_result(result)
