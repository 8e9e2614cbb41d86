"""Real vLLM (CPU here, the same code on GPU) through a Ray actor, and how its outputs are
read."""

import pytest
import ray
from conftest import SAMPLES

from ctxpick.data.loaders import load_examples
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.prompts import answer_chat
from ctxpick.engines.ray_pool import EnginePool
from ctxpick.engines.vllm_engine import completions
from ctxpick.retrieval.chunking import Chunker, ChunkingConfig
from ctxpick.retrieval.pools import PoolBuilder, PoolConfig

slow = pytest.mark.slow


@slow
def test_generation_through_ray_actor(engine_actor):
    exs = load_examples(SAMPLES / "hotpotqa_distractor_30.jsonl", limit=3).examples
    items = Chunker(ChunkingConfig(method="none")).chunk_all(exs)
    chats = [
        answer_chat(e.question, PoolBuilder(PoolConfig(k=5)).build(i).passages)
        for e, i in zip(exs, items, strict=True)
    ]
    greedy = SamplingConfig(max_tokens=16, temperature=0.0)
    out = EnginePool([engine_actor]).generate(chats, greedy, batch_size=2)
    assert len(out) == 3 and all(len(c) == 1 for c in out)
    assert all(c[0].text.strip() and 0 < len(c[0].token_ids) <= 16 for c in out)
    assert all(c[0].prompt_tokens > 200 for c in out)
    # Greedy decoding is deterministic for the same batches and the same prefill. Not across
    # batch make-ups (CPU kernels block a batch of 2 and of 1 differently), nor against a
    # cached prefix: a prompt whose prefix is cached prefills only its tail, in other matmul
    # shapes that round differently. Either flips near-ties (seen in CI on 2026-12-04).
    assert ray.get(engine_actor.reset_prefix_cache.remote())
    again = EnginePool([engine_actor]).generate(chats, greedy, batch_size=2)
    assert [c[0].token_ids for c in again] == [c[0].token_ids for c in out]


@slow
def test_group_sampling_returns_logprobs(engine_actor):
    chat = [{"role": "user", "content": "Name a colour."}]
    out = ray.get(
        engine_actor.generate.remote(
            [chat], SamplingConfig(n=4, temperature=1.0, max_tokens=8, logprobs=True, seed=1)
        )
    )
    group = out[0]
    assert len(group) == 4
    for c in group:
        assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)


@slow
def test_prompt_too_long_is_a_clear_error(engine_actor):
    chat = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(ray.exceptions.RayTaskError, match="exceeds max_model_len"):
        ray.get(engine_actor.generate.remote([chat], SamplingConfig(max_tokens=8)))


def test_a_request_vllm_failed_is_an_error_not_an_empty_output():
    """vLLM ends a request it could not run (a constrained-decoding grammar that did not
    compile in time, seen on a slow CPU) with finish reason "error" and no text: read as is,
    that is an invalid pick, sent as the fallback. It is raised instead, naming the request;
    the other finish reasons are read as outputs."""
    from vllm.outputs import CompletionOutput, RequestOutput

    def request(rid, reason, text):
        tokens = [7] * len(text.split())
        out = CompletionOutput(0, text, tokens, None, None, finish_reason=reason)
        return RequestOutput(rid, None, [1, 2, 3], None, [out], finished=True)

    ok = [request("0", "stop", "<ids>[1]</ids>"), request("1", "length", "<ids>[1, 2")]
    read = completions(ok, SamplingConfig())
    assert [(c[0].text, c[0].finish_reason, c[0].prompt_tokens) for c in read] == [
        ("<ids>[1]</ids>", "stop", 3),
        ("<ids>[1, 2", "length", 3),
    ]
    with pytest.raises(RuntimeError, match=r"failed 1 of 3 requests .*requests 9-ab"):
        completions([*ok, request("9-ab", "error", "")], SamplingConfig())


def test_auto_dtype_is_bf16_only_where_the_hardware_has_bf16_instructions(monkeypatch):
    """Without them (a CPU with AVX2 alone), there is no fast bf16 kernel: `auto` computes in
    float32 there, bf16 on a GPU (this process's, or a pool's GPU actors) or with
    AVX512-BF16 / AMX / Arm BF16; a dtype asked for by name is kept, an unknown one refused."""
    import torch

    from ctxpick.engines.ray_pool import EngineConfig
    from ctxpick.engines.vllm_engine import compute_dtype

    x86 = {"avx512_f": True, "avx512_bf16": False, "amx_bf16": False}
    for caps, cuda, want in [
        ({**x86, "avx512_bf16": True}, False, "bfloat16"),
        ({**x86, "amx_bf16": True}, False, "bfloat16"),
        ({"bf16": True}, False, "bfloat16"),
        (x86, False, "float32"),  # AVX-512 without its bf16 instructions
        ({"avx2": True}, False, "float32"),
        ({"avx2": True}, True, "bfloat16"),
    ]:
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda c=caps: c)
        monkeypatch.setattr(torch.cuda, "is_available", lambda c=cuda: c)
        assert compute_dtype() == compute_dtype("auto") == want
        assert compute_dtype("bfloat16") == "bfloat16" and compute_dtype("float32") == "float32"
    # A pool of GPU actors runs in bf16 whatever the driver's CPU has.
    assert EngineConfig(num_gpus_per_actor=1).compute_dtype() == "bfloat16"
    assert EngineConfig(num_gpus_per_actor=0).compute_dtype() == "float32"
    with pytest.raises(ValueError, match="engine dtype 'fp8'"):
        compute_dtype("fp8")
