"""A trained picker records the pool it learnt to read, and the floors below ``config``
never import it (issue 18, section 6)."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys

import pytest
from conftest import REPO

# The floors under config (serve/eval -> rl -> rewards -> picker -> data, and what they use).
LOWER_FLOORS = ("data", "retrieval", "engines", "judge", "picker", "rewards")


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


@pytest.mark.parametrize("floor", LOWER_FLOORS)
def test_lower_floors_never_import_config(floor):
    """Not even inside a function: such an import is what closed the circle
    config -> eval/methods -> picker/inference -> config."""
    offenders = [
        str(p.relative_to(REPO))
        for p in (REPO / "ctxpick" / floor).rglob("*.py")
        if "ctxpick.config" in set(_imports(p))
    ]
    assert not offenders


def test_a_builtin_picker_resolves_without_the_config():
    """A built-in base model's prompt comes from conf/picker, read without ctxpick.config."""
    code = (
        "import sys\n"
        "from ctxpick.picker.inference import resolve_picker\n"
        "folder, spec = resolve_picker('smollm2-135m')\n"
        "assert spec is not None and spec.pool is None, spec\n"
        "print(sorted(m for m in sys.modules if m.startswith('ctxpick.config')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "[]"


def test_the_builtin_prompt_is_the_configured_one():
    from ctxpick.config import compose, picker_spec
    from ctxpick.picker.spec import PickerSpec

    for alias in ("smollm2-135m", "qwen2.5-coder-0.5b"):
        configured = picker_spec(compose([f"picker={alias}"]))
        assert PickerSpec.builtin(alias) == dataclasses.replace(configured, pool=None)


def test_picker_json_records_its_pool_and_a_mismatch_is_named(tmp_path):
    from ctxpick.config import compose, inference_pool, picker_spec
    from ctxpick.picker.spec import PickerSpec

    dense = compose(["retrieval.pool.retriever=dense", "mining.pool.retriever=dense"])
    spec = picker_spec(dense)
    spec.save(tmp_path)
    saved = json.loads((tmp_path / "picker.json").read_text())["pool"]
    assert saved["retriever"] == "dense" and saved["embedder"] == "all-minilm-l6-v2"
    assert saved["order"] == "pool" and saved["chunking"]["method"] == "semantic"
    loaded = PickerSpec.load(tmp_path)
    assert loaded == spec and loaded.pool_mismatch(inference_pool(dense)) == []
    # Another k is not another order: the picker reads only its first max_passages.
    assert spec.pool_mismatch(inference_pool(compose(["retrieval.pool.k=30", *_dense()]))) == []
    bm25 = inference_pool(compose([]))
    assert spec.pool_mismatch(bm25) == [
        "retriever: 'dense' -> 'bm25'",
        "embedder: 'all-minilm-l6-v2' -> None",
    ]
    chunked = inference_pool(compose([*_dense(), "retrieval.chunking.max_words=30"]))
    assert [m.split(":")[0] for m in spec.pool_mismatch(chunked)] == ["chunking"]
    # Trained on shuffled pools: the order is not read, the passages' cut still is.
    shuffled = picker_spec(compose(["rl.pool_order=shuffle", "mining.pool.query=question_answer"]))
    assert shuffled.pool_mismatch(inference_pool(dense)) == []
    assert shuffled.pool_mismatch(chunked) != []
    # A picker.json from before pools were recorded still loads, and checks nothing.
    legacy = {k: v for k, v in dataclasses.asdict(spec).items() if k != "pool"}
    (tmp_path / "picker.json").write_text(json.dumps(legacy))
    assert PickerSpec.load(tmp_path).pool is None
    assert PickerSpec.load(tmp_path).pool_mismatch(bm25) == []


def _dense():
    return ["retrieval.pool.retriever=dense", "mining.pool.retriever=dense"]
