"""GRPO components against their plain references, in one run on the same inputs:

* rollout workers (vLLM in a Ray actor, as the trainer drives them) vs plain in-process
  ``vllm.LLM.generate`` -- generated tokens/s, same prompts and sampling, timed ``--rollouts``
  times a side, the two sides alternating so that drift in the machine's speed hits both;
* DeepSpeed learner (a Ray actor, GRPO step) vs a plain PyTorch forward/backward/AdamW
  step on the same sequences -- trained tokens/s;
* weight sync (learner -> safetensors buckets -> in-place vLLM reload) as a share of the
  step, and the step-time split.

Prompts are the picker's, on real HotpotQA pools (the bundled sample without ../shared).
Run: .venv/bin/python benchmarks/bench_rl.py [--prompts 8 --group 6 --steps 3 --rollouts 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from common import data_file

from ctxpick.engines.base import SamplingConfig
from ctxpick.picker.examples import truncate_words
from ctxpick.picker.format import picker_chat
from ctxpick.rl.learner import LearnerConfig

if TYPE_CHECKING:
    from vllm import LLM

    from ctxpick.engines.ray_pool import EnginePool

MODEL = "smollm2-135m"
THREADS = 2
DTYPE = LearnerConfig().compute_dtype()  # every side computes in the learner's (rl/learner.py)


def picker_chats(n: int) -> list:
    from ctxpick.data.loaders import load_examples
    from ctxpick.data.schema import Passage
    from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
    from ctxpick.retrieval.pools import PoolBuilder, PoolConfig

    path = data_file("hotpotqa/migres_hotpot_200.jsonl", "hotpotqa_distractor_30.jsonl")
    exs = load_examples(path, "hotpotqa", limit=n).examples
    chunked = Chunker(ChunkingConfig(method="window", window_words=60)).chunk_all(exs)
    builder = PoolBuilder(PoolConfig(k=8))
    chats = []
    for c in chunked:
        pool = builder.build(c)
        shown = [
            Passage(p.pid, 0, 0, 0, truncate_words(p.text, 40), p.title) for p in pool.passages
        ]
        chats.append(picker_chat("Pick the passages needed to answer.", pool.question, shown))
    return chats


def plain_vllm() -> LLM:
    """Plain in-process ``vllm.LLM``: the same engine settings as ctxpick's (CPU: whole
    prefills, 2 GiB KV cache) and the same process layout: the engine core in this process (no
    separate core process) on the same 2 OpenMP threads, as the rollout actor runs it."""
    from vllm import LLM

    from ctxpick.engines.models import resolve

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cpu = {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
    return LLM(
        **cpu,
        gpu_memory_utilization=0.5,
        model=resolve(MODEL),
        max_model_len=4096,
        dtype=DTYPE,
        seed=0,
        enable_prefix_caching=True,
        enforce_eager=True,
        logprobs_mode="processed_logprobs",
    )


def rollouts(
    engines: EnginePool, llm: LLM, chats: list, sampling: SamplingConfig, repeats: int
) -> tuple[dict[str, list[float]], list]:
    """Generated tokens/s of each side over ``repeats`` timed calls a side. Each pair draws the
    same samples on both sides (one seed per pair, turned into each prompt's own seed as the
    rollout worker does), the side that goes first alternates, and every call starts with an
    empty prefix cache, as a rollout after a weight sync does. Returns the rates and ours'
    outputs of the warm-up call (``sampling.seed``)."""
    import ray
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from ctxpick.engines.vllm_engine import chat_prompt_ids, prompt_seeds

    ids = [chat_prompt_ids(llm.get_tokenizer(), c) for c in chats]

    def plain(seed: int) -> Callable[[], list[list[int]]]:
        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                max_tokens=sampling.max_tokens,
                seed=s,
                logprobs=0,
            )
            for s in prompt_seeds(seed, ids)
        ]
        if not llm.reset_prefix_cache():
            raise RuntimeError("plain vLLM kept its prefix cache")
        prompts = [TokensPrompt(prompt_token_ids=x) for x in ids]
        return lambda: [
            list(c.token_ids)
            for o in llm.generate(prompts, params, use_tqdm=False)
            for c in o.outputs
        ]

    def ctxpick(seed: int) -> Callable[[], list[list[int]]]:
        if not all(ray.get([a.reset_prefix_cache.remote() for a in engines.actors])):
            raise RuntimeError("the rollout worker kept its prefix cache")
        batch = replace(sampling, seed=seed)
        return lambda: [c.token_ids for o in engines.generate(chats, batch, len(chats)) for c in o]

    # Each side's call is prepared (cache emptied, seeds drawn) outside its timed window.
    sides = {"ours": ctxpick, "plain": plain}
    outs = engines.generate(chats, sampling, batch_size=len(chats))  # what the learners train on
    warm = {"ours": [c.token_ids for o in outs for c in o], "plain": plain(sampling.seed)()}
    rates: dict[str, list[float]] = {"ours": [], "plain": []}
    same = warm["ours"] == warm["plain"]
    for r in range(repeats):
        tokens = {}
        for side in ("ours", "plain") if r % 2 == 0 else ("plain", "ours"):
            call = sides[side](sampling.seed + 1 + r)
            t0 = time.time()
            tokens[side] = call()
            rates[side].append(sum(map(len, tokens[side])) / (time.time() - t0))
        same = same and tokens["ours"] == tokens["plain"]
    print(
        f"the warm-up and all {repeats} pairs drew the same samples on both sides"
        if same
        else "the two sides drew different samples in at least one pair: not comparable"
    )
    return rates, outs


def ours(chats: list, sampling: SamplingConfig, steps: int, repeats: int) -> dict:
    import ray
    import torch

    from ctxpick.engines.ray_pool import EngineConfig, EnginePool, init_ray
    from ctxpick.rl.learner_group import LearnerGroup
    from ctxpick.rl.rollout import Group, to_sequences

    init_ray(num_cpus=8)
    engines = EnginePool.from_config(
        MODEL,
        EngineConfig(num_cpus_per_actor=THREADS, max_model_len=4096, cpu_kv_cache_gb=2),
        logprobs_mode="processed_logprobs",
        dtype=DTYPE,  # as training's rollout workers (rl/run.py)
    )
    llm = plain_vllm()
    rates, outs = rollouts(engines, llm, chats, sampling, repeats)
    del llm
    gc.collect()  # the plain engine's KV cache, before the learners start

    learners = LearnerGroup(
        LearnerConfig(model=MODEL, num_cpus_per_actor=THREADS, micro_batch_size=8), lr=1e-6
    )
    adv = torch.randn(sum(len(o) for o in outs)).tolist()
    seqs = to_sequences([Group(None, o) for o in outs], adv)  # type: ignore[arg-type]
    learners.step("grpo_step", seqs, sampling.temperature)  # warm-up
    learn, sync = [], []
    for _ in range(steps):
        t0 = time.time()
        learners.step("grpo_step", seqs, sampling.temperature)
        learn.append(time.time() - t0)
        t0 = time.time()
        engines.load_weights(learners.weight_buckets(256))
        sync.append(time.time() - t0)
    engines.shutdown()
    learners.shutdown()
    ray.shutdown()
    trained = sum(len(s.ids) for s in seqs)
    return {
        "seqs": seqs,
        "rates": rates,
        "gen_tokens": sum(len(c.token_ids) for o in outs for c in o),
        "learn_s": min(learn),
        "sync_s": min(sync),
        "trained_tokens": trained,
    }


def plain_torch(seqs: list, steps: int) -> float:
    """Forward/backward/AdamW in the learner's dtype, micro-batches of 8, right-padded, with
    logits only on the response positions (``logits_to_keep``, as TRL computes them)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ctxpick.engines.models import resolve

    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(resolve(MODEL), dtype=getattr(torch, DTYPE))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step() -> None:
        for i in range(0, len(seqs), 8):
            chunk = seqs[i : i + 8]
            # Left-pad prompts, right-pad responses: every response starts at one column, so
            # the last `keep` positions hold all response tokens (TRL's layout).
            plen = max(s.prompt_len for s in chunk)
            rlen = max(len(s.ids) - s.prompt_len for s in chunk)
            ids = torch.zeros(len(chunk), plen + rlen, dtype=torch.long)
            mask = torch.zeros(len(chunk), plen + rlen, dtype=torch.long)
            for j, s in enumerate(chunk):
                start = plen - s.prompt_len
                ids[j, start : start + len(s.ids)] = torch.tensor(s.ids)
                mask[j, start : start + len(s.ids)] = 1
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=rlen + 1).logits
            logits = logits[:, :-1].float()
            target = ids[:, plen:]
            logp = torch.log_softmax(logits, -1).gather(-1, target[..., None]).squeeze(-1)
            (-(logp * mask[:, plen:]).sum() / mask[:, plen:].sum()).backward()
        opt.step()
        opt.zero_grad()

    step()
    times = []
    for _ in range(steps):
        t0 = time.time()
        step()
        times.append(time.time() - t0)
    return min(times)


