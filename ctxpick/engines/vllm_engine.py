"""vLLM behind the :class:`~ctxpick.engines.base.Engine` interface, runnable in a Ray actor."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import Counter
from typing import Any

import ray

from ctxpick.engines.base import Chat, Completion, LoraAdapter, SamplingConfig
from ctxpick.engines.models import merged_weights, resolve

log = logging.getLogger(__name__)


def chat_prompt_ids(tokenizer: Any, chat: Chat) -> list[int]:
    """The one way a chat becomes prompt token ids (engine and learner alike). Templated as
    text first: the template already holds the special tokens, so encoding adds none."""
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_seeds(seed: int, prompts: list[list[int]]) -> list[int]:
    """One sampling seed per prompt, drawn from the call's ``seed``, the prompt's token ids and
    how many identical prompts precede it in the call. Sharing one seed would give sample k
    of every prompt the same random draws; this way every prompt (a repeated one too) draws
    its own, and a prompt's samples do not depend on the rest of its batch."""
    seen: Counter[tuple[int, ...]] = Counter()
    seeds = []
    for ids in prompts:
        key = tuple(ids)
        digest = hashlib.blake2b(repr((seed, seen[key], key)).encode(), digest_size=8).digest()
        seen[key] += 1
        seeds.append(int.from_bytes(digest, "big") >> 1)  # a non-negative int64
    return seeds


DTYPES = ("auto", "bfloat16", "float16", "float32")


def check_dtype(dtype: str) -> str:
    """``dtype`` if an engine knows it, else a clear error."""
    if dtype not in DTYPES:
        raise ValueError(f"engine dtype {dtype!r}: expected one of {DTYPES}")
    return dtype


def compute_dtype(dtype: str = "auto", gpu: bool | None = None) -> str:
    """The dtype an engine computes in. ``auto``: bf16 on a GPU (``gpu``; by default whether
    this process sees one) or on a CPU with bf16 instructions (AVX512-BF16 or AMX on x86, BF16
    on Arm), float32 on others: without them there is no fast bf16 kernel (torch's bf16 matmul
    ran at 0.57 GFLOP/s on a 2-core AVX2 EPYC, float32 at 52)."""
    if check_dtype(dtype) != "auto":
        return dtype
    import torch

    if torch.cuda.is_available() if gpu is None else gpu:
        return "bfloat16"
    caps = torch.cpu.get_capabilities()
    native = any(caps.get(flag) for flag in ("avx512_bf16", "amx_bf16", "bf16"))
    return "bfloat16" if native else "float32"


def completions(outputs: list[Any], sampling: SamplingConfig) -> list[list[Completion]]:
    """vLLM's ``RequestOutput``s as :class:`Completion` lists. A request vLLM failed
    (finish reason "error": a constrained-decoding grammar that did not compile, a lost KV
    transfer) is an error here, not an empty output that a caller would read as an invalid
    pick, a wrong answer or a zero reward."""
    failed = [o.request_id for o in outputs if any(c.finish_reason == "error" for c in o.outputs)]
    if failed:
        raise RuntimeError(
            f"vLLM failed {len(failed)} of {len(outputs)} requests (finish reason 'error'; "
            f"requests {', '.join(failed[:5])}{', ...' if len(failed) > 5 else ''}): "
            "the engine's log says why"
        )
    return [
        [
            Completion(
                text=c.text,
                token_ids=list(c.token_ids),
                prompt_tokens=len(out.prompt_token_ids),
                prompt_token_ids=list(out.prompt_token_ids) if sampling.logprobs else [],
                finish_reason=c.finish_reason,
                logprobs=[
                    lp[tid].logprob for tid, lp in zip(c.token_ids, c.logprobs or [], strict=False)
                ],
            )
            for c in out.outputs
        ]
        for out in outputs
    ]


