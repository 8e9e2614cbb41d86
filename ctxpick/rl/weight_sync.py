"""How new weights reach the rollout workers after each update.

* ``adapter`` (a LoRA learner, ``rl.lora_sync: adapter``, CPU and GPU alike): the engines load
  the base model once and each sync ships only the adapter (PEFT format, megabytes) through
  Ray's object store (:meth:`ctxpick.engines.vllm_engine.VLLMEngine.load_adapter`). An engine
  serves it with vLLM's LoRA support (``rl.adapter_serving: lora``, GPU's default) or merges
  it into its own weights (``merge``, CPU's default: vLLM-CPU's LoRA kernels gather the
  adapter's matrices token by token, which made rollouts ~4x slower, benchmarks/RESULTS.md).
  vLLM's GPU transfer engines below write into the base model's parameters, so they carry
  merged weights only.
* ``object_store`` (CPU, and any machine without CUDA): rank 0 serialises the whole model into
  safetensors buckets, Ray's object store carries them to every node, and each vLLM engine
  reloads them in place (:meth:`ctxpick.engines.vllm_engine.VLLMEngine.load_weights`).
* ``nccl`` (CUDA, learners and engines on different GPUs): vLLM's own weight-transfer engine
  (``WeightTransferConfig(backend="nccl")``, written against vLLM 0.32.0, pinned in the
  Makefile): rank 0 broadcasts packed buckets straight from GPU memory to every engine's GPU.
* ``ipc`` (CUDA, an engine sharing the learner's GPU): vLLM's CUDA-IPC backend hands the
  engine handles to the learner's own tensors; nothing is copied over a wire.

``auto`` picks ``object_store`` without CUDA, ``ipc`` when the placement puts every engine on a
learner's GPU (:func:`ctxpick.rl.placement.colocated`), ``object_store`` again where GPU
fractions in bundles of their own may or may not share a GPU (neither IPC nor NCCL is safe
there), and ``nccl`` otherwise. In every mode
all learner ranks iterate the parameters in step: under ZeRO-3 each parameter is a collective
gather.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ctxpick.engines.ray_pool import ActorPoolConfig
from ctxpick.rl.placement import colocated

MODES = ("auto", "object_store", "nccl", "ipc")


def resolve_mode(
    mode: str, rollout: ActorPoolConfig, learner: ActorPoolConfig, adapter: bool = False
) -> str:
    """The transfer for a placement: GPUs on both sides mean CUDA learners and engines; IPC
    needs every engine on a learner's GPU, and NCCL cannot join two ranks on one GPU.
    ``adapter``: a LoRA learner whose rollouts take the adapter alone (``adapter`` mode)."""
    if mode not in MODES:
        raise ValueError(f"rl.weight_transfer must be one of {MODES}, not {mode!r}")
    if adapter:
        if mode in ("nccl", "ipc"):
            raise ValueError(
                f"rl.weight_transfer={mode} moves whole merged weights, but rl.lora_sync=adapter "
                "ships the LoRA adapter alone through the object store: set "
                "rl.weight_transfer=auto, or rl.lora_sync=merged"
            )
        return "adapter"
    cuda = learner.num_gpus_per_actor > 0 and rollout.num_gpus_per_actor > 0
    shared = colocated(rollout, learner)
    # Fractions that fit one GPU, in bundles of their own: Ray may or may not put an engine on
    # a learner's GPU, so neither IPC (needs it) nor NCCL (cannot have it) is safe.
    unsure = cuda and not shared and learner.num_gpus_per_actor + rollout.num_gpus_per_actor <= 1
    if mode == "auto":
        return "object_store" if not cuda or unsure else "ipc" if shared else "nccl"
    if mode != "object_store" and not cuda:
        raise ValueError(
            f"rl.weight_transfer={mode} needs CUDA learners and rollout workers "
            "(num_gpus_per_actor > 0 on both)"
        )
    if mode == "ipc" and not shared:
        raise ValueError(
            "rl.weight_transfer=ipc needs each rollout engine placed on a learner's GPU: "
            "fractional num_gpus_per_actor on both that sum to <= 1, and rl.rollout.num_actors "
            "<= rl.learner.num_actors (engine i then shares learner i's bundle)"
        )
    if mode == "nccl" and unsure:
        raise ValueError(
            "rl.weight_transfer=nccl: fractional GPUs that fit one GPU, in bundles of their own, "
            "may put a rollout engine on a learner's GPU, where NCCL cannot join two ranks; use "
            "auto (object_store here), or place them together (ipc)"
        )
    if mode == "nccl" and shared:
        raise ValueError(
            "rl.weight_transfer=nccl: this placement puts each rollout engine on its learner's "
            "GPU, and NCCL cannot join two ranks on one GPU; use ipc (or auto)"
        )
    return mode


SERVING = ("auto", "lora", "merge")


def adapter_serving(choice: str, rollout: ActorPoolConfig) -> str:
    """How rollout engines apply a synced adapter: ``lora`` (vLLM's LoRA support) or
    ``merge`` (into the engine's weights, in the engine's process: CPU workers, whose vLLM
    core runs in the actor). ``auto``: ``lora`` on GPU, ``merge`` on CPU."""
    if choice not in SERVING:
        raise ValueError(f"rl.adapter_serving must be one of {SERVING}, not {choice!r}")
    gpu = rollout.num_gpus_per_actor > 0
    if choice == "merge" and gpu:
        raise ValueError(
            "rl.adapter_serving=merge runs in the engine's own process, which only CPU rollout "
            "workers share with their actor: use lora (or auto) on GPU"
        )
    return choice if choice != "auto" else "lora" if gpu else "merge"


class GatheredSource:
    """A vLLM ``WeightSource`` over a DeepSpeed-wrapped model: full parameters under the HF
    names vLLM loads, LoRA merged, each gathered (ZeRO-3) only while it is sent."""

    def __init__(self, module: Any, zero_stage: int) -> None:
        self.module, self.zero3 = module, zero_stage == 3
        self._meta: list[Any] | None = None

    def _gather(self, params: list[Any]) -> Any:
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, enabled=self.zero3)

    def _pairs(self) -> Iterator[tuple[str, Any]]:
        from ctxpick.rl.lora import full_parameters

        for name, tensor in full_parameters(self.module, self._gather):
            # Under ZeRO-3 the gathered storage is released when the next parameter is asked
            # for, while a packed sender may still hold it: send a copy.
            yield name, tensor.clone() if self.zero3 else tensor.contiguous()

    def source(self) -> Any:
        """The ``vllm.distributed.weight_transfer.WeightSource`` to hand vLLM."""
        from vllm.distributed.weight_transfer import ParamMeta, WeightSource

        outer = self

        class _Source(WeightSource):
            def metadata(self) -> list[ParamMeta]:
                if outer._meta is None:  # shapes are fixed; learn them with one pass
                    outer._meta = [
                        ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in outer._pairs()
                    ]
                return outer._meta

            def __iter__(self) -> Iterator[tuple[str, Any]]:
                return outer._pairs()

        return _Source()


def trainer_engine(
    mode: str, module: Any, zero_stage: int, rank: int, engines: list[Any], rendezvous: Any
) -> Any:
    """vLLM's trainer-side transfer engine for ``mode`` (``nccl`` or ``ipc``), built on every
    learner rank; rank 0 drives the engines through their Ray handles. ``rendezvous``:
    ``(address, port)`` for NCCL, where learner rank 0 is NCCL rank 0 and engine i rank 1 + i."""
    from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

    from ctxpick.rl.engine_client import RankedEngines

    source = GatheredSource(module, zero_stage).source()
    client = RankedEngines(engines)
    if mode == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        address, port = rendezvous
        info: Any = NCCLTrainerInitInfo(address, port, 1 + len(engines), rank=rank)
    else:
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        info = IPCTrainerInitInfo(rank=rank, packed=True)
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
