"""The settings that define a training stage, recorded in its ``output_dir``: a re-run there
with other ones would return the old ``final/`` or resume the old checkpoint as if it were the
stage asked for, so it is refused with the keys that differ."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ctxpick.config import Config, ConfigError
from ctxpick.picker.examples import RATIONALES

log = logging.getLogger(__name__)
SETTINGS_FILE = "settings.json"
# How long a stage runs (a finished stage asked for more steps trains on from its checkpoint).
RUN_LENGTH = {"max_steps", "patience"}
# How the learners are placed and batched: the same updates, computed elsewhere or in other cuts.
LEARNER_RESOURCES = {
    "num_actors",
    "num_cpus_per_actor",
    "num_gpus_per_actor",
    "zero_stage",
    "micro_batch_size",
    "logprob_chunk",
    "packing",
}
# Keys an older record may lack (the option came later, or was recorded only when on), each at
# the value a stage recorded without it trained with. A fact about old records, so a literal,
# not the config's default of today.
ADDED_LATER: dict[str, Any] = {
    "stage.rationale": "titles",
    "stage.rationale_version": 1,
    "rl.dynamic_sampling": False,
    "rl.async_level": 0,
    "rl.learner.dtype": "bfloat16",  # the learner's one dtype until 2026-12-07
}


def stage_settings(cfg: Config) -> dict[str, Any]:
    """What a stage's weights depend on: its data, prompt, reward, optimiser and seed."""
    rl = cfg.rl
    return {
        "stage": {k: v for k, v in asdict(cfg.stage).items() if k not in RUN_LENGTH}
        # The targets a warm start trains on changed under the same name once.
        | {"rationale_version": RATIONALES[cfg.stage.rationale]},
        "rewards": {"format_penalty": cfg.rewards.format_penalty, "fallback": cfg.rewards.fallback},
        "picker": asdict(cfg.picker),
        "rl": {
            "mined": rl.mined,
            "pool_order": rl.pool_order,
            "prompts_per_step": rl.prompts_per_step,
            "learner": {k: v for k, v in asdict(rl.learner).items() if k not in LEARNER_RESOURCES}
            # The dtype it computes in, not "auto": the same config on another CPU trains
            # otherwise, and its checkpoint's optimizer state is of another layout.
            | {"dtype": rl.learner.compute_dtype()},
            "dynamic_sampling": rl.dynamic_sampling,
            # Read only by dynamic sampling: off, any value trains the same.
            "max_prompt_draws": rl.max_prompt_draws if rl.dynamic_sampling else None,
            "async_level": rl.async_level,
            # No repeats record no key, as before the option existed.
            "dataset_repeats": _repeats(rl.dataset_repeats),
        },
        "seed": cfg.seed,
    }


def _repeats(repeats: dict[str, int]) -> dict[str, int]:
    """Repeats that change the prompt order (1 is no repeat), so ``{}`` and ``{x: 1}`` agree."""
    return {k: v for k, v in sorted(repeats.items()) if v != 1}


def check_stage_settings(cfg: Config, out: Path) -> None:
    """Record the stage's settings in ``out``, or refuse if ``out`` holds a stage trained with
    other ones. Only trained work (a checkpoint or ``final/``) binds the folder: a start that
    failed before it (too few prompts, a bad ``init_from``) may be re-run with other settings."""
    recorded = json.dumps(stage_settings(cfg), indent=2) + "\n"
    settings, path = _flat(json.loads(recorded)), out / SETTINGS_FILE
    trained = (out / "final").exists() or (out / "checkpoints").exists()
    if trained and not path.exists():
        log.warning("%s holds a stage trained before its settings were recorded", out)
    if trained and path.exists():
        written = _flat(json.loads(path.read_text()))
        old = ADDED_LATER | written
        if changed := sorted(
            k for k in old.keys() | settings.keys() if old.get(k) != settings.get(k)
        ):
            unrecorded = " (not recorded there)"
            detail = ", ".join(
                f"{k}: {old.get(k)!r} there{unrecorded * (k not in written)}, "
                f"{settings.get(k)!r} now"
                for k in changed
            )
            raise ConfigError(
                f"{out} holds a stage trained with other settings ({detail}; see {path}): "
                "train into another output_dir, or delete it to start over"
            )
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(recorded)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys (``stage.gamma``), as the config's overrides name them."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out
