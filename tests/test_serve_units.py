"""The service's batcher (pure asyncio around a stand-in engine call): what queues while the
engine is busy goes into its next call, capped at max_batch_size; an engine error reaches
every request of its batch, and the next batch is served."""

import asyncio
import threading
import time

import pytest

from ctxpick.serve.app import Batcher


def test_requests_queued_during_a_call_form_the_next_batch():
    calls, started = [], threading.Event()

    def engine(jobs):
        calls.append(list(jobs))
        started.set()
        time.sleep(0.3)
        return [j * 10 for j in jobs]

    async def scenario():
        b = Batcher(engine, max_batch_size=16, wait_s=0.0)
        first = asyncio.create_task(b.submit(0))
        while not started.is_set():
            await asyncio.sleep(0.01)
        rest = [asyncio.create_task(b.submit(i)) for i in range(1, 41)]
        return await first, await asyncio.gather(*rest)

    first, rest = asyncio.run(scenario())
    assert first == 0 and rest == [i * 10 for i in range(1, 41)]
    # one alone, then the 40 that queued meanwhile in full batches, in arrival order
    assert [len(c) for c in calls] == [1, 16, 16, 8]
    assert [j for c in calls for j in c] == list(range(41))


def test_an_idle_engine_waits_for_company_and_errors_reach_the_whole_batch():
    calls = []

    def engine(jobs):
        calls.append(list(jobs))
        if "bad" in jobs:
            raise ValueError("prompt too long")
        return list(jobs)

    async def scenario():
        b = Batcher(engine, max_batch_size=8, wait_s=0.2)
        together = [asyncio.create_task(b.submit(x)) for x in ("a", "bad")]
        results = await asyncio.gather(*together, return_exceptions=True)
        return results, await b.submit("c")

    results, after = asyncio.run(scenario())
    assert calls[0] == ["a", "bad"] and all(isinstance(r, ValueError) for r in results)
    assert after == "c"


@pytest.mark.parametrize("n", [1, 3])
def test_every_result_goes_to_its_own_request(n):
    async def scenario():
        b = Batcher(lambda jobs: [f"r{j}" for j in jobs], max_batch_size=2, wait_s=0.05)
        return await asyncio.gather(*[b.submit(i) for i in range(n)])

    assert asyncio.run(scenario()) == [f"r{i}" for i in range(n)]
