"""The picker's batcher (pure: a stand-in engine call that blocks until released): what
queues while the engine is busy goes into its next call, capped at max_batch_size; an engine
error reaches every request of its batch, a cancelled request never breaks its batch, and
the next batch is always served."""

import asyncio
import threading

import pytest

from ctxpick.picker.batcher import Batcher

SAFETY_S = 60  # only so that a regression fails instead of hanging the suite


class Gate:
    """An engine call that records its jobs and blocks until allowed to return."""

    def __init__(self):
        self.calls = []
        self.entered, self.permits = threading.Semaphore(0), threading.Semaphore(0)

    def __call__(self, jobs):
        self.calls.append(list(jobs))
        self.entered.release()
        assert self.permits.acquire(timeout=SAFETY_S)
        return [j * 10 for j in jobs]

    async def call_started(self):
        assert await asyncio.to_thread(self.entered.acquire, True, SAFETY_S)

    def allow(self, calls=1):
        for _ in range(calls):
            self.permits.release()


def _answer(batcher, job):
    return asyncio.wrap_future(batcher.submit(job))


@pytest.mark.parametrize("wait", [float("nan"), float("inf"), -1.0])
def test_a_wait_that_is_not_finite_seconds_is_refused(wait):
    # NaN never times out (an idle engine spins); inf overflows Condition.wait in its thread
    with pytest.raises(ValueError, match="a finite wait_s >= 0"):
        Batcher(lambda jobs: jobs, max_batch_size=2, wait_s=wait)


def test_requests_queued_during_a_call_form_the_next_batch():
    gate = Gate()

    async def scenario():
        b = Batcher(gate, max_batch_size=16, wait_s=0.0)
        first = _answer(b, 0)
        await gate.call_started()
        rest = [_answer(b, i) for i in range(1, 41)]
        gate.allow(4)
        return await first, await asyncio.wait_for(asyncio.gather(*rest), SAFETY_S)

    first, rest = asyncio.run(scenario())
    assert first == 0 and rest == [i * 10 for i in range(1, 41)]
    # one alone, then the 40 that queued meanwhile in full batches, in arrival order
    assert [len(c) for c in gate.calls] == [1, 16, 16, 8]
    assert [j for c in gate.calls for j in c] == list(range(41))


def test_an_idle_engine_waits_for_company_and_errors_reach_the_whole_batch():
    calls = []

    def engine(jobs):
        calls.append(list(jobs))
        if "bad" in jobs:
            raise ValueError("prompt too long")
        return list(jobs)

    async def scenario():
        # a long wait, cut short by a full batch
        b = Batcher(engine, max_batch_size=2, wait_s=SAFETY_S)
        together = [_answer(b, x) for x in ("a", "bad")]
        results = await asyncio.gather(*together, return_exceptions=True)
        return results, await asyncio.wait_for(_answer(Batcher(engine, 1, 0.0), "c"), SAFETY_S)

    results, after = asyncio.run(scenario())
    assert calls[0] == ["a", "bad"] and all(isinstance(r, ValueError) for r in results)
    assert after == "c"


@pytest.mark.parametrize("when", ["mid-call", "queued"])
def test_a_cancelled_request_never_breaks_its_batch(when):
    """Three requests queue behind a running call; the first is cancelled (its client left)
    while it still queues, or during the next call, which holds all three: the other two
    are answered, a queued cancelled one never reaches the engine, and the batcher serves
    on."""
    gate = Gate()

    async def scenario():
        b = Batcher(gate, max_batch_size=8, wait_s=0.0)
        busy = _answer(b, 100)
        await gate.call_started()
        three = [_answer(b, i) for i in (1, 2, 3)]
        if when == "queued":
            three[0].cancel()
            await asyncio.sleep(0)  # the cancel reaches the batcher's future in a loop callback
        gate.allow()
        assert await busy == 1000
        await gate.call_started()
        if when == "mid-call":
            three[0].cancel()
        gate.allow(2)
        answered = await asyncio.wait_for(asyncio.gather(*three[1:]), SAFETY_S)
        return three[0], answered, await asyncio.wait_for(_answer(b, 4), SAFETY_S)

    first, answered, after = asyncio.run(scenario())
    assert first.cancelled() and answered == [20, 30] and after == 40
    assert gate.calls[1] == ([1, 2, 3] if when == "mid-call" else [2, 3])


def test_an_engine_call_that_returns_the_wrong_count_fails_its_batch_not_the_batcher():
    answers = iter([[1], [7, 8]])
    b = Batcher(lambda jobs: next(answers), max_batch_size=2, wait_s=SAFETY_S)
    first, second = b.submit("x"), b.submit("y")
    with pytest.raises(RuntimeError, match="1 results for a batch of 2"):
        first.result(SAFETY_S)
    with pytest.raises(RuntimeError):
        second.result(SAFETY_S)
    assert [b.submit(j) for j in "ab"][1].result(SAFETY_S) == 8


@pytest.mark.parametrize("n", [1, 3])
def test_every_result_goes_to_its_own_request(n):
    async def scenario():
        b = Batcher(lambda jobs: [f"r{j}" for j in jobs], max_batch_size=2, wait_s=0.05)
        return await asyncio.gather(*[_answer(b, i) for i in range(n)])

    assert asyncio.run(scenario()) == [f"r{i}" for i in range(n)]
