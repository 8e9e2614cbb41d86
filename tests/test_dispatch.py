"""The one dispatcher (ctxpick/engines/dispatch.py) on real Ray actors of the loopback cluster:
a killed actor's unit is redone on a replacement and every result arrives once; a unit that
kills every actor it touches goes to the poison handler after the attempt limit; a transient
failure is redone instead of being final; without a replacement a death is raised."""

import os
import time

import pytest
import ray

from ctxpick.engines.dispatch import PoisonUnit, dispatch


@ray.remote(num_cpus=0, max_restarts=0)
class Doubler:
    def run(self, unit):
        if unit == "poison":
            os._exit(1)  # the worker process dies, as a crashing engine would
        time.sleep(0.05)
        return unit * 2


def test_a_killed_actor_is_replaced_and_every_unit_is_done_once(ray_cluster):
    actors = [Doubler.remote(), Doubler.remote()]
    results, replaced = {}, []

    def on_result(unit, result):
        if not replaced and len(results) == 2:
            ray.kill(actors[0])  # busy with a unit of its own
        assert unit not in results
        results[unit] = result

    def replace():
        replaced.append(Doubler.remote())
        return replaced[-1]

    live = dispatch(list(range(20)), list(actors), lambda a, u: a.run.remote(u), on_result,
                    replace=replace)  # fmt: skip
    assert results == {u: 2 * u for u in range(20)}
    assert len(replaced) == 1 and replaced[0] in live and actors[0] not in live


def test_a_poison_unit_stops_after_the_attempt_limit(ray_cluster):
    poisoned, results, started = [], {}, []

    def replace():
        started.append(Doubler.remote())
        return started[-1]

    units = [1, "poison", 2, 3]
    dispatch(units, [Doubler.remote()], lambda a, u: a.run.remote(u),
             lambda u, r: results.__setitem__(u, r), replace=replace,
             on_poison=lambda u, why: poisoned.append((u, why)), max_attempts=3)  # fmt: skip
    assert results == {1: 2, 2: 4, 3: 6}
    assert len(started) == 3  # one replacement per death, and no fourth try
    [(unit, why)] = poisoned
    assert unit == "poison" and "gave up after 3 attempts" in why and "ActorDiedError" in why
    with pytest.raises(PoisonUnit):
        dispatch(["poison"], [Doubler.remote()], lambda a, u: a.run.remote(u),
                 lambda u, r: None, replace=Doubler.remote, max_attempts=1)  # fmt: skip


def test_a_transient_failure_is_redone_and_a_death_without_replacement_raised(ray_cluster):
    seen = []

    def on_result(unit, result):
        seen.append(unit)
        return unit if seen.count(unit) == 1 and unit == 5 else None  # unit 5 fails once

    dispatch([4, 5, 6], [Doubler.remote()], lambda a, u: a.run.remote(u), on_result)
    assert sorted(seen) == [4, 5, 5, 6]
    with pytest.raises(ray.exceptions.RayActorError):
        dispatch(["poison"], [Doubler.remote()], lambda a, u: a.run.remote(u), lambda u, r: None)
