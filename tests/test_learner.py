"""Real DeepSpeed steps (CPU: gloo; bf16, or float32 on a CPU without bf16 instructions) on the
built-in model, data-parallel over two Ray actors placed by a placement group, under ZeRO-2 and
ZeRO-3."""

from itertools import accumulate

import pytest
import ray
import torch
from conftest import TINY_DECODER

from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.picker.format import picker_chat
from ctxpick.rl.batching import TrainSequence, plan_updates
from ctxpick.rl.grpo import GRPOConfig
from ctxpick.rl.learner import Learner, LearnerConfig
from ctxpick.rl.learner_group import LearnerGroup

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
        dtype=LearnerConfig().compute_dtype(),  # as training's rollout workers (rl/run.py)
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
        last = learners.step("sft_step", SFT)  # a real descent step: the batch's loss falls
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
    with pytest.raises(ValueError, match="rl.learner.dtype 'float16'"):
        LearnerConfig(dtype="float16")


@ray.remote(num_cpus=1, max_calls=1)  # DeepSpeed joins torch.distributed: a worker used once
def _optimizer_trace(
    model_dir: str, zero_stage: int, dtype: str
) -> tuple[list[tuple[bool, int, bool]], list[float]]:
    """GRPO steps on 3 prompt groups in 2 mini-batches: at every micro-step, whether DeepSpeed
    sees an accumulation boundary, its optimizer-step count after it, and whether the weights
    moved; and each rollout batch's gradient norm."""
    grpo = GRPOConfig(mini_batches=2)
    cfg = LearnerConfig(
        model=model_dir, micro_batch_size=2, zero_stage=zero_stage, grpo=grpo, dtype=dtype
    )
    learner = Learner(cfg, lr=1e-2)
    learner.setup(*learner.address())
    engine, trace = learner.engine, []
    step = engine.step

    def recorded_step(*args, **kwargs):
        boundary, before = engine.is_gradient_accumulation_boundary(), learner.state_checksum()
        step(*args, **kwargs)
        trace.append((boundary, engine.global_steps, learner.state_checksum() != before))

    engine.step = recorded_step
    seqs = [
        TrainSequence([1, 5 + k, 9, 20 + j, 30 + k, 40], 3, advantage=(1.0, -1.0, 0.5)[j], group=k)
        for k in range(3)
        for j in range(3)
    ]
    [plan], tokens = plan_updates(seqs, cfg.micro_batch_size, 1, grpo.mini_batches)
    norms = [learner.grpo_step(plan, tokens, 1.0)["grad_norm"] for _ in range(2)]  # 2 batches
    return trace, norms


# float32 at stage 0: the one case where the learner takes the gradient norm itself.
@pytest.mark.parametrize("zero_stage, dtype", [(0, "float32"), (0, "bfloat16"), (2, "auto")])
def test_the_optimizer_steps_exactly_at_the_end_of_each_mini_batch(
    ray_cluster, tmp_path, zero_stage, dtype
):
    """Uneven mini-batches (1 and 2 prompt groups of 3 responses: 2 and 4 micro-batches of 2)
    over two rollout batches: one optimizer step at the last micro-batch of each mini-batch
    and none elsewhere, so no gradient crosses a mini-batch or a rollout batch."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY_DECODER)).save_pretrained(tmp_path)
    trace, norms = ray.get(_optimizer_trace.remote(str(tmp_path), zero_stage, dtype))
    mini_batches = [2, 4, 2, 4]
    ends = [i == n - 1 for n in mini_batches for i in range(n)]
    assert [boundary for boundary, _, _ in trace] == ends
    assert [moved for _, _, moved in trace] == ends
    assert [steps for _, steps, _ in trace] == list(accumulate(ends))  # optimizer steps so far
    # The last update's gradient norm, in either dtype (float32 at stage 0: taken by the learner).
    assert all(0 < norm < float("inf") for norm in norms), norms


@ray.remote(num_cpus=1, max_calls=1)  # a fresh process: the op is not loaded in it yet
def _start_learner(model_dir: str) -> float:
    learner = Learner(LearnerConfig(model=model_dir), lr=1e-3)
    learner.setup(*learner.address())
    return learner.state_checksum()


# A learner killed while it loads DeepSpeed's op: torch's build has taken its lock file.
KILLED_LOADING = """
import os, signal
from deepspeed.ops.op_builder.builder import OpBuilder
from torch.utils.file_baton import FileBaton
from ctxpick.rl.deepspeed_ops import build_lock, load_shm_op

def killed_holding_the_lock(self, verbose=False):
    assert FileBaton(str(build_lock())).try_acquire()
    os.kill(os.getpid(), signal.SIGKILL)

OpBuilder.load = killed_holding_the_lock
load_shm_op()
"""


def test_a_learner_starts_where_one_killed_while_loading_its_op_left_the_build_lock(
    ray_cluster, tmp_path
):
    """torch builds DeepSpeed's CPU communication op under a lock file that its holder removes
    when done. A learner killed while loading it left the file, and every later learner on the
    node waited for it forever: a CI run hung for 80 minutes. A new learner removes it at once
    and starts."""
    import os
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM, LlamaConfig

    from ctxpick.rl.deepspeed_ops import STALE_AFTER_S, build_lock

    lock = build_lock()
    if lock is None:
        pytest.skip("this accelerator builds no communication op")
    lock.unlink(missing_ok=True)  # one an earlier run left: the child must be the one to take it
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    # A child that blocks instead of dying fails here, not at the suite's timeout.
    child = subprocess.run(
        [sys.executable, "-c", KILLED_LOADING], env=env, check=False, timeout=STALE_AFTER_S
    )
    assert child.returncode == -9 and lock.exists()
    AutoModelForCausalLM.from_config(LlamaConfig(**TINY_DECODER)).save_pretrained(tmp_path)
    started, finished = _start_learner.remote(str(tmp_path)), []
    try:
        # Short of STALE_AFTER_S, the wait a lock of unknown origin gets: only the mark
        # removes it in time.
        finished, _ = ray.wait([started], timeout=STALE_AFTER_S - 100)
        assert finished, "the learner still waits on the lock its killed predecessor left"
        assert ray.get(started) != 0
        assert not lock.exists()
    finally:  # a regression must not leave the lock to the suite's later learners
        # Only a task still waiting: force-cancelling one that had just returned crashed the
        # driver in Ray 2.60 (CI on 2151c78: task_manager.cc "Tried to complete task that was
        # not pending"), which ended pytest with exit code 1 and no report. The cancel is
        # asynchronous: the lock goes once the learner is gone, or it could take it again.
        if not finished:
            ray.cancel(started, force=True)
            ray.wait([started], timeout=60)
        lock.unlink(missing_ok=True)
