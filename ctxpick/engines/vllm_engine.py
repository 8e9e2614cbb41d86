"""vLLM behind the :class:`~ctxpick.engines.base.Engine` interface, runnable in a Ray actor."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray

from ctxpick.engines.base import Chat, Completion, SamplingConfig
from ctxpick.engines.models import resolve

log = logging.getLogger(__name__)


class VLLMEngine:
    """A vLLM ``LLM`` with prefix caching; prompts are chat-templated here so every caller
    (and the learner) sees the same token ids."""

    def __init__(
        self,
        model: str,
        *,
        max_model_len: int = 8192,
        seed: int = 0,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.85,
        cpu_kv_cache_gb: int = 4,
        enforce_eager: bool = True,
    ) -> None:
        # Must be set before vllm is imported: the KV-cache size on CPU comes from the env.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gb))
        from vllm import LLM

        t0 = time.time()
        self.model_path = resolve(model)
        self.llm = LLM(
            model=self.model_path,
            max_model_len=max_model_len,
            seed=seed,
            dtype=dtype,
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = max_model_len
        self.load_seconds = time.time() - t0
        log.info("vLLM loaded %s in %.1fs", self.model_path, self.load_seconds)

    def ready(self) -> dict[str, Any]:
        return {"model": self.model_path, "load_seconds": self.load_seconds}

    def prompt_ids(self, chat: Chat) -> list[int]:
        text = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def generate(self, chats: list[Chat], sampling: SamplingConfig) -> list[list[Completion]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_tokens,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            logprobs=0 if sampling.logprobs else None,
        )
        prompts = []
        for chat in chats:
            ids = self.prompt_ids(chat)
            if len(ids) + sampling.max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt of {len(ids)} tokens + {sampling.max_tokens} new tokens exceeds "
                    f"max_model_len={self.max_model_len}: lower the pool size or raise it"
                )
            prompts.append(TokensPrompt(prompt_token_ids=ids))
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            [
                Completion(
                    text=c.text,
                    token_ids=list(c.token_ids),
                    prompt_tokens=len(out.prompt_token_ids),
                    finish_reason=c.finish_reason,
                    logprobs=[
                        lp[tid].logprob
                        for tid, lp in zip(c.token_ids, c.logprobs or [], strict=False)
                    ],
                )
                for c in out.outputs
            ]
            for out in outputs
        ]


def start_engine_actor(
    model: str, *, num_cpus: float = 1, num_gpus: float = 0, **engine_kwargs: Any
) -> ray.actor.ActorHandle:
    """Start a :class:`VLLMEngine` in a Ray actor and wait until the model is loaded."""
    env: dict[str, str] = {}
    if num_gpus == 0:
        # In-process engine core (no extra process per actor), and as many OpenMP threads as
        # CPUs the actor holds: Ray would otherwise pin it to one thread.
        env = {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "OMP_NUM_THREADS": str(max(1, int(num_cpus))),
        }
    actor = (
        ray.remote(VLLMEngine)
        .options(num_cpus=num_cpus, num_gpus=num_gpus, runtime_env={"env_vars": env})
        .remote(model, **engine_kwargs)
    )
    ray.get(actor.ready.remote())
    return actor
