"""One training stage (Stage I, Stage II, or the optional warm start) -- the paper's Algorithm 2.

Orchestration only: rollouts come from vLLM workers (:mod:`ctxpick.rl.rollout`), rewards from
the reward service (:mod:`ctxpick.rewards.service`), updates from DeepSpeed learners
(:mod:`ctxpick.rl.learner`). Every step is logged to ``metrics.jsonl`` and W&B; every
``rl.save_every`` steps a checkpoint holds the model, optimizer, scheduler, RNG, data cursor and
step, and a re-run of the same command resumes from it.
"""

from __future__ import annotations

import json
import pickle
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError

from ctxpick.config import Config, ConfigError, picker_spec, reward_spec
from ctxpick.engines.ray_pool import init_ray
from ctxpick.picker.examples import PickerExample, load_picker_examples
from ctxpick.picker.spec import PickerSpec
from ctxpick.rewards.reward import RewardSpec
from ctxpick.rl.prompt_stream import PromptStream, TrainState
from ctxpick.rl.run import Run
from ctxpick.rl.stage_settings import check_stage_settings
from ctxpick.rl.steps import Rollouts, collect, learn, sft_step, validate
from ctxpick.tracking import Tracker

BEST_RECORD = "best.json"  # in best/: the step its weights are from and their validation reward


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
    stream = PromptStream(data["train"], rl.prompts_per_step, cfg.seed, rl.dataset_repeats)
    out.mkdir(parents=True, exist_ok=True)
    init_ray(cfg.ray.address, cfg.ray.num_cpus)
    print(
        f"[{stage.name}] starting rollout engines and {rl.learner.num_actors} learner(s)",
        flush=True,
    )
    owned, stop = run is None, None
    run = run or Run(cfg)
    try:
        run.cfg = cfg  # reused actors serve this stage's prompts, sampling and reward
        state, ahead, metrics_log = _resume(run, cfg, out)
        tracker = Tracker.for_job(cfg, out, stage.name)
        tracker.use_artifact(rl.mined, "dataset")
        if stage.init_from:
            tracker.use_artifact(stage.init_from, "model")
        stop = _StopOnSigterm()
        print(
            f"[{stage.name}] {len(data['train'])} train ({len(stream.examples)} an epoch) / "
            f"{len(data['val'])} val prompts, "
            f"{stage.kind}, from step {state.step} to {stage.max_steps}",
            flush=True,
        )
        restarts, restarting = 0, False
        while restarting or (state.step < stage.max_steps and not state.stop_reason):
            try:
                if restarting:
                    # In the try: an actor that dies while the new ones start or resume counts
                    # as one more restart, not a crash of the stage.
                    run, owned = Run(cfg), True
                    state, ahead, metrics_log = _resume(run, cfg, out)
                    restarting = False
                    stop.exit_if_requested(stage.name, state.step, tracker)
                    continue
                t0, tables = time.time(), {}
                more = partial(stream.next_batch, state)  # dynamic sampling's extra prompts
                if stage.kind == "sft":
                    batch = stream.next_batch(state)
                    metrics = sft_step(run, batch)
                else:
                    # On-policy, or made while the previous step learned (rl.async_level=1).
                    rollouts = ahead or collect(
                        run, stream.next_batch(state), spec, state.step, state.step, more
                    )
                    lag = state.step - rollouts.version
                    if lag > rl.async_level:
                        raise RuntimeError(
                            f"samples {lag} policy versions old at step {state.step}"
                        )
                    ahead = None
                    # Not after a SIGTERM: the checkpoint must not wait for another rollout.
                    if rl.async_level and state.step + 1 < stage.max_steps and not stop.requested:
                        # The engines still hold this step's weights: they sample the next step
                        # while the learners update on this one.
                        with ThreadPoolExecutor(1) as pool:
                            learning = pool.submit(learn, run, rollouts)
                            ahead = collect(
                                run,
                                stream.next_batch(state),
                                spec,
                                state.step + 1,
                                state.step,
                                more,
                            )
                            metrics = learning.result()
                    else:
                        metrics = learn(run, rollouts)
                    metrics |= {f"time/{k}": v for k, v in rollouts.seconds.items()}
                    metrics["policy_lag"] = lag
                    batch = [g.example for g in rollouts.groups]  # with dynamic sampling's prompts
                    tables["samples"] = _sample_rows(rollouts, state.step, rl.samples_logged)
                state.step += 1
                validating = state.step % rl.val_every == 0 or state.step == stage.max_steps
                # The rollout workers need the new weights before they next generate: every GRPO
                # step, but only for validation in a warm start (a 0.5B model's sync is ~40% of
                # its warm-start step on CPU).
                if stage.kind != "sft" or validating:
                    t_sync = time.time()
                    run.sync_weights()
                    metrics["time/sync"] = time.time() - t_sync
                metrics["time/step"] = time.time() - t0
                if validating:
                    metrics |= _evaluate(run, data["val"], spec, state, stage.patience)
                metrics_log.write(state.step, metrics, [ex.id for ex in batch])
                tracker.log(metrics, step=state.step, tables=tables)
                print(_progress(stage.name, state, metrics), flush=True)
                due = state.step % rl.save_every == 0 or state.step == stage.max_steps
                # A new best is checkpointed before best/ is written: if a crash comes between
                # the two, the resume holds its weights and writes best/ then (so does the resume
                # after a SIGTERM, which must not wait for the export).
                best = rl.keep_best and state.best_step == state.step
                if due or best or state.stop_reason or stop.requested:
                    _checkpoint(run, out, state, rl.keep_checkpoints, ahead)
                if best and not stop.requested:
                    _export_best(run, cfg, out, state)
                stop.exit_if_requested(stage.name, state.step, tracker)
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
                restarting = True
        final = _export(run, cfg, out / "final")
        (out / "result.json").write_text(json.dumps(asdict(state), indent=2))
        tracker.log_artifact(final, "model")
        tracker.finish()
        why = state.stop_reason or "max_steps"
        print(f"[{stage.name}] done at step {state.step} ({why}); weights: {final}", flush=True)
        if rl.keep_best:
            kept = _best_on_disk(out)
            print(
                f"[{stage.name}] best validation reward {state.best_val:+.3f} at step "
                f"{state.best_step}; {out / 'best'} holds "
                + (f"step {kept}" if kept else "nothing (no step's weights were kept)"),
                flush=True,
            )
        return final
    finally:  # whatever ended it (a SIGTERM's exit too): this call's handler and actors
        if stop is not None:
            stop.restore()
        if owned:
            run.shutdown()


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
        state.best_val, state.best_step, state.bad_evals = metrics["val/reward"], state.step, 0
    else:
        state.bad_evals += 1
        if state.bad_evals >= patience:
            state.stop_reason = f"validation reward did not improve for {patience} evaluations"
    return metrics