class VLLMEngine:
    """A vLLM ``LLM`` with prefix caching; prompts are chat-templated here so every caller
    (and the learner) sees the same token ids."""

    def __init__(
        self,
        model: str,
        *,
        max_model_len: int = 8192,
        seed: int = 0,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.85,
        cpu_kv_cache_gb: int = 4,
        enforce_eager: bool = True,
        logprobs_mode: str = "raw_logprobs",
        weight_transfer: str | None = None,
        max_lora_rank: int = 0,
    ) -> None:
        """``max_lora_rank`` > 0: serve the adapters :meth:`load_adapter` receives through
        vLLM's LoRA support (the base model alone until the first)."""
        # Must be set before vllm is imported: the KV-cache size on CPU comes from the env.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gb))
        # vLLM fails a constrained request whose regex compiles for longer than this, a guard
        # against untrusted patterns (5 s by default). Ours come from output_regex alone, and
        # the picker's over Qwen2.5's vocabulary timed out at 5 s on a 2-core AVX2 CPU: the
        # first picks of a run came back empty, read as invalid picks.
        os.environ.setdefault("VLLM_REGEX_COMPILATION_TIMEOUT_S", "120")
        import torch
        from vllm import LLM

        t0 = time.time()
        self.model_path = resolve(model)
        cpu_only: dict[str, Any] = {}
        if not torch.cuda.is_available():
            # vLLM's CPU runner cannot rewind a seeded request's generator when chunked prefill
            # splits its prompt ("CPU Generator does not use offset"); whole prefills avoid it.
            cpu_only = {
                "enable_chunked_prefill": False,
                "max_num_batched_tokens": max(max_model_len, 8192),
            }
        self.llm = LLM(
            model=self.model_path,
            max_model_len=max_model_len,
            seed=seed,
            dtype=compute_dtype(dtype),
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            # Rollout workers ask for "processed_logprobs": the distribution actually sampled
            # (temperature, constrained-decoding mask), which importance correction needs.
            logprobs_mode=logprobs_mode,
            **cpu_only,
            **_transfer_config(weight_transfer),
            **_lora_config(max_lora_rank),
        )
        self.lora: Any = None  # the LoRARequest of the adapter loaded last
        self.tokenizer = self.llm.get_tokenizer()
        self.max_model_len = max_model_len
        self.load_seconds = time.time() - t0
        log.info("vLLM loaded %s in %.1fs", self.model_path, self.load_seconds)

    def ready(self) -> dict[str, Any]:
        return {"model": self.model_path, "load_seconds": self.load_seconds}

    def prompt_ids(self, chat: Chat) -> list[int]:
        return chat_prompt_ids(self.tokenizer, chat)

    def generate(self, chats: list[Chat], sampling: SamplingConfig) -> list[list[Completion]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import StructuredOutputsParams

        prompts = []
        for chat in chats:
            ids = self.prompt_ids(chat)
            if len(ids) + sampling.max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt of {len(ids)} tokens + {sampling.max_tokens} new tokens exceeds "
                    f"max_model_len={self.max_model_len}: lower the pool size or raise it"
                )
            prompts.append(ids)
        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                seed=seed,
                stop=list(sampling.stop) or None,
                logprobs=0 if sampling.logprobs else None,
                structured_outputs=StructuredOutputsParams(regex=sampling.regex)
                if sampling.regex
                else None,
            )
            for seed in prompt_seeds(sampling.seed, prompts)
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompts],
            params,
            use_tqdm=False,
            lora_request=self.lora,
        )
        return completions(outputs, sampling)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt prefix (stale weights; a benchmark's fair second pass).
        False when vLLM could not: blocks still in use keep the cache (it only logs that)."""
        return self.llm.reset_prefix_cache()

    def load_weights(self, buckets: list[bytes]) -> float:
        """Replace the weights in place with the learner's safetensors ``buckets`` (see
        :meth:`ctxpick.rl.learner.Learner.weight_buckets`); returns the seconds it took.
        Blobs are written to /dev/shm and reloaded from there: tensors cannot be passed as
        ``collective_rpc`` arguments."""
        import shutil
        import tempfile

        t0 = time.time()
        root = "/dev/shm" if os.path.isdir("/dev/shm") else None
        folder = tempfile.mkdtemp(prefix="ctxpick-sync-", dir=root)
        try:
            for i, blob in enumerate(buckets):
                with open(os.path.join(folder, f"model-{i:05d}.safetensors"), "wb") as fh:
                    fh.write(blob)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})
            self.reset_prefix_cache()  # cached KV was computed by the old weights
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return time.time() - t0

    def load_adapter(self, adapter: LoraAdapter) -> float:
        """Serve the base model with ``adapter`` from now on; returns the seconds it took.
        With vLLM's LoRA support the adapter is loaded as such; without it, it is merged into
        the engine's own weights (base + scale * B A, the base read from the model folder,
        which stays in the page cache), so generation runs the plain model's kernels. The
        merge runs in this process: CPU engines, whose vLLM core runs in the actor."""
        t0 = time.time()
        if self.llm.llm_engine.vllm_config.lora_config is None:
            # vLLM's in-place reload, from memory: its CPU kernels repack weights after
            # loading, which a plain copy into the parameters would miss.
            weights = merged_weights(self.model_path, adapter)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            self._load_lora(adapter)
        self.reset_prefix_cache()  # cached KV was computed by the old weights
        return time.time() - t0

    def _load_lora(self, adapter: LoraAdapter) -> None:
        """vLLM loads adapters only from a folder: it is written to tmpfs, loaded in place of
        the previous one (``load_inplace``: vLLM caches adapters by id, and would keep serving
        the old tensors under the same id), and removed once vLLM holds it."""
        import shutil
        import tempfile

        from vllm.lora.request import LoRARequest

        root = "/dev/shm" if os.path.isdir("/dev/shm") else None
        folder = tempfile.mkdtemp(prefix="ctxpick-adapter-", dir=root)
        try:
            adapter.write(folder)
            self.llm.llm_engine.add_lora(LoRARequest("policy", 1, folder, load_inplace=True))
            # Requests name it without load_inplace: one load per sync, not one per batch.
            self.lora = LoRARequest("policy", 1, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # vLLM's weight-transfer control plane (GPU): the learners' trainer engine drives these
    # through ``RayVLLMWeightSyncClient``, whose protocol names them.
    def init_weight_transfer_engine(self, request: Any) -> None:
        self.llm.init_weight_transfer_engine(request)

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, request: Any) -> None:
        self.llm.update_weights(request)

    def finish_weight_update(self) -> None:
        self.llm.finish_weight_update()
        self.reset_prefix_cache()  # cached KV was computed by the old weights


def _transfer_config(backend: str | None) -> dict[str, Any]:
    """vLLM's weight-transfer engine (``nccl`` / ``ipc``) for GPU rollout workers; the object
    store paths reload safetensors buckets (:meth:`VLLMEngine.load_weights`) or a LoRA adapter
    (:meth:`VLLMEngine.load_adapter`) instead."""
    if backend in (None, "object_store", "adapter"):
        return {}
    from vllm.config import WeightTransferConfig

    return {"weight_transfer_config": WeightTransferConfig(backend=backend)}


def _lora_config(max_rank: int) -> dict[str, Any]:
    """vLLM's LoRA support for one adapter of rank <= ``max_rank``, rounded up to a rank
    vLLM accepts."""
    if max_rank <= 0:
        return {}
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    ranks = get_args(MaxLoRARanks)
    fits = [r for r in ranks if r >= max_rank]
    if not fits:
        raise ValueError(f"LoRA rank {max_rank} exceeds vLLM's largest, {ranks[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}


def engine_actor_env(num_cpus: float, num_gpus: float) -> dict[str, str]:
    """Environment of an actor that hosts a vLLM engine."""
    env = {"VLLM_LOGGING_LEVEL": "WARNING"}  # progress lines, not per-load INFO chatter
    if num_gpus == 0:
        # In-process engine core (no extra process per actor), and as many OpenMP threads as
        # CPUs the actor holds: Ray would otherwise pin it to one thread.
        env |= {
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "OMP_NUM_THREADS": str(max(1, int(num_cpus))),
        }
    return env


def start_engine_actor(
    model: str,
    *,
    num_cpus: float = 1,
    num_gpus: float = 0,
    wait: bool = True,
    scheduling_strategy: Any = None,
    **engine_kwargs: Any,
) -> ray.actor.ActorHandle:
    """Start a :class:`VLLMEngine` in a Ray actor (in a placement group's bundle with a
    ``scheduling_strategy``); with ``wait``, return once it is loaded (otherwise the first
    call waits, and other actors can load meanwhile)."""
    actor = (
        ray.remote(VLLMEngine)
        .options(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            scheduling_strategy=scheduling_strategy,
            runtime_env={"env_vars": engine_actor_env(num_cpus, num_gpus)},
        )
        .remote(model, **engine_kwargs)
    )
    if wait:
        ray.get(actor.ready.remote())
    return actor