def _rates(xs: list[float], fmt: str = ".0f") -> str:
    return ", ".join(format(x, fmt) for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=5, help="timed rollouts a side")
    args = ap.parse_args()
    if args.rollouts < 1:
        ap.error("--rollouts must be >= 1")
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    chats = picker_chats(args.prompts)
    sampling = SamplingConfig(temperature=1.0, max_tokens=64, n=args.group, seed=0, logprobs=True)
    r = ours(chats, sampling, args.steps, args.rollouts)
    torch_s = plain_torch(r["seqs"], args.steps)
    ours_tps, ref_tps = (statistics.median(r["rates"][k]) for k in ("ours", "plain"))
    # Pairs run back to back, so a drift of the machine's speed cancels in each pair's ratio.
    pairs = [a / b for a, b in zip(r["rates"]["ours"], r["rates"]["plain"], strict=True)]
    learn_tps, torch_tps = r["trained_tokens"] / r["learn_s"], r["trained_tokens"] / torch_s
    rollout_s = r["gen_tokens"] / ours_tps  # this batch at the median rate
    step_s = rollout_s + r["learn_s"] + r["sync_s"]
    print(f"\n{args.prompts} picker prompts x {args.group} samples, {MODEL}, {THREADS} threads\n")
    print("| component | ours | reference | ratio | target |")
    print("|---|---|---|---|---|")
    rows = [
        (
            "rollout generated tok/s",
            ours_tps,
            ref_tps,
            "plain vLLM generate; ratio: median of the pairs'",
            ">= 0.9x",
            statistics.median(pairs),
        ),
        (
            "learner trained tok/s",
            learn_tps,
            torch_tps,
            "plain PyTorch, response logits",
            ">= 0.8x",
            learn_tps / torch_tps,
        ),
    ]
    for name, a, b, ref, target, ratio in rows:
        print(f"| {name} | {a:.0f} | {b:.0f} ({ref}) | {ratio:.2f}x | {target} |")
    share = r["sync_s"] / step_s
    print(f"| weight sync s / step s | {r['sync_s']:.2f} | {step_s:.2f} | {share:.1%} | <= 10% |")
    print(
        f"\nrollout tok/s in run order, {args.rollouts} calls a side: "
        f"ours {_rates(r['rates']['ours'])}; plain vLLM {_rates(r['rates']['plain'])}; "
        f"ratio per pair {_rates(pairs, '.2f')} (median {statistics.median(pairs):.2f}, "
        f"ratio of the medians {ours_tps / ref_tps:.2f})"
    )
    print(
        f"\nstep split: rollout {rollout_s:.1f}s ({rollout_s / step_s:.0%}), learn "
        f"{r['learn_s']:.1f}s ({r['learn_s'] / step_s:.0%}), sync {r['sync_s']:.2f}s "
        f"({r['sync_s'] / step_s:.0%}); {r['trained_tokens']} trained tokens, "
        f"{r['gen_tokens']} generated"
    )


if __name__ == "__main__":
    main()
