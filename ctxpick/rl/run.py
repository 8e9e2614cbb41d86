"""The actors of one training stage: rollout engines, learners and the reward service, placed
together, and the weight sync between learners and engines."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import ray

from ctxpick.config import Config, ConfigError
from ctxpick.engines.ray_pool import EnginePool, reserve
from ctxpick.rewards.service import RewardClient
from ctxpick.rl.learner_group import LearnerGroup
from ctxpick.rl.placement import stage_bundles


class Run:
    """The actors of one stage: rollout engines, learners and the reward service."""

    def __init__(self, cfg: Config) -> None:
        self.cfg, stage, rl = cfg, cfg.stage, cfg.rl
        # Absolute here, on the driver: actors start in other folders, and a LoRA adapter
        # records it as the model it was trained on (ctxpick models ship follows it).
        init_from = str(Path(stage.init_from).resolve()) if stage.init_from else None
        model = init_from or cfg.picker.model
        if init_from and not (Path(init_from) / "config.json").exists():
            raise ConfigError(f"stage.init_from={stage.init_from} is not a model folder")
        # One placement group for the rollout workers and the learners, reserved at once:
        # stages sharing a cluster (a sweep's points) queue whole instead of each holding
        # part of what it needs.
        bundles, learners_at = stage_bundles(rl.rollout, rl.learner)
        self.pg = reserve(
            bundles,
            rl.placement_strategy,
            f"ctxpick-{stage.name}-{secrets.token_hex(3)}",
            cfg.ray.reserve_timeout_s,
        )
        # Engines load while the learners initialise.
        self.transfer = rl.transfer_mode()
        self.serves_lora = self.transfer == "adapter" and rl.serving_mode() == "lora"
        try:
            self.engines = EnginePool.from_config(
                model,
                rl.rollout,
                cfg.seed,
                wait=False,
                replace_dead=False,  # a replacement would lack the synced weights: train() restarts
                placement=(self.pg, 0),
                logprobs_mode="processed_logprobs",
                dtype=rl.learner.compute_dtype(),  # rollouts sample the learner's numerics
                weight_transfer=self.transfer,
                # Adapter sync: the base model loaded once, the learner's adapter on top of it,
                # served by vLLM's LoRA support or merged into the engine's weights.
                max_lora_rank=rl.learner.lora_rank if self.serves_lora else 0,
            )
            self.learners = LearnerGroup(
                rl.learner, stage.lr, init_from, placement=(self.pg, learners_at)
            )
            self.engines.ready()
            if self.transfer in ("nccl", "ipc"):
                self.learners.connect_engines(self.transfer, self.engines.actors)
            from transformers import AutoTokenizer

            from ctxpick.engines.models import resolve

            self.tokenizer = AutoTokenizer.from_pretrained(resolve(model))
            self.rewards = RewardClient(cfg.rewards.timeout_s, cfg.rewards.fallback)
        except BaseException:
            # A start that fails half-way: removing the group kills what it already placed.
            ray.util.remove_placement_group(self.pg)
            raise
        self.closed = False

    def sync_weights(self) -> float:
        """Push the learners' policy to the rollout workers (the LoRA adapter alone, or whole
        weights: ctxpick/rl/weight_sync.py); returns the seconds it took."""
        if self.transfer == "adapter":
            return self.engines.load_weights(self.learners.adapter(), adapter=True)
        if self.transfer == "object_store":
            return self.engines.load_weights(self.learners.weight_buckets(self.cfg.rl.bucket_mb))
        t0 = time.time()
        self.learners.call("send_weights")
        return time.time() - t0

    def shutdown(self) -> None:
        # Once: after an actor's death the trainer shuts a run down before it starts the next,
        # and if that start fails the dead run is still the one its clean-up holds.
        if self.closed:
            return
        self.closed = True
        try:
            self.engines.shutdown()
            self.learners.shutdown()
            self.rewards.shutdown()
        finally:  # the group's removal frees its engines and learners whatever failed above
            ray.util.remove_placement_group(self.pg)
