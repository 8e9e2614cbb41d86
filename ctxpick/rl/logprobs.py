"""Per-token log-probabilities of a group of responses to one prompt.

Two costs are avoided. The prompt -- most of a picker's tokens -- is run once per group, and
its key/value cache is shared by every response (exact: the same attention, one forward pass
for the prompt instead of G; gradients flow back through the shared cache). And logits are
never materialised as a [batch, tokens, vocab] float32 tensor: hidden states go through the
LM head one chunk of positions at a time, each chunk's logits living only long enough for a
log-softmax, the target's log-prob and the entropy, recomputed in backward (checkpointing).

The LM head is called as a module (not ``hidden @ weight.T``), so under ZeRO-3 its partitioned
weight is gathered by DeepSpeed's hooks on every rank, in forward and in the recompute.
Log-probs are those of the distribution the rollout engine sampled from: logits divided by
the sampling temperature, as vLLM does before sampling.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

# Decoder-only families whose forward is ``lm_head(model(...).last_hidden_state)`` with a
# DynamicCache that can be repeated along the batch: what the shared-prompt pass assumes. Others
# (logit soft-capping, scaled logits, encoder-decoders, GPT-2's ``transformer`` body) would get
# silently wrong log-probs, so they are refused.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def check_supported(model: Any, packed: bool = False) -> None:
    module = getattr(model, "module", model)
    cfg = getattr(module, "config", None)
    kind = getattr(cfg, "model_type", type(module).__name__)
    scaled = [
        k
        for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")
        if getattr(cfg, k, None) not in (None, 1, 1.0)
    ]
    if kind not in SUPPORTED_MODEL_TYPES or scaled or not hasattr(module, "model"):
        raise ValueError(
            f"model type {kind!r} ({type(module).__name__}) is not supported by the learner's "
            f"shared-prompt log-prob pass (supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            f"{'; it scales its logits: ' + ', '.join(scaled) if scaled else ''})"
        )
    # The packed pass hands attention its own 4D mask: the attention kernels that add a mask
    # (sdpa, eager) take it as it is; flash attention's varlen path and sliding windows, which
    # the model would otherwise build into its mask, would silently not see it.
    impl = getattr(cfg, "_attn_implementation", None) or "sdpa"
    sliding = getattr(cfg, "use_sliding_window", kind == "mistral")
    if packed and (impl not in ("sdpa", "eager") or (sliding and cfg.sliding_window)):
        raise ValueError(
            f"rl.learner.packing needs sdpa or eager attention without a sliding window; this "
            f"model has {impl} attention, sliding window {cfg.sliding_window if sliding else None}:"
            " set rl.learner.packing=false"
        )


def _chunk_logprobs(
    hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logp_all = torch.log_softmax(head(hidden).float() / temperature, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


def _packed_tail(
    body: Any, prompt_len: int, responses: torch.Tensor, present: torch.Tensor, cache: Any,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The responses packed into one row after the prompt's cache, with no padding: each
    response attends to the prompt and to its own earlier tokens only (a block-diagonal causal
    mask, additive, as sdpa and eager attention both apply it) at the positions it has
    unpacked. Returns the packed hidden states [T, H] and, for each packed token, its
    (response, offset) index into the padded layout."""
    device, lengths = responses.device, present.sum(1).long()
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    starts = torch.cat([lengths.new_zeros(1), lengths[:-1]]).cumsum(0)
    offsets = torch.arange(len(rows), device=device) - starts[rows]
    seen = rows[:, None] == rows[None, :]
    causal = offsets[None, :] <= offsets[:, None]
    attend = torch.cat([seen.new_ones(len(rows), prompt_len), seen & causal], dim=1)
    additive = torch.zeros(attend.shape, dtype=dtype, device=device)
    additive.masked_fill_(~attend, torch.finfo(dtype).min)
    tail = body(
        input_ids=responses[rows, offsets][None],
        position_ids=(prompt_len + offsets)[None],
        attention_mask=additive[None, None],
        past_key_values=cache,
        use_cache=True,
    )
    return tail.last_hidden_state[0], torch.stack([rows, offsets])


def group_logprobs(
    model: Any,
    prompt: torch.Tensor,
    responses: torch.Tensor,
    present: torch.Tensor,
    chunk: int = 256,
    temperature: float = 1.0,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompt`` [P] and right-padded ``responses`` [G, L], ``present`` [G, L] marking their
    tokens (a prefix of ones in each row): ``logp[g, t] = log p_T(responses[g, t] | prompt,
    responses[g, :t])`` at ``temperature`` T and that distribution's entropy (no gradient),
    both [G, L] float32, 0 past each response. ``packed``: the responses run as one unpadded
    row (:func:`_packed_tail`, checked by :func:`check_supported`) instead of G padded ones:
    the same values, no compute on padding. ``chunk`` positions per row go through the LM
    head at a time (packed: ``chunk`` x G tokens): one call while responses fit in ``chunk``,
    which ZeRO-3 needs (it gathers the head's weight on every rank for each call, and the
    counts must agree across ranks; LearnerGroup.step checks it)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    module = getattr(model, "module", model)
    body = module.model
    g, p = responses.shape[0], prompt.shape[0]
    head = body(input_ids=prompt[None], use_cache=True)
    cache = head.past_key_values
    last = head.last_hidden_state[:, -1:]  # position P-1 predicts every response's token 0
    if packed:
        tail, (rows, offsets) = _packed_tail(body, p, responses, present, cache, last.dtype)
        # Each packed token is predicted by the one before it in its response, the first
        # by the prompt's last position.
        before = torch.cat([last[0], tail[:-1]])
        hidden = torch.where((offsets == 0)[:, None], last[0], before)[None]
        targets, step = responses[rows, offsets][None], chunk * g
    else:
        cache.batch_repeat_interleave(g)
        attn = torch.cat([present.new_ones(g, p), present], dim=1)
        tail = body(
            input_ids=responses, attention_mask=attn, past_key_values=cache, use_cache=True
        ).last_hidden_state
        hidden = torch.cat([last.expand(g, 1, -1), tail[:, :-1]], dim=1)
        targets, step = responses, chunk
    lm_head = module.get_output_embeddings()
    logps, entropies = [], []
    for s in range(0, hidden.shape[1], step):
        h, t = hidden[:, s : s + step], targets[:, s : s + step]
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, h, lm_head, t, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(h, lm_head, t, temperature)
        logps.append(lp)
        entropies.append(ent.detach())
    logp, entropy = torch.cat(logps, dim=1), torch.cat(entropies, dim=1)
    if not packed:
        return logp * present, entropy * present
    # Back into the padded layout the losses read (zeros past each response).
    out = logp.new_zeros(responses.shape).index_put((rows, offsets), logp[0])
    ent = entropy.new_zeros(responses.shape).index_put((rows, offsets), entropy[0])
    return out, ent
