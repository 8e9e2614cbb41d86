"""Choice of weight transfer, and the parameter stream vLLM's GPU transfer engines read."""

from dataclasses import asdict

import pytest
import ray
import torch
from conftest import TINY_DECODER
from transformers import AutoModelForCausalLM, LlamaConfig

from ctxpick.config import ConfigError, compose
from ctxpick.engines.ray_pool import EngineConfig
from ctxpick.rl.learner import LearnerConfig
from ctxpick.rl.lora import apply_lora
from ctxpick.rl.weight_sync import GatheredSource, adapter_serving, resolve_mode


def _pools(engines, engine_gpus, learners, learner_gpus):
    return (
        EngineConfig(num_actors=engines, num_cpus_per_actor=0.25, num_gpus_per_actor=engine_gpus),
        LearnerConfig(
            num_actors=learners, num_cpus_per_actor=0.25, num_gpus_per_actor=learner_gpus
        ),
    )


def test_transfer_mode_follows_the_placement():
    """IPC only where the placement puts every engine on a learner's GPU: fractions alone do
    not (two bundles of their own may land on two GPUs)."""
    assert resolve_mode("auto", *_pools(1, 0, 1, 0)) == "object_store"  # CPU
    assert resolve_mode("auto", *_pools(1, 1, 1, 1)) == "nccl"  # their own GPUs
    assert resolve_mode("auto", *_pools(1, 0.5, 1, 0.4)) == "ipc"  # one bundle, one GPU
    assert resolve_mode("auto", *_pools(2, 0.5, 2, 0.25)) == "ipc"
    assert resolve_mode("auto", *_pools(1, 0.6, 1, 0.6)) == "nccl"  # no one GPU holds both
    # An engine without a learner: its own bundle may or may not share a learner's GPU.
    assert resolve_mode("auto", *_pools(2, 0.3, 1, 0.3)) == "object_store"
    with pytest.raises(ValueError, match="may put a rollout engine on a learner's GPU"):
        resolve_mode("nccl", *_pools(2, 0.3, 1, 0.3))
    spread = compose(
        ["rl.rollout.num_actors=2", "rl.rollout.num_gpus_per_actor=0.3"]
        + ["rl.learner.num_gpus_per_actor=0.3"]
    )
    assert spread.rl.transfer_mode() == "object_store"
    assert resolve_mode("object_store", *_pools(1, 1, 1, 1)) == "object_store"
    with pytest.raises(ValueError, match="needs CUDA learners and rollout workers"):
        resolve_mode("nccl", *_pools(1, 0, 1, 0))
    with pytest.raises(ValueError, match="ipc needs each rollout engine placed on a learner"):
        resolve_mode("ipc", *_pools(2, 0.3, 1, 0.3))
    with pytest.raises(ValueError, match="NCCL cannot join two ranks on one GPU"):
        resolve_mode("nccl", *_pools(1, 0.5, 1, 0.5))  # placed together: ipc
    with pytest.raises(ConfigError, match="rl.weight_transfer must be one of"):
        compose(["rl.weight_transfer=carrier-pigeon"])


@ray.remote(num_cpus=0)
class Endpoint:
    """Stands in for a vLLM engine's weight-transfer endpoint (the actor method
    ``RayVLLMWeightSyncClient`` calls): records what it is told and the GPU Ray gave it."""

    def __init__(self):
        self.init_infos = []

    def init_weight_transfer_engine(self, request):
        self.init_infos.append(request.init_info)

    def told(self):
        return self.init_infos

    def gpus(self):
        return ray.get_gpu_ids()


def test_each_engine_joins_the_nccl_group_at_its_own_rank(ray_cluster):
    """What vLLM's NCCL trainer engine sends the client for 3 engines: every engine must get a
    distinct rank in 1..3 (the learner is 0) of a world of 4, or the rendezvous never ends."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferInitInfo
    from vllm.distributed.weight_transfer.nccl_common import (
        NCCLWeightTransferInitInfo,
        worker_init_payload,
    )

    from ctxpick.rl.engine_client import RankedEngines

    endpoints = [Endpoint.remote() for _ in range(3)]
    trainer_side = NCCLWeightTransferInitInfo(
        master_address="127.0.0.1", master_port=29500, rank_offset=1, world_size=4
    )
    RankedEngines(endpoints).init_weight_transfer_engine(worker_init_payload(trainer_side))
    told = [
        NCCLWeightTransferInitInfo(**i) for [i] in ray.get([e.told.remote() for e in endpoints])
    ]
    # A vLLM engine of one worker at data-parallel index 0 joins at its rank_offset.
    assert [info.rank_offset for info in told] == [1, 2, 3]
    assert {info.world_size for info in told} == {4}
    assert {(info.master_address, info.master_port) for info in told} == {("127.0.0.1", 29500)}

    ipc = asdict(IPCWeightTransferInitInfo(packed=True))
    RankedEngines(endpoints).init_weight_transfer_engine(ipc)
    assert [t[-1] for t in ray.get([e.told.remote() for e in endpoints])] == [ipc] * 3


def test_a_colocated_placement_puts_each_engine_on_its_learners_gpu(ray_cluster):
    """On a node of two (logical) GPUs, the stage's bundles for 2 engines (0.5 GPU) and 2
    learners (0.25 GPU): Ray gives engine i learner i's GPU, and the pairs different GPUs."""
    from ctxpick.engines.ray_pool import in_bundle, reserve
    from ctxpick.rl.placement import stage_bundles

    node = ray_cluster.add_node(num_cpus=1, num_gpus=2, node_ip_address="127.0.0.1")
    ray_cluster.wait_for_nodes()
    rollout, learner = _pools(2, 0.5, 2, 0.25)
    bundles, learners_at = stage_bundles(rollout, learner)
    pg = reserve(bundles, "PACK", "colocated")
    try:

        def place(pool, first):
            return [
                Endpoint.options(
                    num_cpus=pool.num_cpus_per_actor,
                    num_gpus=pool.num_gpus_per_actor,
                    scheduling_strategy=in_bundle((pg, first), i),
                ).remote()
                for i in range(pool.num_actors)
            ]

        engines, learners = place(rollout, 0), place(learner, learners_at)
        engine_gpus = ray.get([e.gpus.remote() for e in engines])
        learner_gpus = ray.get([a.gpus.remote() for a in learners])
        assert engine_gpus == learner_gpus
        assert len({tuple(g) for g in engine_gpus}) == 2 and all(len(g) == 1 for g in engine_gpus)
        for actor in engines + learners:
            ray.kill(actor)
    finally:
        ray.util.remove_placement_group(pg)
        ray_cluster.remove_node(node)


