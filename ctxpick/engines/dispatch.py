"""The one fault-tolerant dispatcher over a set of Ray actors (engine pools, mining workers).

Units of work go to idle actors, busiest-first. When an actor dies, only its unit in flight is
redone, on a replacement actor. A unit that has killed ``max_attempts`` actors is poison: it
goes to ``on_poison`` with the reason instead of looping forever. A result can also ask for
part of its unit to be redone (a transient failure inside the unit, e.g. an HTTP judge that
timed out), under the same attempt limit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import ray

U = TypeVar("U")
Actor = Any  # a Ray actor handle
ACTOR_DIED = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


class PoisonUnit(RuntimeError):
    pass


def dispatch(
    units: list[U],
    actors: list[Actor],
    submit: Callable[[Actor, U], ray.ObjectRef],
    on_result: Callable[[U, Any], U | None],
    *,
    replace: Callable[[], Actor] | None = None,
    on_poison: Callable[[U, str], None] | None = None,
    max_attempts: int = 3,
) -> list[Actor]:
    """Run every unit; returns the live actors (replacements included).

    ``on_result(unit, result)`` returns a unit to redo, or None. Without ``replace`` an actor's
    death is raised; without ``on_poison`` a poison unit raises :class:`PoisonUnit`."""
    if not actors:
        raise ValueError("dispatch needs at least one actor")
    queue = deque((u, 1) for u in units)
    idle, inflight = list(actors), {}
    while queue or inflight:
        while queue and idle:
            unit, attempt = queue.popleft()
            actor = idle.pop()
            inflight[submit(actor, unit)] = (actor, unit, attempt)
        ready, _ = ray.wait(list(inflight), num_returns=1)
        actor, unit, attempt = inflight.pop(ready[0])
        try:
            result = ray.get(ready[0])
        except ACTOR_DIED as err:
            if replace is None:
                raise
            idle.append(replace())
            reason = f"{type(err).__name__} on attempt {attempt}/{max_attempts}"
            print(f"  actor died ({reason}); replaced, redoing its unit", flush=True)
            _retry(queue, unit, attempt, max_attempts, on_poison, reason)
            continue
        idle.append(actor)
        redo = on_result(unit, result)
        if redo is not None:
            _retry(queue, redo, attempt, max_attempts, on_poison, "a transient failure")
    return idle


def _retry(
    queue: deque,
    unit: U,
    attempt: int,
    max_attempts: int,
    on_poison: Callable[[U, str], None] | None,
    reason: str,
) -> None:
    if attempt < max_attempts:
        queue.appendleft((unit, attempt + 1))
        return
    why = f"gave up after {max_attempts} attempts (last: {reason})"
    if on_poison is None:
        raise PoisonUnit(why)
    on_poison(unit, why)
