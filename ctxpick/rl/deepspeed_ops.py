"""DeepSpeed's CPU communication op, loaded under a lock that dies with its holder.

As every CPU learner starts, DeepSpeed JIT-builds its shared-memory allreduce op (or, once
built, has ninja check it) under torch's build lock: a *file* that its creator removes when
done. A learner killed in that window (a preemption, a stage freed as it starts, `ray.kill`)
leaves the file behind, and every later learner on the node then waits on it forever, silently:
this hung a CI run for 80 minutes. Here the load runs under an OS lock (`flock`) on a sibling
file, which the kernel releases when its holder dies, so the holder knows that a build lock it
finds was left by a dead process. Builds by other programs on the node do not take the `flock`;
one racing ours could have its lock removed, which costs a redundant compile, not a hang."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any


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


def load_shm_op() -> None:
    """Load (building once per node) the op that ``deepspeed.init_distributed`` loads next,
    which then finds it loaded."""
    op = _shm_op()
    if op is None:
        return
    builder, folder = op
    with (folder.parent / f"{builder.NAME}.ctxpick-lock").open("w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released by the kernel if this process dies
        stale = folder / "lock"
        if stale.exists():
            print(f"removing {stale}: a build lock left by a process killed while building")
            stale.unlink(missing_ok=True)
        builder.load()
