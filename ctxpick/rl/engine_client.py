"""The learners' control plane over the rollout engines for vLLM's GPU weight transfer."""

from __future__ import annotations

from typing import Any

import ray
from vllm.distributed.weight_transfer import RayVLLMWeightSyncClient
from vllm.distributed.weight_transfer.base import WeightTransferInitRequest


class RankedEngines(RayVLLMWeightSyncClient):
    """vLLM's Ray client, giving each engine its own NCCL rank. vLLM hands every engine the
    same init info, whose ``rank_offset`` places an engine's first worker in the trainer's
    group; that suits one vLLM whose data-parallel workers number themselves, but each of our
    engines is a vLLM of its own with one worker at data-parallel index 0, so all N would
    join as rank 1 of 1 + N and the rendezvous would never complete. Engine i joins at
    ``rank_offset + i``; init infos without a rank (IPC) go to every engine unchanged."""

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        offset = init_info.get("rank_offset")
        infos = [
            init_info if offset is None else {**init_info, "rank_offset": offset + i}
            for i in range(len(self.handles))
        ]
        ray.get(
            [
                handle.init_weight_transfer_engine.remote(WeightTransferInitRequest(init_info=info))
                for handle, info in zip(self.handles, infos, strict=True)
            ]
        )
