"""Choice of weight transfer, and the parameter stream vLLM's GPU transfer engines read."""

import pytest
import torch
from conftest import TINY_DECODER
from transformers import AutoModelForCausalLM, LlamaConfig

from ctxpick.config import ConfigError, compose
from ctxpick.rl.lora import apply_lora
from ctxpick.rl.weight_sync import GatheredSource, resolve_mode


def test_transfer_mode_follows_the_placement():
    assert resolve_mode("auto", 0, 0) == "object_store"  # CPU
    assert resolve_mode("auto", 1, 1) == "nccl"  # learners and engines on their own GPUs
    assert resolve_mode("auto", 0.5, 0.4) == "ipc"  # colocated on one GPU
    assert resolve_mode("object_store", 1, 1) == "object_store"
    with pytest.raises(ValueError, match="needs CUDA learners and rollout workers"):
        resolve_mode("nccl", 0, 0)
    with pytest.raises(ConfigError, match="rl.weight_transfer must be one of"):
        compose(["rl.weight_transfer=carrier-pigeon"])


def test_weight_source_streams_full_merged_weights_under_hf_names():
    """What a vLLM trainer engine broadcasts: metadata and iteration agree element for
    element (vLLM sizes its receive buffers from the one and sends the other), under the
    names of the model's own state dict, LoRA merged."""
    torch.manual_seed(0)
    config = LlamaConfig(**TINY_DECODER)
    plain = AutoModelForCausalLM.from_config(config)
    names = [n for n, _ in plain.named_parameters()]
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(plain.state_dict())
    apply_lora(model, rank=2, alpha=4.0, targets=["q_proj"])
    lora = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        lora.lora_B["default"].weight.normal_()
    source = GatheredSource(model, zero_stage=0).source()
    meta = source.metadata()
    pairs = list(source)
    assert [m.name for m in meta] == [n for n, _ in pairs] == names
    assert all(
        m.shape == tuple(t.shape) and m.dtype == t.dtype
        for m, (_, t) in zip(meta, pairs, strict=True)
    )
    q = dict(pairs)["model.layers.0.self_attn.q_proj.weight"]
    delta = (4.0 / 2) * lora.lora_B["default"].weight @ lora.lora_A["default"].weight
    assert torch.allclose(q, lora.base_layer.weight + delta)
    assert not torch.allclose(q, plain.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    assert len(list(source)) == len(meta)  # re-iterable: one fresh pass per sync
