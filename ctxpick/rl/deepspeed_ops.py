"""DeepSpeed's CPU communication op, loaded so that a learner killed while loading it cannot
hang the learners after it.

As every CPU learner starts, DeepSpeed JIT-builds its shared-memory allreduce op (or, once
built, has ninja check it) under torch's build lock: a *file* that its creator removes when
done. A learner killed in that window (a preemption, a stage freed as it starts, `ray.kill`)
leaves the file behind, and every later learner on the node then waits on it forever, silently:
this hung a CI run for 80 minutes.

Here a learner loads the op holding an OS lock (`filelock`'s flock) beside it, which the
kernel releases when its holder dies, and leaves a marker file while it loads: the next holder
that finds one knows that the learner before it died loading, and removes the build lock it
left at once. A build lock without the mark is another program's (a benchmark's venv builds in
the same folder): it is waited for, and removed only once it is older than any build takes. One
such program may still take the lock between that check and the load, which then waits for it
as torch does: without a limit, should that program die holding it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from filelock import FileLock

# The op compiles in 55-80 s on 2 cores; a lock this old is a dead program's.
STALE_AFTER_S = 600.0


def _shm_op() -> tuple[Any, Path] | None:
    """The op's builder and the folder torch builds it in; None where the accelerator has no
    such op (GPUs)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    # torch's own, not exported: the folder it builds an op in and puts its lock file in.
    from torch.utils.cpp_extension import _get_build_directory

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return None
    return builder, Path(_get_build_directory(builder.NAME, verbose=False))


def build_lock() -> Path | None:
    """torch's build lock file for the op, where there is one."""
    op = _shm_op()
    return op[1] / "lock" if op else None


def _age_s(path: Path) -> float | None:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None


def clear_build_lock(lock: Path, left_by_a_learner: bool) -> None:
    """Remove ``lock`` if a learner that died loading the op left it; wait for another
    program's, and remove it once it is older than STALE_AFTER_S."""
    if left_by_a_learner and lock.exists():
        print(f"removing {lock}: left by a learner killed while it loaded the op")
        lock.unlink(missing_ok=True)
    told = False
    while (age := _age_s(lock)) is not None:
        if age > STALE_AFTER_S:
            print(f"removing {lock}: {age:.0f} s old, left by a process killed while building")
            lock.unlink(missing_ok=True)
            return
        if not told:
            print(
                f"waiting for {lock}: another program builds the op (stale after "
                f"{STALE_AFTER_S:.0f} s, {age:.0f} s old now)"
            )
            told = True
        time.sleep(1)


def load_shm_op() -> None:
    """Load (building once per node) the op that ``deepspeed.init_distributed`` loads next,
    which then finds it loaded."""
    op = _shm_op()
    if op is None:
        return
    builder, folder = op
    loading = folder.parent / f"{builder.NAME}.ctxpick-loading"
    with FileLock(f"{loading}.lock"):  # an flock: the kernel releases it if this process dies
        clear_build_lock(folder / "lock", left_by_a_learner=loading.exists())
        loading.touch()
        try:
            builder.load()
        finally:  # a load that raised released torch's lock as it unwound: only death leaves it
            loading.unlink()
