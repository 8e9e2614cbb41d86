"""Typed configuration: the schema Hydra configs under ``conf/`` are validated against at
start-up, so an unknown key or a bad value fails before any work starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ctxpick.retrieval.chunking import ChunkingConfig
from ctxpick.retrieval.pools import PoolConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
SAMPLES_DIR = Path(__file__).resolve().parent / "data" / "samples"


class ConfigError(ValueError):
    pass


@dataclass
class DataSource:
    path: str
    format: str = "auto"
    limit: int | None = None

    def resolved_path(self) -> Path:
        """``sample:NAME`` names a file bundled with the package."""
        if self.path.startswith("sample:"):
            return SAMPLES_DIR / self.path.removeprefix("sample:")
        return Path(self.path).expanduser()


@dataclass
class DataConfig:
    name: str = "sample"
    sources: list[DataSource] = field(
        default_factory=lambda: [DataSource("sample:hotpotqa_distractor_30.jsonl", "hotpotqa")]
    )
    strict: bool = False

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("data.sources is empty: name at least one file")
        from ctxpick.data.loaders import FORMATS

        for s in self.sources:
            if s.format != "auto" and s.format not in FORMATS:
                raise ValueError(f"data source {s.path}: unknown format {s.format!r}")
            if s.limit is not None and s.limit <= 0:
                raise ValueError(f"data source {s.path}: limit must be positive")


@dataclass
class EngineConfig:
    num_actors: int = 1
    num_cpus_per_actor: float = 1
    num_gpus_per_actor: float = 0
    max_model_len: int = 8192
    cpu_kv_cache_gb: int = 4
    gpu_memory_utilization: float = 0.85
    batch_size: int = 16  # prompts per engine call, for progress reporting

    def __post_init__(self) -> None:
        if self.num_actors < 1 or self.batch_size < 1 or self.max_model_len < 256:
            raise ValueError("engine needs num_actors >= 1, batch_size >= 1, max_model_len >= 256")


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    engine: EngineConfig = field(default_factory=EngineConfig)


@dataclass
class GeneratorConfig:
    system: str = ""
    max_tokens: int = 32
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.max_tokens <= 0 or self.temperature < 0:
            raise ValueError("generator needs max_tokens > 0 and temperature >= 0")


@dataclass
class RetrievalConfig:
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)


@dataclass
class MiningConfig:
    pool: PoolConfig = field(default_factory=lambda: PoolConfig(query="question_answer"))


@dataclass
class StageConfig:
    name: str = "stage1"
    # Redundancy margin: how many passages beyond |S_gold| a selection may hold before it earns
    # no reward (paper: loose in Stage I, tight in Stage II).
    redundancy_margin: int = 3
    gamma: float = 0.5
    group_size: int = 8
    lr: float = 1e-6
    max_steps: int = 100
    patience: int = 5
    init_from: str | None = None

    def __post_init__(self) -> None:
        if self.redundancy_margin < 0:
            raise ValueError("stage.redundancy_margin must be >= 0")
        if not 0 <= self.gamma <= 1:
            raise ValueError("stage.gamma must be in [0, 1]")
        if self.group_size < 2:
            raise ValueError("stage.group_size must be >= 2 (GRPO normalises within a group)")
        if self.lr <= 0 or self.max_steps <= 0 or self.patience <= 0:
            raise ValueError("stage needs lr > 0, max_steps > 0, patience > 0")


@dataclass
class RayConfig:
    address: str | None = None  # None: start a local cluster
    num_cpus: int | None = None


@dataclass
class WandbConfig:
    mode: str = "offline"
    project: str = "ctxpick"

    def __post_init__(self) -> None:
        if self.mode not in ("offline", "online", "disabled"):
            raise ValueError(f"wandb.mode must be offline, online or disabled, not {self.mode!r}")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    mining: MiningConfig = field(default_factory=MiningConfig)
    stage: StageConfig = field(default_factory=StageConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    seed: int = 0
    output_dir: str = "outputs/run"


def validate(cfg: DictConfig | dict[str, Any]) -> Config:
    """Check ``cfg`` against :class:`Config`: unknown keys, wrong types and bad values all raise
    :class:`ConfigError` naming the key."""
    raw = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"]) if "hydra" in raw else raw
    try:
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw)
    except OmegaConfBaseException as err:
        raise ConfigError(f"invalid config: {err}") from None
    # Instantiate section by section so a failed value check names its section.
    for name in merged:
        try:
            OmegaConf.to_object(merged[name]) if OmegaConf.is_config(merged[name]) else None
        except (OmegaConfBaseException, ValueError) as err:
            raise ConfigError(f"invalid config in '{name}': {err}") from None
    return OmegaConf.to_object(merged)


def compose(overrides: list[str] | None = None, config_name: str = "config") -> Config:
    """Compose ``conf/`` with Hydra overrides outside a Hydra app (library use, tests)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return validate(hydra_compose(config_name=config_name, overrides=overrides or []))