def test_a_reservation_no_cluster_can_meet_fails_by_its_deadline_and_leaves_nothing(
    ray_cluster,
):
    from ctxpick.engines.ray_pool import reserve
    from ctxpick.rl.learner_group import LearnerGroup

    with pytest.raises(TimeoutError, match=r"no room for \[\{'CPU': 1000\}\].*reserve_timeout"):
        reserve([{"CPU": 1000}], "PACK", "too-big", timeout_s=1)
    with pytest.raises(ValueError, match=r"\[zero\] reservation timeout 0 s: expected > 0"):
        reserve([{"CPU": 1}], "PACK", "zero", timeout_s=0)
    with pytest.raises(ValueError, match=r"\[nan\] reservation timeout nan s: expected > 0"):
        reserve([{"CPU": 1}], "PACK", "nan", timeout_s=float("nan"))
    with pytest.raises(TimeoutError, match=r"\[ctxpick-learners\] the cluster had no room"):
        LearnerGroup(LearnerConfig(num_cpus_per_actor=1000), lr=1e-4, reserve_timeout_s=1)
    states = [pg["state"] for pg in ray.util.placement_group_table().values()]
    assert "PENDING" not in states  # removed, so it cannot take room that frees up later


def test_weight_source_streams_full_merged_weights_under_hf_names():
    """What a vLLM trainer engine broadcasts: metadata and iteration agree element for
    element (vLLM sizes its receive buffers from the one and sends the other), under the
    names of the model's own state dict, LoRA merged."""
    torch.manual_seed(0)
    config = LlamaConfig(**TINY_DECODER)
    plain = AutoModelForCausalLM.from_config(config)
    names = [n for n, _ in plain.named_parameters()]
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(plain.state_dict())
    apply_lora(model, rank=2, alpha=4.0, targets=["q_proj"])
    lora = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        lora.lora_B["default"].weight.normal_()
    source = GatheredSource(model, zero_stage=0).source()
    meta = source.metadata()
    pairs = list(source)
    assert [m.name for m in meta] == [n for n, _ in pairs] == names
    assert all(
        m.shape == tuple(t.shape) and m.dtype == t.dtype
        for m, (_, t) in zip(meta, pairs, strict=True)
    )
    q = dict(pairs)["model.layers.0.self_attn.q_proj.weight"]
    delta = (4.0 / 2) * lora.lora_B["default"].weight @ lora.lora_A["default"].weight
    assert torch.allclose(q, lora.base_layer.weight + delta)
    assert not torch.allclose(q, plain.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    assert len(list(source)) == len(meta)  # re-iterable: one fresh pass per sync


def test_a_lora_learner_syncs_its_adapter_alone_on_cpu_and_gpu():
    """rl.lora_sync=adapter: the adapter travels through the object store whatever the
    placement; vLLM's GPU transfers carry merged weights, so asking for one is refused."""
    for pools in (_pools(1, 0, 1, 0), _pools(1, 1, 1, 1), _pools(1, 0.5, 1, 0.4)):
        assert resolve_mode("auto", *pools, adapter=True) == "adapter"
    assert compose(["rl.learner.lora_rank=8"]).rl.transfer_mode() == "adapter"
    merged = compose(["rl.learner.lora_rank=8", "rl.lora_sync=merged"])
    assert merged.rl.transfer_mode() == "object_store"
    assert compose(["rl.lora_sync=adapter"]).rl.transfer_mode() == "object_store"  # no LoRA
    with pytest.raises(ValueError, match="nccl moves whole merged weights"):
        resolve_mode("nccl", *_pools(1, 1, 1, 1), adapter=True)
    with pytest.raises(ConfigError, match="rl.lora_sync must be adapter or merged"):
        compose(["rl.lora_sync=diff"])


def test_engines_merge_the_adapter_on_cpu_and_serve_it_with_vllms_lora_on_gpu():
    cpu, gpu = _pools(1, 0, 1, 0)[0], _pools(1, 1, 1, 1)[0]
    assert adapter_serving("auto", cpu) == "merge" and adapter_serving("auto", gpu) == "lora"
    assert adapter_serving("lora", cpu) == "lora"
    with pytest.raises(ValueError, match="merge runs in the engine's own process"):
        adapter_serving("merge", gpu)
    with pytest.raises(ConfigError, match="rl.adapter_serving must be one of"):
        compose(["rl.adapter_serving=fuse"])