def _export(run: Run, cfg: Config, folder: Path) -> Path:
    """The learners' weights as a picker folder, with the prompt and passage cut inference must
    use."""
    run.learners.call("save_pretrained", str(folder))
    picker_spec(cfg).save(folder)
    return folder


def _export_best(run: Run, cfg: Config, out: Path, state: TrainState) -> None:
    """``best/``: the weights of the step with the best validation reward so far (rl.keep_best),
    and that step in ``best.json``. Written beside and then swapped in, so ``best/`` is never
    half-written. A crash during the swap leaves no ``best/`` at all, but it comes right after
    the best step's checkpoint, so the resume loads that step and writes it again."""
    tmp, best, old = out / "best.tmp", out / "best", out / "best.old"
    _clear_stale_best(out)
    _export(run, cfg, tmp)
    record = {"step": state.best_step, "val_reward": state.best_val}
    (tmp / BEST_RECORD).write_text(json.dumps(record) + "\n")
    if best.exists():
        best.rename(old)
    tmp.rename(best)
    _clear_stale_best(out)


def _restore_best(run: Run, cfg: Config, out: Path, state: TrainState) -> None:
    """On resume: ``best/`` must hold the best step's weights. A crash between that step's
    checkpoint and its export left them only in the checkpoint just loaded: write them now."""
    if state.best_step == _best_on_disk(out):
        _clear_stale_best(out)  # a crash after the swap, before its clean-up
        return
    if state.best_step != state.step:
        print(
            f"  {out / 'best'} does not hold step {state.best_step}'s weights (the best "
            f"validation reward, {state.best_val:+.3f}), and no checkpoint loaded does: "
            "best/ will hold the next step that beats it",
            flush=True,
        )
        return
    _export_best(run, cfg, out, state)


