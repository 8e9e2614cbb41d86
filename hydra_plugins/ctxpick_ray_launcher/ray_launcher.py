"""``hydra/launcher=ray``: a multirun's jobs run concurrently as Ray tasks on the cluster in
``ray.address`` (or a local one), e.g. ``ctxpick train --multirun hydra/launcher=ray
stage.redundancy_margin=0,1,2``.

Why our own launcher rather than hydra-ray-launcher: that plugin pins ``cloudpickle<3``, which
the Ray and vLLM releases here need newer, and it runs each job in its own task without any
notion of what the job reserves. Why not Ray Tune: a stage already reserves its actors in one
placement group sized from its config (:class:`ctxpick.rl.trainer.Run`), and a Tune trial's
group would reserve them a second time. Here a job's task takes no resources of its own; its
stage's placement group is what it holds, so points run side by side as far as the cluster has
room and the rest wait whole (no point holds half of what it needs). Every point keeps Hydra's
job folder, ``.hydra/overrides.yaml`` and callbacks (the sweep table at the end).
"""

# No `from __future__ import annotations`: Hydra executes plugin modules before registering
# them in sys.modules, where dataclasses look string annotations up.
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


@dataclass
class RayLauncherConf:
    _target_: str = "hydra_plugins.ctxpick_ray_launcher.ray_launcher.RayLauncher"
    max_concurrent: int = 0  # jobs in flight at once; 0: all (the cluster's room decides)


ConfigStore.instance().store(
    group="hydra/launcher", name="ray", node=RayLauncherConf, provider="ctxpick"
)


def _run_point(
    state: dict, hydra_context: HydraContext, task: TaskFunction, config: DictConfig
) -> JobReturn:
    setup_globals()
    Singleton.set_state(state)  # the config store and resolvers of the launching process
    return run_job(
        hydra_context=hydra_context,
        task_function=task,
        config=config,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )


class RayLauncher(Launcher):
    def __init__(self, max_concurrent: int = 0) -> None:
        self.max_concurrent = max_concurrent

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context, self.task_function, self.config = hydra_context, task_function, config

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        import ray

        from ctxpick.engines.ray_pool import init_ray

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        init_ray(self.config.ray.address, self.config.ray.num_cpus)
        # The tasks may run on other nodes, from other folders: give them absolute paths.
        sweep_dir = os.path.abspath(str(self.config.hydra.sweep.dir))
        os.makedirs(sweep_dir, exist_ok=True)
        state = Singleton.get_state()
        point = ray.remote(_run_point).options(num_cpus=0, max_retries=0)
        log.info(f"Launching {len(job_overrides)} jobs on Ray ({ray.cluster_resources()})")
        refs, in_flight = [], []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides)
            )
            with open_dict(config):
                config.hydra.job.id = config.hydra.job.num = idx
                config.hydra.sweep.dir = sweep_dir
            if self.max_concurrent and len(in_flight) >= self.max_concurrent:
                _, in_flight = ray.wait(in_flight, num_returns=1)
            refs.append(point.remote(state, self.hydra_context, self.task_function, config))
            in_flight.append(refs[-1])
        return ray.get(refs)
