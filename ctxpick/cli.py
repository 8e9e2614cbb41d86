"""The ``ctxpick`` command. Pipeline subcommands are Hydra apps over ``conf/`` (any
``key=value`` override, ``--multirun``, ``experiment=...``); ``data`` and ``models`` are
utilities with ordinary flags."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ctxpick.config import CONF_DIR, Config, ConfigError, validate

USAGE = """usage: ctxpick COMMAND [ARGS]

pipeline (Hydra apps over conf/; pass key=value overrides):
  demo                 the main job: pools -> mining -> training stages -> evaluation
  mine                 mine minimal sufficient evidence sets (a resumable Ray job)
  train                train the picker: stage=warmup | stage1 | stage2 (resumable Ray job)
  eval                 methods x datasets: judged accuracy and the tokens each method sends
  serve                serve a picker over HTTP on Ray Serve (serve.picker=FOLDER, serve.port=...)
  config               print the composed, validated config

utilities:
  data stats PATH [--format NAME] [--strict]   counts for a dataset file
  models prepare [NAME ...]                    prepare built-in models / shipped pickers (once)
  models list                                  built-in models and shipped pickers
  models ship FINAL --name NAME [--max-rank R] [--max-tokens N] [--constrained]
                                               copy a trained LoRA picker into the package
  openapi [--write]                            the service's OpenAPI schema (docs/openapi.json)
