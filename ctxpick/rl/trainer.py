"""One training stage (Stage I, Stage II, or the optional warm start) -- the paper's Algorithm 2.

Orchestration only: rollouts come from vLLM workers (:mod:`ctxpick.rl.rollout`), rewards from
the reward service (:mod:`ctxpick.rewards.service`), updates from DeepSpeed learners
(:mod:`ctxpick.rl.learner`). Every step is logged to ``metrics.jsonl`` and W&B; every
``rl.save_every`` steps a checkpoint holds the model, optimizer, scheduler, RNG, data cursor and
step, and a re-run of the same command resumes from it.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from statistics import mean
from typing import Any

import torch
from ray.exceptions import RayActorError

from ctxpick.config import Config, ConfigError, picker_spec, reward_spec
from ctxpick.engines.base import SamplingConfig
from ctxpick.engines.ray_pool import init_ray
from ctxpick.engines.vllm_engine import chat_prompt_ids
from ctxpick.picker.diagnostics import PickRecord, diagnose
from ctxpick.picker.examples import PickerExample, load_picker_examples, warm_start_pick
from ctxpick.picker.format import InvalidPick, parse_pick, render_pick
from ctxpick.picker.spec import PickerSpec
from ctxpick.rewards.reward import RewardSpec, RewardTerms
from ctxpick.rl.batching import TrainSequence
from ctxpick.rl.dynamic_sampling import carries_signal, draw_signal_groups, zero_variance_share
from ctxpick.rl.grpo import group_advantages
from ctxpick.rl.prompt_stream import PromptStream, TrainState
from ctxpick.rl.rollout import Group, reward_requests, sample_groups, to_sequences
from ctxpick.rl.run import Run
from ctxpick.rl.stage_settings import check_stage_settings
from ctxpick.tracking import Tracker


class StepTimer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):  # noqa: ANN204 - a context manager
        t0 = time.time()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - t0


def _sampling(cfg: Config, step: int, greedy: bool = False, draw: int = 0) -> SamplingConfig:
    return SamplingConfig(
        temperature=0.0 if greedy else cfg.picker.temperature,
        max_tokens=cfg.picker.max_tokens,
        n=1 if greedy else cfg.stage.group_size,
        # The step's seed (a resumed step samples the same); each prompt draws its own from it,
        # and so does each draw of a step (dynamic sampling), should a prompt come up twice.
        seed=cfg.seed * 1_000_003 + step + (draw << 32),
        logprobs=True,
    )


def _term_means(terms: list[RewardTerms]) -> dict[str, float]:
    valid = [t for t in terms if t.format_ok]
    return {
        "reward": mean(t.reward for t in terms),
        "coverage": mean(t.coverage for t in terms),
        "redundancy_penalty": mean(t.penalty for t in terms),
        "format_valid": len(valid) / len(terms),
        "recall_valid": mean(t.coverage for t in valid) if valid else 0.0,
        "mean_size": mean(t.size for t in valid) if valid else 0.0,
        "over_margin": mean(float(t.over_margin) for t in terms),
        "reward_timeouts": sum(t.timed_out for t in terms),
    }


Scored = tuple[Group, list[RewardTerms]]


def grpo_step(
    run: Run,
    batch: list[PickerExample],
    spec: RewardSpec,
    step: int,
    timer: StepTimer,
    more: Callable[[int], list[PickerExample]] | None = None,
) -> tuple[dict[str, float], list[Group], list[list[RewardTerms]]]:
    """Sample, score and learn from ``batch``; with ``rl.dynamic_sampling``, groups without
    signal are replaced by groups of ``more(n)`` prompts. Returns every group drawn."""
    cfg = run.cfg

    def draw(n: int, d: int) -> list[Scored]:
        prompts = batch if d == 0 else more(n)  # type: ignore[misc]
        with timer("rollout"):
            groups = sample_groups(
                run.engines,
                prompts,
                picker_spec(cfg),
                _sampling(cfg, step, draw=d),
                cfg.picker.constrained,
            )
        with timer("reward"):
            return list(zip(groups, run.rewards.score(reward_requests(groups), spec), strict=True))

    def signal(scored: Scored) -> bool:
        return carries_signal([t.reward for t in scored[1]])

    if cfg.rl.dynamic_sampling and more is not None:
        kept, drawn = draw_signal_groups(draw, signal, len(batch), cfg.rl.max_prompt_draws)
    else:
        kept = drawn = draw(len(batch), 0)
    rewards = torch.tensor([t.reward for _, ts in kept for t in ts])
    adv = group_advantages(rewards, cfg.stage.group_size, cfg.rl.learner.grpo.std_normalize)
    with timer("learn"):
        seqs = to_sequences([g for g, _ in kept], adv.tolist())
        stats = run.learners.step("grpo_step", seqs, cfg.picker.temperature)
    groups, terms = [g for g, _ in drawn], [ts for _, ts in drawn]
    metrics = {**_term_means([t for ts in terms for t in ts]), **stats} | {
        "prompt_tokens": sum(len(g.samples[0].prompt_token_ids) for g, _ in kept),
        "zero_variance_groups": zero_variance_share([signal(s) for s in drawn]),
        "prompts_drawn": len(drawn),
        "groups_trained": len(kept),
    }
    return metrics, groups, terms


def sft_step(run: Run, batch: list[PickerExample], timer: StepTimer) -> dict[str, float]:
    spec, eos = picker_spec(run.cfg), run.tokenizer.eos_token_id
    seqs = []
    for ex in batch:
        prompt = chat_prompt_ids(run.tokenizer, spec.chat(ex.question, ex.passages))
        text = render_pick(warm_start_pick(ex), spec.output_format)
        target, weights = weighted_target(run.tokenizer, text, run.cfg.stage.id_weight)
        seqs.append(TrainSequence(prompt + target + [eos], len(prompt), weights=[*weights, 1.0]))
    with timer("learn"):
        return run.learners.step("sft_step", seqs)


def weighted_target(tokenizer: Any, text: str, id_weight: float) -> tuple[list[int], list[float]]:
    """The warm-start target's tokens and their loss weights: ``id_weight`` on the tokens of
    ``<ids>...</ids>`` (the decision), 1 on the rest. Offsets, not separate encodes, find the
    span, so the tokens are exactly the ones the model would write."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    start, stop = text.index("<ids>"), text.index("</ids>") + len("</ids>")
    weights = [id_weight if b < stop and e > start else 1.0 for b, e in enc["offset_mapping"]]
    return list(enc["input_ids"]), weights


