"""Shipping a trained picker (ctxpick/picker/shipped.py): a LoRA stage's final/ becomes one
adapter for its built-in base (a chain of stages joined), pinned by sha256, merged into the base
once, and taken by name by every loader; a picker whose pool an evaluation cannot rank is
refused before any merge. Real LoRA adapters (peft, random B so every delta counts) on the
real SmolLM2-135M base; the registry entry is the one `ctxpick models ship` prints."""

import asyncio
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import load_file

from ctxpick.config import ConfigError, compose, picker_spec
from ctxpick.engines.models import BUILTINS, ModelChecksumError, resolve
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
    yield root, want
    shutil.rmtree(root)  # ~1 GB of weights, which the rest of the suite does not need on disk


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


def _ship(root, name="tiny", **options):
    card = shipped.SHIPPED_DIR / name / shipped.CARD
    card.parent.mkdir(parents=True, exist_ok=True)
    card.write_text("# tiny\n")
    picker, err = shipped.ship(root / "s2", name, BASE, "two stages, for the test", **options)
    assert err == 0.0  # no rank cut asked: exact
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
    assert (picker.folder / "picker.json").read_bytes() == (
        root / "s2" / "picker.json"
    ).read_bytes()
    entry = shipped.pin_entry(picker)
    assert all(d in entry for d in picker.sha256) and '"smollm2-135m"' in entry
    config = json.loads((picker.folder / shipped.ADAPTER_FILES[0]).read_text())
    assert config["r"] == config["lora_alpha"] == 8  # both ranks side by side, scale 1
    assert config["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    # A shipped folder is a chain of its own (its adapter names the base's hub name), so it can
    # be cut again (benchmarks/rank_cut.py); with no cut, to the same tensors.
    hub = BUILTINS[BASE].hf_name
    again = shipped.adapter_chain(picker.folder, BASE)
    assert again == [picker.folder / shipped.ADAPTER]
    shipped_tensors = load_file(picker.folder / shipped.ADAPTER_FILES[1])
    rejoined = safetensors_load(shipped.joined_adapter(again, hub)[0].weights)
    assert rejoined.keys() == shipped_tensors.keys()
    assert all(torch.equal(rejoined[k], shipped_tensors[k]) for k in rejoined)

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
    # A card edit, re-pinned, is no new model: the merge stays and the folder's card follows.
    (picker.folder / shipped.CARD).write_text("# tiny, with its weak spots\n")
    cards = shipped.SHIPPED_FILES.index(shipped.CARD)
    sha = list(picker.sha256)
    sha[cards] = shipped.file_sha256(picker.folder / shipped.CARD)
    shipped.SHIPPED["tiny"] = recarded = replace(picker, sha256=tuple(sha))
    assert shipped.picker_folder("tiny") == folder == str(shipped.prepared_picker_path(recarded))
    assert (shipped.prepared_picker_path(picker) / "model.safetensors").stat().st_mtime_ns == stamp
    assert (Path(folder) / shipped.CARD).read_text() == "# tiny, with its weak spots\n"


def test_a_picker_ships_with_the_decoding_chosen_for_it_and_nothing_else_changed(chain, registry):
    root, _ = chain
    trained = load_spec(root / "s2")[1]
    with pytest.raises(ValueError, match="max_tokens >= 1"):
        _ship(root, max_tokens=0)
    picker = _ship(root, max_tokens=trained.max_tokens + 32, constrained=True)
    assert not trained.constrained
    assert load_spec("tiny")[1] == replace(
        trained, max_tokens=trained.max_tokens + 32, constrained=True
    )
    assert shipped.file_sha256(picker.folder / "picker.json") == picker.sha256[0]


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
        shipped.adapter_chain(stray, BASE)
    with pytest.raises(FileNotFoundError, match="only a LoRA stage's final/"):
        shipped.adapter_chain(registry, BASE)


def test_a_shipped_picker_on_chunks_it_was_not_trained_on_is_refused_before_it_is_merged(
    chain, registry
):
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
    # Its picker.json's chunks are 60 words at most; this evaluation's, 120: no ranking here
    # can show it the passages it learnt to read.
    with pytest.raises(ConfigError, match=r"no ranking.*'max_words': 60.*chunking.max_words=60"):
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


def test_every_shipped_picker_has_the_files_it_pins():
    """What the package holds is what the registry pins, the model card included: a card
    edited without its pin re-recorded would stop every loader of the default picker."""
    assert shipped.DEFAULT_PICKER in shipped.SHIPPED
    for picker in shipped.SHIPPED.values():
        shipped.check_shipped(picker)


def test_a_rank_cut_is_the_best_approximation_of_the_joined_delta():
    """``ctxpick models ship --max-rank``: each weight's delta becomes its best approximation
    of that rank (Eckart-Young), and the error reported is the one made."""
    torch.manual_seed(0)
    a, b = torch.randn(8, 30), torch.randn(20, 8)
    full = b @ a
    (a8, b8), err = shipped._truncated(a, b, 8)
    torch.testing.assert_close(b8 @ a8, full, rtol=1e-4, atol=1e-4)
    assert err < 1e-6
    (a3, b3), err = shipped._truncated(a, b, 3)
    assert a3.shape == (3, 30) and b3.shape == (20, 3)
    sv = torch.linalg.svdvals(full)
    best = float(sv[3:].square().sum().sqrt() / sv.square().sum().sqrt())
    assert err == pytest.approx(best, rel=1e-4)
    assert float((full - b3 @ a3).norm() / full.norm()) == pytest.approx(best, rel=1e-4)
    # More rank than the delta has (8): all of it, zero-padded to the rank asked.
    (a12, b12), err = shipped._truncated(a, b, 12)
    assert a12.shape == (12, 30) and b12.shape == (20, 12) and err < 1e-6
    torch.testing.assert_close(b12 @ a12, full, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="max_rank 0: at least 1"):
        shipped.ship("unused", "name", BASE, max_rank=0)


@pytest.mark.slow
def test_ctxpick_serve_answers_with_the_shipped_picker_by_default_and_it_reads(ray_cluster):
    """`ctxpick serve` with no serve.picker serves the shipped picker. Given bundled sample
    questions ranked into the pool its picker.json names (conf/retrieval/crossenc.yaml), it
    answers in its format and reads them: several distinct sets, not only the ranker's prefix."""
    import socket

    import httpx
    from ray import serve

    from ctxpick.config import SAMPLES_DIR
    from ctxpick.data.loaders import load_examples
    from ctxpick.picker.spec import pool_settings
    from ctxpick.retrieval.chunking import Chunker
    from ctxpick.retrieval.pools import PoolBuilder
    from ctxpick.serve.app import start
    from ctxpick.serve.client import PickerClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The 12 picks go at once, and the replica batches what has arrived: a deadline well past
    # a slow machine's batch.
    cfg = compose(
        ["retrieval=crossenc", f"serve.port={port}", "serve.audit.path=", "serve.timeout_s=600"]
    )
    assert cfg.serve.picker == shipped.DEFAULT_PICKER in shipped.SHIPPED
    spec = load_spec(cfg.serve.picker)[1]
    assert not spec.pool_mismatch(pool_settings(cfg.retrieval.pool, cfg.retrieval.chunking))
    examples = [
        ex
        for name, fmt in [
            ("hotpotqa_distractor_30.jsonl", "hotpotqa"),
            ("2wikimultihopqa_30.jsonl", "2wikimultihopqa"),
            ("musique_30.jsonl", "musique"),
        ]
        for ex in load_examples(SAMPLES_DIR / name, fmt).examples[:4]
    ]
    builder = PoolBuilder(cfg.retrieval.pool)
    pools = [builder.build(c) for c in Chunker(cfg.retrieval.chunking).chunk_all(examples)]
    url = start(cfg.serve, blocking=False)
    try:
        card = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]
        # Past the server's deadline, so a slow batch answers with its deadline fallback instead
        # of the client timing out and resending the pick.
        client = PickerClient(url, timeout_s=cfg.serve.timeout_s + 60)

        async def pick_all():  # at once, as a RAG service's callers do: the replica batches them
            return await asyncio.gather(
                *(
                    client.apick(
                        p.question,
                        [{"id": x.pid, "title": x.title, "text": x.text} for x in p.passages],
                    )
                    for p in pools
                )
            )

        picks = asyncio.run(pick_all())
        kept = _framework_picks(client, pools[0].question, [x.text for x in pools[0].passages])
        client.close()
    finally:
        serve.shutdown()
    assert card["id"] == shipped.DEFAULT_PICKER and card["expected_pool"] == spec.pool, card
    # The LangChain, LlamaIndex and Haystack components keep what the service picks.
    assert kept["langchain"] == kept["llama_index"] == kept["haystack"] == kept["client"], kept
    sets = [tuple(s.indices) for s in picks]
    print(f"shipped picker on {len(pools)} sample questions: {sets}")
    assert not any(s.fallback == "deadline" for s in picks), [s.fallback for s in picks]
    assert sum(s.valid for s in picks) >= len(picks) - 1, [(s.output, s.fallback) for s in picks]
    assert len(set(sets)) >= 4, sets  # not one constant set
    prefixes = [s == tuple(range(len(s))) for s in sets]
    assert sum(prefixes) <= len(sets) - 3, sets  # not only the ranker's top-|S|


def _framework_picks(client, question, texts):
    """The positions each framework component keeps of ``texts``, through ``client``."""
    from haystack import Document as HSDocument
    from langchain_core.documents import Document as LCDocument
    from llama_index.core.schema import NodeWithScore, TextNode

    from ctxpick.serve.integrations.haystack import CtxPickRanker
    from ctxpick.serve.integrations.langchain import CtxPickCompressor
    from ctxpick.serve.integrations.llama_index import CtxPickPostprocessor

    lc = CtxPickCompressor(picker=client).compress_documents(
        [LCDocument(page_content=t, metadata={"n": i}) for i, t in enumerate(texts)], question
    )
    li = CtxPickPostprocessor(picker=client).postprocess_nodes(
        [NodeWithScore(node=TextNode(text=t, id_=str(i))) for i, t in enumerate(texts)],
        query_str=question,
    )
    hs = CtxPickRanker(picker=client).run(
        query=question, documents=[HSDocument(content=t, id=str(i)) for i, t in enumerate(texts)]
    )["documents"]
    return {
        "client": client.pick(question, texts).indices,
        "langchain": [d.metadata["n"] for d in lc],
        "llama_index": [int(n.node.node_id) for n in li],
        "haystack": [int(d.id) for d in hs],
    }
