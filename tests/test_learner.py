"""A real DeepSpeed optimizer step (CPU: gloo, bf16) on the built-in model, in a Ray actor."""

import pytest
import ray

from ctxpick.rl.learner import Learner, LearnerConfig

pytestmark = pytest.mark.slow


def test_deepspeed_step_on_builtin_model(ray_cluster):
    learner = (
        ray.remote(Learner)
        .options(num_cpus=1)
        .remote(LearnerConfig(model="smollm2-135m", zero_stage=1, micro_batch_size=2, lr=1e-4))
    )
    seqs = [[1, 504, 2988, 314, 476, 38634, 18, 564, 585], [1, 504, 2988, 314, 476]]
    masks = [[0, 0, 0, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    before = ray.get(learner.state_checksum.remote())
    first = ray.get(learner.sft_step.remote(seqs, masks))
    after = ray.get(learner.state_checksum.remote())
    assert first["tokens"] == 9 and 0 < first["loss"] < 20 and first["grad_norm"] > 0
    assert after != before
    # a few more steps on the same batch drive its loss down: the update is a real descent step
    for _ in range(3):
        last = ray.get(learner.sft_step.remote(seqs, masks))
    assert last["loss"] < first["loss"]
    ray.kill(learner)


def test_bad_learner_config():
    with pytest.raises(ValueError, match="zero_stage"):
        LearnerConfig(zero_stage=4)
