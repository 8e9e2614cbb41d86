"""Real DeepSpeed steps (CPU: gloo, bf16) on the built-in model, data-parallel over two Ray
actors placed by a placement group."""

import pytest

from ctxpick.rl.learner import LearnerConfig, LearnerGroup, TrainSequence

pytestmark = pytest.mark.slow


def test_data_parallel_deepspeed_steps_on_builtin_model(ray_cluster):
    cfg = LearnerConfig(model="smollm2-135m", num_actors=2, zero_stage=1, micro_batch_size=2)
    learners = LearnerGroup(cfg, lr=1e-4)
    seqs = [
        TrainSequence([1, 504, 2988, 314, 476, 38634, 18, 564, 585], 3),
        TrainSequence([1, 504, 2988, 314, 476], 2),
    ]
    before = learners.call("state_checksum")
    first = learners.step("sft_step", seqs)
    after = learners.call("state_checksum")
    assert first["tokens"] == 9 and 0 < first["loss"] < 20 and first["grad_norm"] > 0
    assert before[0] == before[1] and after[0] == after[1]  # ranks stay identical
    assert after[0] != before[0]
    # a few more steps on the same batch drive its loss down: a real descent step
    for _ in range(3):
        last = learners.step("sft_step", seqs)
    assert last["loss"] < first["loss"]
    learners.shutdown()


def test_bad_learner_config():
    with pytest.raises(ValueError, match="zero_stage"):
        LearnerConfig(zero_stage=4)
    with pytest.raises(ValueError, match="LoRA is not combined with ZeRO-3"):
        LearnerConfig(zero_stage=3, lora_rank=8)