def validate(run: Run, val: list[PickerExample], spec: RewardSpec) -> dict[str, float]:
    """Greedy picks on the validation prompts, scored with the stage's reward, and the collapse
    diagnostics (a picker giving the same ids whatever the question shows here first)."""
    picker = picker_spec(run.cfg)
    groups = sample_groups(run.engines, val, picker, _sampling(run.cfg, 0, True))
    terms = run.rewards.score(reward_requests(groups), spec)
    flat = [t for ts in terms for t in ts]
    if invalid := Counter(t.reason for t in flat if not t.format_ok):
        # Why greedy outputs fail is what a warm start needs to know (e.g. ids counted on
        # 1, 2, 3, ... until the rationale runs past picker.max_tokens), not just how many do.
        reasons = ", ".join(f"{why} ({n})" for why, n in invalid.most_common(3))
        print(f"    validation: {invalid.total()}/{len(flat)} invalid: {reasons}", flush=True)
    metrics = _term_means(flat)
    d = diagnose([_pick_record(g, picker.output_format) for g in groups])
    metrics |= {
        "distinct_sets": d.distinct_sets,
        "top_set_share": d.top_set_share,
        "f1_minus_random": mean(d.f1) - mean(d.random_f1) if d.f1 else 0.0,
    }
    return {f"val/{k}": v for k, v in metrics.items()}


def _pick_record(g: Group, fmt: str) -> PickRecord:
    n = len(g.example.passages)
    try:
        ids: tuple[int, ...] | None = parse_pick(g.samples[0].text, n, fmt).ids
    except InvalidPick:
        ids = None
    return PickRecord(ids, n, g.example.gold)


