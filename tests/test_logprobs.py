"""The learner's shared-prompt log-prob pass against a plain per-sample forward, in float32, on
real transformers models (small random configs of the supported families)."""

import pytest
import torch
from conftest import TINY_DECODER
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    Qwen2Config,
)

from ctxpick.rl.logprobs import check_supported, group_logprobs


def _model(config, attn="sdpa"):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).float().eval()


def _plain(model, prompt, responses, mask, temperature):
    """One full forward per sample: the reference the shared-prompt pass must equal."""
    rows = []
    for g in range(responses.shape[0]):
        n = int(mask[g].sum())
        ids = torch.cat([prompt, responses[g, :n]])[None]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
        lp = torch.log_softmax(logits, -1).gather(-1, responses[g, :n, None]).squeeze(-1)
        rows.append(torch.nn.functional.pad(lp, (0, responses.shape[1] - n)))
    return torch.stack(rows)


@pytest.mark.parametrize("config", [LlamaConfig(**TINY_DECODER), Qwen2Config(**TINY_DECODER)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("packed,attn", [(False, "sdpa"), (True, "sdpa"), (True, "eager")], ids=str)
def test_shared_prompt_logprobs_and_gradients_equal_a_plain_forward(
    config, temperature, packed, attn
):
    """Padded or packed (rl.learner.packing: the responses in one row, no padding; its mask
    is additive, as both sdpa and eager attention apply it), the pass gives a plain forward's
    log-probs and gradients, so the token-mean loss is unchanged; LM-head chunks (4 positions
    per row) split responses and packed rows alike."""
    model = _model(config, attn)
    check_supported(model, packed)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 97, (23,), generator=g)
    responses = torch.randint(0, 97, (4, 9), generator=g)
    mask = torch.ones(4, 9)
    mask[1, 6:] = 0  # right-padded responses of different lengths
    mask[3, 2:] = 0
    weights = torch.randn(4, 9, generator=g)

    shared, entropy = group_logprobs(
        model, prompt, responses, mask, chunk=4, temperature=temperature, packed=packed
    )
    assert not shared.mul(1 - mask).any() and not entropy.mul(1 - mask).any()
    (shared * weights * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    plain = _plain(model, prompt, responses, mask, temperature)
    (plain * weights * mask).sum().backward()

    assert (shared - plain).mul(mask).abs().max() < 1.5e-5
    for name, p in model.named_parameters():
        rel = (grads[name] - p.grad).norm() / p.grad.norm().clamp_min(1e-12)
        assert rel < 4e-6, (name, float(rel))


def test_temperature_changes_logprobs_as_vllm_samples_them():
    model = _model(LlamaConfig(**TINY_DECODER))
    prompt, responses = torch.arange(10), torch.arange(10, 16)[None]
    mask = torch.ones(1, 6)
    with torch.no_grad():
        at1, _ = group_logprobs(model, prompt, responses, mask, temperature=1.0)
        at07, _ = group_logprobs(model, prompt, responses, mask, temperature=0.7)
        ref = _plain(model, prompt, responses, mask, 0.7)
    assert not torch.allclose(at1, at07)
    assert torch.allclose(at07, ref, atol=1.5e-5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        group_logprobs(model, prompt, responses, mask, temperature=0.0)


def test_unsupported_model_classes_are_refused():
    check_supported(_model(LlamaConfig(**TINY_DECODER)))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=97))
    with pytest.raises(ValueError, match="model type 'gpt2'.*not supported"):
        check_supported(gpt2)
    scaled = _model(LlamaConfig(**TINY_DECODER))
    scaled.config.logits_scaling = 2.0
    with pytest.raises(ValueError, match="scales its logits: logits_scaling"):
        check_supported(scaled)


def test_packing_is_refused_where_the_model_would_build_its_own_mask():
    """Flash attention's varlen path and sliding windows would not see the packed mask."""
    from transformers import MistralConfig

    windowed = _model(MistralConfig(**TINY_DECODER, sliding_window=16))
    check_supported(windowed)  # padded: the model's own mask has the window
    with pytest.raises(ValueError, match="packing needs sdpa or eager attention"):
        check_supported(windowed, packed=True)
    flash = _model(LlamaConfig(**TINY_DECODER))
    flash.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2 attention"):
        check_supported(flash, packed=True)


def test_a_padding_micro_batch_runs_the_same_passes_and_learns_nothing():
    """Ranks short of micro-batches run zero-weight copies (DeepSpeed's collectives need the
    same passes on every rank): packed, a copy still runs its tokens, with a zero loss mask."""
    from ctxpick.rl.batching import MicroBatch, TrainSequence, collate

    model = _model(LlamaConfig(**TINY_DECODER))
    seqs = [TrainSequence(list(range(12)) + [20 + i] * (i + 1), 12) for i in range(3)]
    for padding in (False, True):
        batch = collate(MicroBatch(seqs, padding=padding), "cpu")
        logp, _ = group_logprobs(
            model, batch["prompt"], batch["ids"], batch["present"], packed=True
        )
        there = batch["present"].bool()
        assert logp[there].ne(0).all() and logp[~there].eq(0).all()
        assert batch["mask"].sum() == (0 if padding else 6)
