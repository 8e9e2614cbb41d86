"""How new weights reach the rollout workers after each update.

* ``object_store`` (CPU, and any machine without CUDA): rank 0 serialises the whole model into
  safetensors buckets, Ray's object store carries them to every node, and each vLLM engine
  reloads them in place (:meth:`ctxpick.engines.vllm_engine.VLLMEngine.load_weights`).
* ``nccl`` (CUDA, learners and engines on different GPUs): vLLM's own weight-transfer engine
  (``WeightTransferConfig(backend="nccl")``, written against vLLM 0.32.0, pinned in the
  Makefile): rank 0 broadcasts packed buckets straight from GPU memory to every engine's GPU.
* ``ipc`` (CUDA, an engine sharing the learner's GPU): vLLM's CUDA-IPC backend hands the
  engine handles to the learner's own tensors; nothing is copied over a wire.

``auto`` picks ``object_store`` without CUDA, ``ipc`` when learners and rollout workers hold
fractions of one GPU each (colocated), and ``nccl`` otherwise. In every mode all learner ranks
iterate the parameters in step: under ZeRO-3 each parameter is a collective gather.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MODES = ("auto", "object_store", "nccl", "ipc")


def resolve_mode(mode: str, learner_gpus: float, rollout_gpus: float) -> str:
    """The transfer for a placement: GPUs on both sides mean CUDA learners and engines."""
    if mode not in MODES:
        raise ValueError(f"rl.weight_transfer must be one of {MODES}, not {mode!r}")
    cuda = learner_gpus > 0 and rollout_gpus > 0
    if mode != "auto":
        if mode != "object_store" and not cuda:
            raise ValueError(
                f"rl.weight_transfer={mode} needs CUDA learners and rollout workers "
                "(num_gpus_per_actor > 0 on both)"
            )
        return mode
    if not cuda:
        return "object_store"
    return "ipc" if learner_gpus < 1 and rollout_gpus < 1 else "nccl"


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
    ``(address, port)`` for NCCL, where rank 0 is NCCL rank 0 and each engine one more rank."""
    from vllm.distributed.weight_transfer import (
        RayVLLMWeightSyncClient,
        WeightTransferTrainerFactory,
    )

    source = GatheredSource(module, zero_stage).source()
    client = RayVLLMWeightSyncClient(engines)
    if mode == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        address, port = rendezvous
        info: Any = NCCLTrainerInitInfo(address, port, 1 + len(engines), rank=rank)
    else:
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        info = IPCTrainerInitInfo(rank=rank, packed=True)
    return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
