"""Shipping a trained picker (ctxpick/picker/shipped.py): a LoRA stage's final/ becomes one
adapter for its built-in base (a chain of stages joined), pinned by sha256, merged into the base
once, and taken by name by every loader; a picker trained on another pool is refused before
any merge. Real LoRA adapters (peft, random B so every delta counts) on the real SmolLM2-135M
base; the registry entry is the one `ctxpick models ship` prints."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from ctxpick.config import ConfigError, compose, picker_spec
from ctxpick.engines.models import ModelChecksumError, resolve
from ctxpick.picker import shipped
from ctxpick.picker.inference import load_spec

BASE = "smollm2-135m"


def _stage(folder, on, seed, targets):
    """A LoRA stage's final/ trained on ``on`` (the base, or an earlier final/): its adapter in
    final/adapter (naming ``on``, as the learner's does) and its merged weights (fp32)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(on, dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    peft = get_peft_model(model, lora)
    peft.save_pretrained(folder / "adapter")
    config = json.loads((folder / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(on)
    (folder / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    merged = peft.merge_and_unload()
    merged.save_pretrained(folder, safe_serialization=True)
    return {k: v.detach().clone() for k, v in merged.state_dict().items()}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Stage 1 on the base, stage 2 on stage 1 (other projections too), and the picker.json
    stage 2 was trained with (the cross-encoder pool of conf/retrieval/crossenc.yaml)."""
    root = tmp_path_factory.mktemp("chain")
    base = resolve(BASE)
    _stage(root / "s1", base, 1, ["q_proj", "v_proj"])
    want = _stage(root / "s2", root / "s1", 2, ["v_proj", "down_proj"])
    picker_spec(compose(["retrieval=crossenc", f"picker.model={BASE}"])).save(root / "s2")
    return root, want


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A package folder and merge cache of this test's own; what it pins in the registry (the
    same dict every module imported) is unpinned after it."""
    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path / "package")
    monkeypatch.setattr(shipped, "cache_dir", lambda: tmp_path / "cache")
    pinned = dict(shipped.SHIPPED)
    yield tmp_path
    shipped.SHIPPED.clear()
    shipped.SHIPPED.update(pinned)


def _ship(root, name="tiny"):
    card = shipped.SHIPPED_DIR / name / shipped.CARD
    card.parent.mkdir(parents=True, exist_ok=True)
    card.write_text("# tiny\n")
    picker = shipped.ship(root / "s2", name, BASE, "two stages, for the test")
    shipped.SHIPPED[name] = picker
    return picker


def test_a_chain_of_stages_ships_as_one_adapter_whose_merge_is_the_chains(chain, registry):
    root, want = chain
    with pytest.raises(FileNotFoundError, match="MODEL_CARD.md"):
        shipped.ship(root / "s2", "tiny", BASE)  # the card is pinned: it comes first
    for bad in (BASE, "../outside"):  # would shadow the base model / write outside the package
        with pytest.raises(ValueError, match="not a built-in alias"):
            shipped.ship(root / "s2", bad, BASE)
    picker = _ship(root)
    entry = shipped.pin_entry(picker)
    assert all(d in entry for d in picker.sha256) and '"smollm2-135m"' in entry
    config = json.loads((picker.folder / shipped.ADAPTER_FILES[0]).read_text())
    assert config["r"] == config["lora_alpha"] == 8  # both ranks side by side, scale 1
    assert config["target_modules"] == ["down_proj", "q_proj", "v_proj"]

    folder, spec = load_spec("tiny")  # by name, as from_pretrained, serve and eval take it
    assert spec == load_spec(root / "s2")[1]
    got = load_file(f"{folder}/model.safetensors")
    assert set(got) == {k for k in want if k != "lm_head.weight"}  # tied to the embeddings
    for name, tensor in want.items():
        if name in got:  # the merge is in the base's bf16: one rounding of the exact sum
            torch.testing.assert_close(
                got[name].float(), tensor.bfloat16().float(), rtol=8e-3, atol=1e-6
            )
    # Prepared once: the next call returns the same folder without merging again.
    stamp = (shipped.prepared_picker_path(picker) / "model.safetensors").stat().st_mtime_ns
    assert shipped.picker_folder("tiny") == folder
    assert (shipped.prepared_picker_path(picker) / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_changed_shipped_file_is_refused(chain, registry):
    picker = _ship(chain[0])
    copy = registry / "copy"
    shutil.copytree(picker.folder, copy)
    weights = copy / shipped.ADAPTER_FILES[1]
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    with pytest.raises(ModelChecksumError, match="adapter_model.safetensors has sha256"):
        shipped.check_shipped(picker, copy)
    shutil.copy(picker.folder / shipped.ADAPTER_FILES[1], weights)
    (copy / shipped.CARD).unlink()
    with pytest.raises(ModelChecksumError, match="MODEL_CARD.md is missing"):
        shipped.check_shipped(picker, copy)
    (picker.folder / "picker.json").write_text("{}")
    with pytest.raises(ModelChecksumError, match="picker.json has sha256"):
        load_spec("tiny")


def test_an_adapter_trained_on_something_else_is_refused(chain, registry):
    root, _ = chain
    stray = registry / "stray"
    shutil.copytree(root / "s1", stray)
    config = json.loads((stray / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(registry)  # neither the base nor a LoRA final/
    (stray / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="neither the base model"):
        shipped.adapter_chain(stray, shipped.Path(resolve(BASE)))
    with pytest.raises(FileNotFoundError, match="only a LoRA stage's final/ ships"):
        shipped.adapter_chain(registry, shipped.Path(resolve(BASE)))


def test_a_shipped_picker_on_another_pool_is_refused_before_it_is_merged(chain, registry):
    from ctxpick.eval.harness import run_eval

    picker = _ship(chain[0])
    cfg = compose(
        [
            "data.path=sample:hotpotqa_distractor_30.jsonl",
            "data.format=hotpotqa",
            "data.limit=2",
            "eval.methods=[picker]",
            "+eval.pickers.shipped=tiny",
            f"output_dir={registry / 'eval'}",
        ]
    )
    with pytest.raises(ConfigError, match=r"another pool.*retriever: 'crossenc' -> 'bm25'"):
        run_eval(cfg)
    assert not shipped.prepared_picker_path(picker).exists()


def test_models_list_names_the_shipped_pickers(chain, registry, capsys):
    from ctxpick.cli import main

    _ship(chain[0])
    main(["models", "list"])
    out = capsys.readouterr().out
    assert "tiny" in out and "picker on smollm2-135m: two stages, for the test" in out
    with pytest.raises(SystemExit, match="unknown model 'nope'"):
        main(["models", "prepare", "nope"])
    with pytest.raises(SystemExit, match="models ship: .*picker.json is missing"):
        main(["models", "ship", str(chain[0]), "--name", "tiny", "--base", BASE])