def _clear_stale_best(out: Path) -> None:
    for stale in ("best.tmp", "best.old"):
        shutil.rmtree(out / stale, ignore_errors=True)


def _best_on_disk(out: Path) -> int:
    """The step whose weights ``best/`` holds (0: none)."""
    record = out / "best" / BEST_RECORD
    return json.loads(record.read_text())["step"] if record.exists() else 0


def _checkpoint(run: Run, out: Path, state: TrainState, keep: int, ahead: Rollouts | None) -> None:
    """The learners' state with the trainer's: its cursor, and (rl.async_level=1) the next
    step's rollouts, already drawn from that cursor and sampled by a policy the checkpoint no
    longer holds, so a resume trains on exactly them."""
    ckpt, tag = out / "checkpoints", f"step{state.step}"
    client = {"trainer": asdict(state), "ahead": pickle.dumps(ahead) if ahead else None}
    run.learners.call("save_checkpoint", str(ckpt), tag, client)
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

    def exit_if_requested(self, stage: str, step: int, tracker: Tracker) -> None:
        """After a SIGTERM (`ray job stop`, Kubernetes or a scheduler), once step ``step``'s
        checkpoint is on disk: go."""
        if self.requested:
            print(f"[{stage}] SIGTERM: checkpoint at step {step}, exit", flush=True)
            tracker.finish()
            sys.exit(128 + signal.SIGTERM)

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
            f"{out} holds a stage finished with another picker prompt, format, decoding or pool "
            f"({final / 'picker.json'}): train into another output_dir"
        )
    return final


def _resume(run: Run, cfg: Config, out: Path) -> tuple[TrainState, Rollouts | None, _MetricsLog]:
    """The state, the rollouts made ahead and the metrics log of the latest checkpoint (a
    fresh stage's, when there is none), with ``run``'s actors loaded from it."""
    latest = out / "checkpoints" / "latest"
    if not latest.exists():
        return TrainState(), None, _MetricsLog(out / "metrics.jsonl", 0)
    tag = latest.read_text().strip()
    if not (out / "checkpoints" / tag).is_dir():  # DeepSpeed would only fail a bare assert
        raise FileNotFoundError(
            f"{latest} names checkpoint {tag!r}, which is not in {latest.parent}"
        )
    client = run.learners.call("load_checkpoint", str(out / "checkpoints"), tag)[0]
    state = TrainState(**client["trainer"])
    if not state.best_step:  # a checkpoint from before best_step was recorded
        best = (h["step"] for h in state.val_history if h["val/reward"] == state.best_val)
        state.best_step = next(best, 0)
    run.sync_weights()
    print(f"  resumed from {out / 'checkpoints' / tag} at step {state.step}", flush=True)
    if cfg.rl.keep_best:
        _restore_best(run, cfg, out, state)
    ahead = client.get("ahead")
    log = _MetricsLog(out / "metrics.jsonl", state.step)
    return state, pickle.loads(ahead) if ahead else None, log


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


def _sample_rows(rollouts: Rollouts, step: int, n: int) -> tuple[list[str], list[list[Any]]]:
    rows = []
    for g, ts in rollouts.drawn[:n]:
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
