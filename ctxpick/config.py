"""Typed configuration: the schema Hydra configs under ``conf/`` are validated against at
start-up, so an unknown key or a bad value fails before any work starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ctxpick.engines.http_engine import HTTPEngineConfig
from ctxpick.engines.ray_pool import EngineConfig
from ctxpick.judge.judges import JudgeConfig
from ctxpick.mining.rewrites import DEFAULT_REWRITE_SYSTEM
from ctxpick.paths import CONF_DIR, SAMPLES_DIR
from ctxpick.picker.examples import check_rationale
from ctxpick.picker.format import FORMATS
from ctxpick.picker.spec import PickerSpec, pool_settings
from ctxpick.retrieval.chunking import ChunkingConfig
from ctxpick.retrieval.pools import PoolConfig
from ctxpick.rewards.reward import EQ8_READINGS, RewardSpec
from ctxpick.rl.learner import LearnerConfig
from ctxpick.serve.settings import ServeConfig


class ConfigError(ValueError):
    pass


@dataclass
class DataSource:
    path: str
    format: str = "auto"
    limit: int | None = None
    offset: int = 0  # skip this many questions first (e.g. evaluate on ones not mined)

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
    # Shorthand for one file: `data.path=FILE data.format=NAME data.limit=N` replaces sources.
    path: str | None = None
    format: str = "auto"
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.path:
            self.sources = [DataSource(self.path, self.format, self.limit)]
            self.name = Path(self.path).stem
        if not self.sources:
            raise ValueError("data.sources is empty: name at least one file")
        from ctxpick.data.loaders import FORMATS

        for s in self.sources:
            if s.format != "auto" and s.format not in FORMATS:
                raise ValueError(f"data source {s.path}: unknown format {s.format!r}")
            if s.limit is not None and s.limit <= 0:
                raise ValueError(f"data source {s.path}: limit must be positive")


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    backend: str = "vllm"  # vllm: engines in Ray actors; http: an OpenAI-compatible endpoint
    engine: EngineConfig = field(default_factory=EngineConfig)
    http: HTTPEngineConfig = field(default_factory=HTTPEngineConfig)

    def __post_init__(self) -> None:
        if self.backend not in ("vllm", "http"):
            raise ValueError(f"model.backend must be vllm or http, not {self.backend!r}")


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
class RewriteConfig:
    k: int = 5
    temperature: float = 0.7
    system: str = DEFAULT_REWRITE_SYSTEM

    def __post_init__(self) -> None:
        if self.k < 0 or self.temperature < 0:
            raise ValueError("rewrites need k >= 0 and temperature >= 0")


@dataclass
class MiningConfig:
    pool: PoolConfig = field(default_factory=PoolConfig)  # ranked as inference's (retrieval.pool)
    # fast | reference (the paper's Algorithm 1) | human (no model: the dataset's own evidence
    # in the pool is the set; a warm start on every training question costs nothing to mine)
    miner: str = "fast"
    max_questions: int | None = None  # mine a subset: this many questions, datasets in turn
    examples_per_task: int = 1  # examples per actor call: what a dead actor's replacement redoes
    rewrites: RewriteConfig = field(default_factory=RewriteConfig)
    split_ratios: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])

    def __post_init__(self) -> None:
        if self.miner not in ("fast", "reference", "human"):
            raise ValueError(f"mining.miner must be fast, reference or human, not {self.miner!r}")
        if self.max_questions is not None and self.max_questions < 1:
            raise ValueError("mining.max_questions must be >= 1 (or null: all)")
        if self.examples_per_task < 1:
            raise ValueError("mining.examples_per_task must be >= 1")
        r = self.split_ratios
        if len(r) != 3 or min(r) < 0 or abs(sum(r) - 1) > 1e-6:
            raise ValueError(
                f"mining.split_ratios must be 3 non-negative numbers summing to 1: {r}"
            )


@dataclass
class StageConfig:
    name: str = "stage1"
    # grpo: the paper's RL stages. sft: an explicit, optional warm start on the mined sets for
    # small models that cannot yet produce the output format (see README); off for large models.
    kind: str = "grpo"
    # Redundancy margin: how many passages beyond |S_gold| a selection may hold before it earns
    # no reward (paper: loose in Stage I, tight in Stage II).
    redundancy_margin: int = 3
    gamma: float = 0.5
    # The reading of Eq. 8 (ctxpick/rewards/reward.py): printed (coverage up to the margin:
    # Stage I's recall) | described (every passage outside the gold set costs: Stage II's
    # compression).
    eq8: str = "printed"
    group_size: int = 8
    lr: float = 1e-6
    max_steps: int = 100
    patience: int = 5  # validations without improvement before the stage stops
    init_from: str | None = None  # an HF folder (e.g. the previous stage's final/)
    # sft: loss weight of the tokens of <ids>...</ids> (the decision) against the rationale's
    # and the template's, which otherwise carry almost all of the loss.
    id_weight: float = 1.0
    # sft: what the target's rationale says (ctxpick/picker/examples.py): the chosen passages'
    # titles, or what each contributes.
    rationale: str = "titles"

    def __post_init__(self) -> None:
        if self.id_weight <= 0:
            raise ValueError("stage.id_weight must be > 0")
        check_rationale(self.rationale)
        if self.kind not in ("grpo", "sft"):
            raise ValueError(f"stage.kind must be grpo or sft, not {self.kind!r}")
        if self.redundancy_margin < 0:
            raise ValueError("stage.redundancy_margin must be >= 0")
        if not 0 <= self.gamma <= 1:
            raise ValueError("stage.gamma must be in [0, 1]")
        if self.eq8 not in EQ8_READINGS:
            raise ValueError(f"stage.eq8 must be one of {EQ8_READINGS}, not {self.eq8!r}")
        if self.group_size < 2 and self.kind == "grpo":
            raise ValueError("stage.group_size must be >= 2 (GRPO normalises within a group)")
        if self.lr <= 0 or self.max_steps <= 0 or self.patience <= 0:
            raise ValueError("stage needs lr > 0, max_steps > 0, patience > 0")


@dataclass
class PickerConfig:
    model: str = "smollm2-135m"  # the policy: a built-in alias, a folder or an HF id
    # The one system prompt of this picker: training, evaluation and serving (a trained
    # model folder carries its own copy in picker.json).
    instruction: str = ""
    max_passages: int = 10  # candidates shown to the picker
    max_passage_words: int = 80  # each cut to this many words in the picker's prompt
    max_tokens: int = 96
    temperature: float = 1.0  # rollout sampling temperature (the learner's log-probs use it too)
    constrained: bool = False  # constrain rollouts to the output format (vLLM structured outputs)
    output: str = "rationale_ids"  # rationale_ids | ids_rationale | ids (ctxpick/picker/format.py)

    def __post_init__(self) -> None:
        if self.max_passages < 1 or self.max_passage_words < 1 or self.max_tokens < 8:
            raise ValueError(
                "picker needs max_passages >= 1, max_passage_words >= 1, max_tokens >= 8"
            )
        if self.output not in FORMATS:
            raise ValueError(f"picker.output must be one of {list(FORMATS)}, not {self.output!r}")
        if self.temperature <= 0:
            raise ValueError(
                f"picker.temperature must be > 0 (rollouts sample at it), not {self.temperature}"
            )


@dataclass
class EvalConfig:
    # none | bm25 | dense | crossenc | crossenc_threshold | adaptive | full_pool | oracle |
    # picker | matched (see ctxpick/eval/methods.py)
    methods: list[str] = field(
        default_factory=lambda: [
            "none",
            "bm25",
            "dense",
            "crossenc",
            "adaptive",
            "full_pool",
            "oracle",
            "picker",
            "matched",
        ]
    )
    topk: list[int] = field(default_factory=lambda: [5, 10])  # K of the Top-K baselines
    topk_by_dataset: dict[str, list[int]] = field(default_factory=dict)  # e.g. locomo: [100]
    token_budget: int | None = None  # cap on context tokens any method may send
    pickers: dict[str, str] = field(default_factory=dict)  # label -> model folder
    adaptive_min_k: int = 1
    tokenizer: str = ""  # counts context tokens (empty: the generator's)
    # What a picker sends when its output does not parse (top_k | all). A picker is evaluated
    # as it is served: conf/config.yaml points both at serve.*, and these defaults are serve's.
    picker_fallback: str = ServeConfig.fallback
    picker_fallback_k: int = ServeConfig.fallback_k
    # crossenc_threshold keeps the passages whose cross-encoder logit is at least this: the
    # value that maximised evidence F1 on training-split questions, never on evaluation ones
    # (benchmarks/tune_crossenc_threshold.py; benchmarks/RESULTS.md).
    crossenc_threshold: float = 2.5

    def __post_init__(self) -> None:
        from ctxpick.eval.methods import METHODS
        from ctxpick.picker.selection import FALLBACKS

        for m in self.methods:
            if m not in METHODS:
                raise ValueError(
                    f"eval.methods: unknown method {m!r} (known: {', '.join(METHODS)})"
                )
        if any(k < 1 for ks in [self.topk, *self.topk_by_dataset.values()] for k in ks):
            raise ValueError("eval.topk values must be >= 1")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError("eval.token_budget must be >= 1 (or null)")
        if self.picker_fallback not in FALLBACKS:
            raise ValueError(
                f"eval.picker_fallback {self.picker_fallback!r}: expected one of {FALLBACKS}"
            )
        if self.picker_fallback_k < 1:
            raise ValueError("eval.picker_fallback_k must be >= 1")
        if "matched" in self.methods and "picker" not in self.methods:
            raise ValueError("eval.methods: matched rows take a picker's set sizes: add picker")


@dataclass
class RewardConfig:
    format_penalty: float = -1.0
    timeout_s: float = 30.0  # per request; a late request gets `fallback` and is logged
    fallback: float = 0.0

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:  # NaN too
            raise ValueError("rewards.timeout_s must be > 0")


@dataclass
class RLConfig:
    mined: str = ""  # the mined dataset (mined.jsonl from `ctxpick mine`)
    # How a training prompt orders its passages. pool: the mining pool's rank, which is the
    # inference retriever's when mining.pool queries the question as retrieval.pool does (the
    # picker then trains on the task it is used for). shuffle: a per-example shuffle, for
    # pools ranked with the answer (question_answer), whose order would leak it.
    pool_order: str = "pool"
    prompts_per_step: int = 4  # prompts per step; a step trains on prompts x group_size samples
    # Oversampling: each epoch lists a dataset's training prompts this many times, e.g.
    # {musique: 3}; a dataset not named, once.
    dataset_repeats: dict[str, int] = field(default_factory=dict)
    rollout: EngineConfig = field(default_factory=EngineConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    # The stage's placement group (rollout workers, then learners, one bundle each):
    # PACK keeps them together, SPREAD puts them on different nodes.
    placement_strategy: str = "PACK"  # PACK | SPREAD | STRICT_PACK | STRICT_SPREAD
    save_every: int = 10
    keep_checkpoints: int = 1
    # Also keep best/: the weights of the step with the best validation reward (each new best
    # is checkpointed, then exported), beside final/, the last step's.
    keep_best: bool = False
    # a dead learner or rollout actor: restart the actors from the last checkpoint, this often
    max_restarts: int = 2
    val_every: int = 5
    val_size: int = 16  # validation prompts (greedy) per evaluation
    bucket_mb: int = 256  # weight-sync bucket size (object_store transfer)
    # auto | object_store | nccl | ipc: how weights reach the rollout workers
    # (ctxpick/rl/weight_sync.py; auto: ipc only where the placement puts each engine on a
    # learner's GPU, ctxpick/rl/placement.py)
    weight_transfer: str = "auto"
    # With LoRA (learner.lora_rank > 0): adapter -- engines serve the base model with vLLM's
    # LoRA support and each sync ships the adapter alone, through the object store, on CPU and
    # GPU alike; merged -- the whole merged model, by weight_transfer (as without LoRA).
    lora_sync: str = "adapter"
    # How engines apply the adapter: lora (vLLM's LoRA support) | merge (into their own
    # weights: plain kernels) | auto (lora on GPU, merge on CPU, where vLLM's LoRA kernels
    # made rollouts ~4x slower: benchmarks/RESULTS.md)
    adapter_serving: str = "auto"
    # DAPO's dynamic sampling: drop prompt groups whose samples all earn the same reward (no
    # gradient) and draw more prompts until prompts_per_step groups carry signal, drawing at
    # most max_prompt_draws prompts in a step (the first prompts_per_step included).
    dynamic_sampling: bool = False
    max_prompt_draws: int = 12
    samples_logged: int = 4  # rationales per step in the W&B table
    # 0: strictly on-policy (each step samples with the weights it then updates). 1: the
    # rollouts of step t+1 are generated while step t learns, with the policy before step t
    # (one version behind the learner), corrected by the sampler's log-probs (grpo.tis_cap).
    async_level: int = 0

    def __post_init__(self) -> None:
        if self.async_level not in (0, 1):
            raise ValueError(f"rl.async_level must be 0 or 1, not {self.async_level}")
        if self.async_level and self.learner.grpo.tis_cap is None:
            raise ValueError(
                "rl.async_level=1 trains on samples one policy version old: set "
                "rl.learner.grpo.tis_cap (e.g. 2.0) so the sampler's log-probs correct them"
            )
        if self.pool_order not in ("pool", "shuffle"):
            raise ValueError(f"rl.pool_order must be pool or shuffle, not {self.pool_order!r}")
        if bad := {k: v for k, v in self.dataset_repeats.items() if v < 1}:
            raise ValueError(f"rl.dataset_repeats must be whole numbers >= 1, not {bad}")
        if self.placement_strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            raise ValueError(f"unknown rl.placement_strategy {self.placement_strategy!r}")
        if min(self.prompts_per_step, self.save_every, self.val_every, self.keep_checkpoints) < 1:
            raise ValueError(
                "rl needs prompts_per_step, save_every, keep_checkpoints, val_every >= 1"
            )
        if self.lora_sync not in ("adapter", "merged"):
            raise ValueError(f"rl.lora_sync must be adapter or merged, not {self.lora_sync!r}")
        if self.dynamic_sampling and self.max_prompt_draws < self.prompts_per_step:
            raise ValueError(
                f"rl.max_prompt_draws={self.max_prompt_draws} is below rl.prompts_per_step="
                f"{self.prompts_per_step}: dynamic sampling draws at least one step's prompts"
            )
        self.transfer_mode()  # validates the choice against the placement
        self.serving_mode()

    def serving_mode(self) -> str:
        from ctxpick.rl.weight_sync import adapter_serving

        return adapter_serving(self.adapter_serving, self.rollout)

    def transfer_mode(self) -> str:
        from ctxpick.rl.weight_sync import resolve_mode

        adapter = self.learner.lora_rank > 0 and self.lora_sync == "adapter"
        return resolve_mode(self.weight_transfer, self.rollout, self.learner, adapter)


@dataclass
class DemoConfig:
    """The main job (`ctxpick demo`): mine -> each stage in order -> evaluate. Each entry lists
    Hydra overrides applied on top of the command's own for that phase."""

    # Run in this order; empty: stage1 then stage2 (add a warmup stage first for small models).
    stages: dict[str, list[str]] = field(default_factory=dict)
    eval: list[str] = field(default_factory=list)
    # Overrides of a second mining phase whose records the sft stages (the warm start) train
    # on, e.g. [mining.miner=human, mining.max_questions=null]; empty: the mined data.
    warmup_data: list[str] = field(default_factory=list)
    # The GRPO stages' gold sets: mined (the generator's minimal sufficient sets) or
    # warmup_data (the warm start's records, e.g. every training question's human evidence).
    rl_data: str = "mined"
    eval_sources: list[DataSource] = field(default_factory=list)  # empty: data.sources
    # Ablations (conf/ablation/): train on the data of the run in `from_run` (no mining), skip
    # some stages and take others' final/ from that run instead of training them.
    from_run: str | None = None
    skip: list[str] = field(default_factory=list)
    reuse: list[str] = field(default_factory=list)
    stage_overrides: list[str] = field(default_factory=list)  # added to every stage trained
    evaluate: bool = True  # false: train only (pickers.json lists what to evaluate)

    def __post_init__(self) -> None:
        if self.reuse and not self.from_run:
            raise ValueError("demo.reuse takes stages from another run: set demo.from_run")
        if self.rl_data not in ("mined", "warmup_data"):
            raise ValueError(f"demo.rl_data must be mined or warmup_data, not {self.rl_data!r}")
        for name in (*self.skip, *self.reuse):
            if self.stages and name not in self.stages:
                raise ValueError(f"demo.skip/reuse: no stage {name!r} in demo.stages")