"""


def _hydra_app(name: str, task: Callable[[Config], object], overrides: list[str]) -> None:
    import hydra
    from omegaconf import DictConfig

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def app(raw: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        try:
            cfg = validate(raw)
            hydra = HydraConfig.get()
            if hydra.mode == RunMode.MULTIRUN:
                # Each sweep job writes to its own folder under the sweep directory, and is
                # a W&B run in the sweep's group.
                cfg.output_dir = hydra.runtime.output_dir
                cfg.wandb.group = cfg.wandb.group or os.path.basename(hydra.sweep.dir)
                cfg.wandb.overrides = list(hydra.overrides.task)
            task(cfg)
        except ConfigError as err:
            sys.exit(f"ctxpick {name}: {err}")

    sys.argv = [f"ctxpick {name}", *overrides]
    app()


def _print_config(cfg: Config) -> None:
    from omegaconf import OmegaConf

    print(OmegaConf.to_yaml(OmegaConf.structured(cfg)))


def _demo(cfg: Config) -> None:
    from hydra.core.hydra_config import HydraConfig

    from ctxpick.pipeline import run_demo

    run_demo(cfg, list(HydraConfig.get().overrides.task))


def _eval(cfg: Config) -> None:
    from ctxpick.eval.harness import run_eval

    run_eval(cfg)


def _data(argv: list[str]) -> None:
    from ctxpick.data.errors import DataError
    from ctxpick.data.loaders import FORMATS, load_examples
    from ctxpick.data.stats import compute_stats

    parser = argparse.ArgumentParser(prog="ctxpick data stats")
    parser.add_argument("path")
    parser.add_argument("--format", default="auto", choices=["auto", *FORMATS])
    parser.add_argument("--strict", action="store_true", help="fail at the first bad record")
    parser.add_argument("--rejects", help="append rejected records (JSONL) to this file")
    parser.add_argument("--show-rejects", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        res = load_examples(args.path, args.format, strict=args.strict, rejects_path=args.rejects)
    except DataError as err:
        sys.exit(f"ctxpick data stats: {err}")
    print(compute_stats(res, args.show_rejects).render())


def _mine(cfg: Config) -> None:
    from ctxpick.mining.run import run_mining

    run_mining(cfg)


def _train(cfg: Config) -> None:
    from ctxpick.rl.trainer import train

    train(cfg)


def _serve(cfg: Config) -> None:
    from ctxpick.serve.app import start

    start(cfg.serve, ray_address=cfg.ray.address)


def _openapi(argv: list[str]) -> None:
    import json

    from ctxpick.serve.app import OPENAPI_FILE, app

    text = json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"
    if argv == ["--write"]:
        OPENAPI_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {OPENAPI_FILE}")
    elif argv:
        sys.exit("usage: ctxpick openapi [--write]")
    else:
        print(text, end="")


def _models(argv: list[str]) -> None:
    from ctxpick.engines.models import BUILTINS, prepare, prepared_path
    from ctxpick.picker.shipped import (
        ADAPTER_FILES,
        SHIPPED,
        pin_entry,
        prepare_shipped,
        prepared_picker_path,
        ship,
    )

    parser = argparse.ArgumentParser(prog="ctxpick models")
    parser.add_argument("action", choices=["prepare", "list", "ship"])
    parser.add_argument(
        "names",
        nargs="*",
        help="prepare: built-in models or shipped pickers (default: all of them); "
        "ship: a trained LoRA stage's final/ folder",
    )
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--name", help="ship: the shipped picker's name")
    parser.add_argument("--base", default="qwen2.5-coder-0.5b", help="ship: its base model")
    parser.add_argument("--summary", default="", help="ship: one line for `models list`")
    parser.add_argument(
        "--max-rank",
        type=int,
        help="ship: cut the joined adapter to this rank (truncated SVD) to bound its size",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="ship: the output budget served, if not the one trained with (chosen on "
        "validation: benchmarks/tune_picker_max_tokens.py)",
    )
    parser.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        help="ship: decode constrained to the output format, if not as trained (chosen on "
        "validation: benchmarks/tune_picker_max_tokens.py --constrained)",
    )
    args = parser.parse_args(argv)
    if args.action == "ship":
        if len(args.names) != 1 or not args.name:
            sys.exit(
                "usage: ctxpick models ship FINAL_FOLDER --name NAME [--base ALIAS] "
                "[--summary TEXT] [--max-rank R] [--max-tokens N] [--[no-]constrained]"
            )
        try:
            picker, cut_error = ship(
                args.names[0],
                args.name,
                args.base,
                args.summary,
                args.max_rank,
                args.max_tokens,
                args.constrained,
            )
        except (OSError, ValueError) as err:  # a folder that is not a LoRA stage's final/
            sys.exit(f"ctxpick models ship: {err}")
        size = (picker.folder / ADAPTER_FILES[1]).stat().st_size / 2**20
        cut = (
            f", rank cut to {args.max_rank}: largest relative error {cut_error:.2e}"
            if cut_error
            else ""
        )
        print(f"{picker.folder}: adapter {size:.1f} MiB{cut}")
        print(f"pin it in ctxpick/picker/shipped.py SHIPPED:\n{pin_entry(picker)}")
        return
    if args.action == "prepare":
        for name in args.names or [*BUILTINS, *SHIPPED]:
            if name not in BUILTINS and name not in SHIPPED:
                sys.exit(
                    f"unknown model {name!r}: built-in {list(BUILTINS)}, shipped {list(SHIPPED)}"
                )
            shipped = name in SHIPPED
            path = (prepare_shipped if shipped else prepare)(name, force=args.force)
            print(f"{name}: {path}", flush=True)
    else:
        for alias, model in BUILTINS.items():
            path = prepared_path(alias)
            state = "prepared" if (path / "config.json").exists() else "not prepared"
            print(f"{alias:22s} base model   {model.hf_name:40s} {state}: {path}")
        for name, picker in SHIPPED.items():
            path = prepared_picker_path(picker)
            state = "prepared" if (path / "picker.json").exists() else "not prepared"
            print(f"{name:22s} picker on {picker.base}: {picker.summary} ({state}: {path})")


HYDRA_COMMANDS: dict[str, Callable[[Config], object]] = {
    "demo": _demo,
    "mine": _mine,
    "train": _train,
    "eval": _eval,
    "config": _print_config,
    "serve": _serve,
}
UTILITIES = {"data": _data, "models": _models, "openapi": _openapi}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return
    cmd, rest = argv[0], argv[1:]
    if cmd in HYDRA_COMMANDS:
        _hydra_app(cmd, HYDRA_COMMANDS[cmd], rest)
    elif cmd in UTILITIES:
        if cmd == "data" and (not rest or rest[0] != "stats"):
            sys.exit("usage: ctxpick data stats PATH [--format NAME]")
        UTILITIES[cmd](rest[1:] if cmd == "data" else rest)
    else:
        sys.exit(f"ctxpick: unknown command {cmd!r}\n\n{USAGE}")


if __name__ == "__main__":
    main()
