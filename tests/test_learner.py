"""Real DeepSpeed steps (CPU: gloo, bf16) on the built-in model, data-parallel over two Ray
actors placed by a placement group, under ZeRO-2 and ZeRO-3."""

import pytest
import torch

from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.picker.format import picker_chat
from ctxpick.rl.grpo import GRPOConfig
from ctxpick.rl.learner import LearnerConfig, LearnerGroup, TrainSequence

pytestmark = pytest.mark.slow

SFT = [
    TrainSequence([1, 504, 2988, 314, 476, 38634, 18, 564, 585], 3),
    TrainSequence([1, 504, 2988, 314, 476], 2),
    TrainSequence([1, 9906, 314, 476, 2988, 11], 4),  # 3 prompts over 2 ranks: one pads
]


@pytest.fixture(scope="module")
def engines(ray_cluster):
    pool = EnginePool.start(
        "smollm2-135m",
        1,
        max_model_len=1024,
        cpu_kv_cache_gb=1,
        logprobs_mode="processed_logprobs",
    )
    yield pool
    pool.shutdown()


def _grpo_batch():
    """Two prompt groups of three responses with opposite advantages: PPO-style reuse must
    move the ratio far enough from 1 for the clip to bind."""
    seqs = []
    for k, prompt in enumerate(([1, 504, 2988, 314], [1, 9906, 314, 476, 2988])):
        for j, adv in enumerate((1.0, -1.0, 0.5)):
            seqs.append(TrainSequence(prompt + [585 + j, 18, 564 + k], len(prompt), adv, group=k))
    return seqs


def _gap(engines, learners):
    """|learner - rollout| log-prob of each token the engine samples; every rank agrees."""
    chat = picker_chat("Pick passages.", "Who wrote Hamlet?", [])
    sampling = SamplingConfig(temperature=1.0, max_tokens=16, n=2, seed=1, logprobs=True)
    samples = engines.generate([chat], sampling)[0]
    seqs = [
        TrainSequence(c.prompt_token_ids + c.token_ids, len(c.prompt_token_ids)) for c in samples
    ]
    per_rank = learners.call("logprobs", seqs, 1.0)
    assert per_rank[0] == per_rank[1]
    learner = torch.tensor([x for lp in per_rank[0] for x in lp])
    rollout = torch.tensor([x for c in samples for x in c.logprobs])
    assert learner.numel() == rollout.numel() > 8
    return (learner - rollout).abs()


@pytest.mark.parametrize("zero_stage, lora_rank", [(2, 0), (3, 0), (2, 8)])
def test_zero_data_parallel_learners_train_and_sync(engines, zero_stage, lora_rank):
    """With LoRA (peft adapters), only the adapters train and the engine gets the merged
    weights under the base model's names."""
    cfg = LearnerConfig(
        model="smollm2-135m",
        num_actors=2,
        zero_stage=zero_stage,
        micro_batch_size=2,
        grpo=GRPOConfig(update_epochs=2, mini_batches=2),
        lora_rank=lora_rank,
    )
    learners = LearnerGroup(cfg, lr=1e-3 if lora_rank else 1e-4)
    try:
        before = learners.call("state_checksum")
        first = learners.step("sft_step", SFT)
        after = learners.call("state_checksum")
        assert first["tokens"] == 6 + 3 + 2 and 0 < first["loss"] < 20 and first["grad_norm"] > 0
        assert before[0] == before[1] and after[0] == after[1]  # ranks stay identical
        assert after[0] != before[0]
        for _ in range(3):  # a real descent step: the same batch's loss falls
            last = learners.step("sft_step", SFT)
        assert last["loss"] < first["loss"]

        # Off-policy reuse (2 epochs x 2 mini-batches) at a large lr: the ratio leaves
        # [1 - eps_low, 1 + eps_high] and the clip binds.
        grpo = learners.step("grpo_step", _grpo_batch(), 1.0)
        assert grpo["clip_fraction"] > 0 and grpo["tokens"] == 18
        weights = learners.call("state_checksum")
        assert weights[0] == weights[1]

        # The weights every rank gathered reach the rollout engine: its log-probs become the
        # learner's, up to bf16 kernel noise.
        before_sync = _gap(engines, learners)
        assert engines.load_weights(learners.weight_buckets(64)) > 0
        after_sync = _gap(engines, learners)
        assert after_sync.mean() < 0.1 and before_sync.mean() > 3 * after_sync.mean()
    finally:
        learners.shutdown()


def test_bad_learner_config():
    with pytest.raises(ValueError, match="zero_stage"):
        LearnerConfig(zero_stage=4)
    with pytest.raises(ValueError, match="LoRA is not combined with ZeRO-3"):
        LearnerConfig(zero_stage=3, lora_rank=8)
    with pytest.raises(ValueError, match="update_epochs >= 1"):
        GRPOConfig(update_epochs=0)