def train(cfg: Config, run: Run | None = None) -> Path:
    """Run (or resume) the configured stage; returns the folder of its final weights.

    ``run``: actors to reuse (the caller owns them). A fresh stage needs freshly initialised
    ones; a resume restores the whole learner state from the checkpoint, so any will do."""
    stage, rl, out = cfg.stage, cfg.rl, Path(cfg.output_dir)
    check_stage_settings(cfg, out)  # what out holds was trained with these settings, or none
    if done := _finished(cfg, out):
        print(f"[{stage.name}] already finished: {done}", flush=True)
        return done
    data = _load_data(cfg)
    spec = reward_spec(cfg)
    stream = PromptStream(data["train"], rl.prompts_per_step, cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    init_ray(cfg.ray.address, cfg.ray.num_cpus)
    print(
        f"[{stage.name}] starting rollout engines and {rl.learner.num_actors} learner(s)",
        flush=True,
    )
    owned = run is None
    run = run or Run(cfg)
    run.cfg = cfg  # reused actors serve this stage's prompts, sampling and reward
    state = _resume(run, out)
    tracker = Tracker.for_job(cfg, out, stage.name)
    tracker.use_artifact(rl.mined, "dataset")
    if stage.init_from:
        tracker.use_artifact(stage.init_from, "model")
    metrics_log = _MetricsLog(out / "metrics.jsonl", state.step)
    stop = _StopOnSigterm()
    print(
        f"[{stage.name}] {len(data['train'])} train / {len(data['val'])} val prompts, "
        f"{stage.kind}, from step {state.step} to {stage.max_steps}",
        flush=True,
    )
    restarts = 0
    while state.step < stage.max_steps and not state.stop_reason:
        try:
            timer, t0, tables = StepTimer(), time.time(), {}
            batch = stream.next_batch(state)
            if stage.kind == "sft":
                metrics = sft_step(run, batch, timer)
            else:
                metrics, groups, terms = grpo_step(
                    run, batch, spec, state.step, timer, partial(stream.next_batch, state)
                )
                batch = [g.example for g in groups]  # with the prompts dynamic sampling added
                tables["samples"] = _sample_rows(groups, terms, state.step, rl.samples_logged)
            state.step += 1
            validating = state.step % rl.val_every == 0 or state.step == stage.max_steps
            # The rollout workers need the new weights before they next generate: every GRPO
            # step, but only for validation in a warm start (a 0.5B model's sync is ~40% of
            # its warm-start step on CPU).
            if stage.kind != "sft" or validating:
                with timer("sync"):
                    run.sync_weights()
            metrics |= {f"time/{k}": v for k, v in timer.seconds.items()} | {
                "time/step": time.time() - t0
            }
            if validating:
                metrics |= _evaluate(run, data["val"], spec, state, stage.patience)
            metrics_log.write(state.step, metrics, [ex.id for ex in batch])
            tracker.log(metrics, step=state.step, tables=tables)
            print(_progress(stage.name, state, metrics), flush=True)
            due = state.step % rl.save_every == 0 or state.step == stage.max_steps
            if due or state.stop_reason or stop.requested:
                _checkpoint(run, out, state, rl.keep_checkpoints)
            if stop.requested:
                # `ray job stop`, Kubernetes or a scheduler: keep the step just finished, then go.
                print(f"[{stage.name}] SIGTERM: checkpoint at step {state.step}, exit", flush=True)
                tracker.finish()
                if owned:
                    run.shutdown()
                sys.exit(128 + signal.SIGTERM)
        except RayActorError as err:
            # A dead learner or rollout worker: new actors, back to the last checkpoint.
            restarts += 1
            if restarts > rl.max_restarts:
                raise
            print(
                f"[{stage.name}] an actor died ({type(err).__name__}); restart {restarts}/"
                f"{rl.max_restarts} from the last checkpoint",
                flush=True,
            )
            run.shutdown()
            run, owned = Run(cfg), True
            state = _resume(run, out)
            metrics_log = _MetricsLog(out / "metrics.jsonl", state.step)
    stop.restore()
    final = out / "final"
    run.learners.call("save_pretrained", str(final))
    picker_spec(cfg).save(final)  # the prompt and passage cut inference must use
    (out / "result.json").write_text(json.dumps(asdict(state), indent=2))
    tracker.log_artifact(final, "model")
    tracker.finish()
    if owned:
        run.shutdown()
    why = state.stop_reason or "max_steps"
    print(f"[{stage.name}] done at step {state.step} ({why}); weights: {final}", flush=True)
    return final


def _load_data(cfg: Config) -> dict[str, list[PickerExample]]:
    path = Path(cfg.rl.mined)
    if not path.exists():
        raise ConfigError(f"rl.mined={path} does not exist: run `ctxpick mine` first")
    data = load_picker_examples(path, cfg.picker.max_passages, cfg.seed, cfg.rl.pool_order)
    if not data["train"]:
        raise ConfigError(
            f"rl.mined={path}: no training example (rl.pool_order={cfg.rl.pool_order} keeps a "
            f"question only if its mined set is among the first picker.max_passages="
            f"{cfg.picker.max_passages} passages)"
        )
    print(f"  {path}: " + ", ".join(f"{len(v)} {k}" for k, v in data.items()), flush=True)
    if not data["val"]:
        # Tiny runs can hash no question into val; validate on training prompts, and say so.
        print(f"  no validation prompts in {path}; validating on training prompts", flush=True)
        data["val"] = [ex for ex in data["train"] if "#rw" not in ex.id]
    data["val"] = data["val"][: cfg.rl.val_size]
    return data


def _evaluate(
    run: Run, val: list[PickerExample], spec: RewardSpec, state: TrainState, patience: int
) -> dict[str, float]:
    metrics = validate(run, val, spec)
    state.val_history.append({"step": state.step, **metrics})
    if metrics["val/reward"] > state.best_val + 1e-9:
        state.best_val, state.bad_evals = metrics["val/reward"], 0
    else:
        state.bad_evals += 1
        if state.bad_evals >= patience:
            state.stop_reason = f"validation reward did not improve for {patience} evaluations"
    return metrics


def _checkpoint(run: Run, out: Path, state: TrainState, keep: int) -> None:
    ckpt, tag = out / "checkpoints", f"step{state.step}"
    run.learners.call("save_checkpoint", str(ckpt), tag, {"trainer": asdict(state)})
    saved = sorted(ckpt.glob("step*"), key=lambda p: int(p.name.removeprefix("step")))
    for old in saved[:-keep]:  # a resume needs only the latest
        shutil.rmtree(old, ignore_errors=True)


class _StopOnSigterm:
    """SIGTERM asks the loop to stop after the step in flight (its checkpoint is then written);
    a step is not cut short, since a half-applied update cannot be resumed."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._request)

    def _request(self, signum: int, frame: Any) -> None:
        print("  SIGTERM received: stopping after this step", flush=True)
        self.requested = True

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _finished(cfg: Config, out: Path) -> Path | None:
    """The stage's final/ if a run into ``out`` already finished it with this picker spec."""
    result, final = out / "result.json", out / "final"
    if not result.exists() or not (final / "picker.json").exists():
        return None
    state = TrainState(**json.loads(result.read_text()))
    if state.step < cfg.stage.max_steps and not state.stop_reason:
        return None  # finished at fewer steps than now asked: train on from the checkpoint
    done, asked = PickerSpec.load(final), picker_spec(cfg)
    # The pool as evaluation checks it (a recorded k, or none recorded, is no mismatch).
    if replace(done, pool=None) != replace(asked, pool=None) or done.pool_mismatch(asked.pool):
        raise ConfigError(
            f"{out} holds a stage finished with another picker prompt, format or pool "
            f"({final / 'picker.json'}): train into another output_dir"
        )
    return final


def _resume(run: Run, out: Path) -> TrainState:
    latest = out / "checkpoints" / "latest"
    if not latest.exists():
        return TrainState()
    tag = latest.read_text().strip()
    client = run.learners.call("load_checkpoint", str(out / "checkpoints"), tag)[0]
    state = TrainState(**client["trainer"])
    run.sync_weights()
    print(f"  resumed from {out / 'checkpoints' / tag} at step {state.step}", flush=True)
    return state


class _MetricsLog:
    """Append-only ``metrics.jsonl``; steps past the checkpoint a run resumes from are dropped,
    since they will be run again, and so is a last line torn by a crash mid-write."""

    def __init__(self, path: Path, resume_step: int) -> None:
        kept = []
        lines = path.read_text().splitlines() if path.exists() else []
        for n, line in enumerate(lines, 1):
            try:
                step = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError, TypeError):
                if n == len(lines):
                    print(f"  {path}: dropping a torn last line", flush=True)
                    continue
                raise ValueError(f"{path}: line {n} is not a metrics record") from None
            if step <= resume_step:
                kept.append(line)
        path.write_text("".join(line + "\n" for line in kept))
        self.path = path

    def write(self, step: int, metrics: dict[str, Any], batch: list[str]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps({"step": step, **metrics, "batch": batch}) + "\n")


def _sample_rows(
    groups: list[Group], terms: list[list[RewardTerms]], step: int, n: int
) -> tuple[list[str], list[list[Any]]]:
    rows = []
    for g, ts in zip(groups[:n], terms[:n], strict=False):
        c, t = g.samples[0], ts[0]
        rows.append([step, g.example.question, c.text, list(g.example.gold), t.reward, t.reason])
    return ["step", "question", "output", "gold ids", "reward", "invalid because"], rows


def _progress(name: str, state: TrainState, m: dict[str, Any]) -> str:
    line = f"  [{name}] step {state.step} epoch {state.epoch} | "
    if "reward" in m:
        line += (
            f"reward {m['reward']:+.3f} cov {m['coverage']:.2f} |S| {m['mean_size']:.1f} "
            f"valid {m['format_valid']:.0%} no-signal groups {m['zero_variance_groups']:.0%} | "
        )
    line += f"loss {m['loss']:.4f} | {m['time/step']:.1f}s"
    if "val/reward" in m:
        line += (
            f" | val reward {m['val/reward']:+.3f} valid {m['val/format_valid']:.0%} "
            f"distinct sets {m['val/distinct_sets']:.0%}"
        )
    return line