@dataclass
class RayConfig:
    address: str | None = None  # None: start a local cluster
    num_cpus: int | None = None
    # How long a stage waits for the cluster to have room for all its actors (None: as long as
    # it takes, so a sweep's points queue); then it fails, saying what it asked for.
    reserve_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.reserve_timeout_s is not None and not self.reserve_timeout_s > 0:
            raise ValueError(
                f"ray.reserve_timeout_s={self.reserve_timeout_s}: seconds > 0, or null (no limit)"
            )


@dataclass
class WandbConfig:
    mode: str = "offline"
    project: str = "ctxpick"
    # A multirun sets these for each point: the sweep folder's name (one group per sweep)
    # and the point's overrides (in the run's config).
    group: str = ""
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in ("offline", "online", "disabled"):
            raise ValueError(f"wandb.mode must be offline, online or disabled, not {self.mode!r}")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    mining: MiningConfig = field(default_factory=MiningConfig)
    stage: StageConfig = field(default_factory=StageConfig)
    picker: PickerConfig = field(default_factory=PickerConfig)
    rewards: RewardConfig = field(default_factory=RewardConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    seed: int = 0
    output_dir: str = "outputs/run"


def _cross_checks(cfg: Config) -> None:
    """Constraints between sections, checked before any actor starts."""
    rl = cfg.rl
    if rl.prompts_per_step % rl.learner.num_actors:
        raise ConfigError(
            f"invalid config: rl.prompts_per_step = {rl.prompts_per_step} prompt groups per "
            f"step do not split over rl.learner.num_actors = {rl.learner.num_actors}"
        )
    if rl.learner.zero_stage == 3 and rl.learner.logprob_chunk < cfg.picker.max_tokens:
        # ZeRO-3 gathers the LM head on every rank for each chunk of a micro-batch's positions:
        # ranks whose responses needed more chunks than others would wait in the gather forever.
        raise ConfigError(
            f"invalid config: rl.learner.zero_stage=3 needs rl.learner.logprob_chunk "
            f"({rl.learner.logprob_chunk}) >= picker.max_tokens ({cfg.picker.max_tokens}), so "
            "every rank makes one LM-head call per micro-batch"
        )
    if rl.learner.grpo.mini_batches > rl.prompts_per_step:
        raise ConfigError(
            f"invalid config: rl.learner.grpo.mini_batches = {rl.learner.grpo.mini_batches} "
            f"exceeds rl.prompts_per_step = {rl.prompts_per_step} prompt groups"
        )

    def order(pool: PoolConfig) -> dict[str, Any]:  # what ranks a pool (k: only how many)
        return {**pool_settings(pool, cfg.retrieval.chunking), "k": None}

    mining, shown = cfg.mining.pool, cfg.retrieval.pool
    if rl.pool_order == "pool" and order(mining) != order(shown):
        keys = ("query", "retriever", "embedder", "reranker", "rerank_first_stage", "rerank_n")
        key = next(k for k in keys if getattr(mining, k) != getattr(shown, k))
        mined, used = getattr(mining, key), getattr(shown, key)
        raise ConfigError(
            f"invalid config: rl.pool_order=pool trains on the mining pool's order, ranked "
            f"by mining.pool.{key}={mined!r}, but inference ranks by retrieval.pool.{key}="
            f"{used!r}: set mining.pool.{key}={used} or rl.pool_order=shuffle"
        )
    try:
        reward_spec(cfg)
    except ValueError as err:
        raise ConfigError(f"invalid config in 'rewards'/'stage': {err}") from None


def picker_spec(cfg: Config) -> PickerSpec:
    """The prompt, passage cut and pool the configured picker trains with (saved beside its
    weights)."""
    return PickerSpec.from_settings(asdict(cfg.picker), inference_pool(cfg))


def inference_pool(cfg: Config) -> dict[str, Any]:
    """The pool this config ranks candidates with, as ``picker.json`` records it."""
    return pool_settings(cfg.retrieval.pool, cfg.retrieval.chunking, cfg.rl.pool_order)


def reward_spec(cfg: Config) -> RewardSpec:
    """The reward the configured stage trains on."""
    s, r = cfg.stage, cfg.rewards
    return RewardSpec(
        s.redundancy_margin, s.gamma, s.eq8, r.format_penalty, FORMATS[cfg.picker.output]
    )


def validate(cfg: DictConfig | dict[str, Any]) -> Config:
    """Check ``cfg`` against :class:`Config`: unknown keys, wrong types and bad values all raise
    :class:`ConfigError` naming the key."""
    raw = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    raw = OmegaConf.masked_copy(raw, [k for k in raw if k != "hydra"]) if "hydra" in raw else raw
    try:
        # Untyped first: a key appended with `+` onto a typed node must still be refused.
        raw = OmegaConf.create(OmegaConf.to_container(raw, resolve=True))
        merged = OmegaConf.merge(OmegaConf.structured(Config), raw)
    except OmegaConfBaseException as err:
        raise ConfigError(f"invalid config: {err}") from None
    # Instantiate section by section so a failed value check names its section.
    for name in merged:
        try:
            OmegaConf.to_object(merged[name]) if OmegaConf.is_config(merged[name]) else None
        except (OmegaConfBaseException, ValueError) as err:
            raise ConfigError(f"invalid config in '{name}': {err}") from None
    out = OmegaConf.to_object(merged)
    _cross_checks(out)
    return out


def compose(overrides: list[str] | None = None, config_name: str = "config") -> Config:
    """Compose ``conf/`` with Hydra overrides outside a Hydra app (library use, tests)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    def composed() -> DictConfig:
        try:
            return hydra_compose(config_name=config_name, overrides=overrides or [])
        except HydraException as err:
            cause = f" ({err.__cause__})" if err.__cause__ else ""
            raise ConfigError(f"invalid config: {err}{cause}") from None

    if GlobalHydra.instance().is_initialized():  # inside a Hydra app (`ctxpick demo`)
        return validate(composed())
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return validate(composed())


def _register_schema() -> None:
    # conf/config.yaml lists this schema first in its defaults, so Hydra knows every typed key:
    # any of them can be overridden from the command line, and a misspelt one is refused.
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="ctxpick_schema", node=Config)


_register_schema()
