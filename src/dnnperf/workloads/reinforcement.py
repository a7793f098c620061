"""Reinforcement learning: an actor-critic (A3C's network and loss) playing a built-in Catch game.

The game runs and renders its frames on the CPU inside every step, as Atari emulation does in A3C, so
the CPU-bound behaviour TBD reports can be seen. The batch size is the number of games played side by
side; the update is synchronous (all games step together, the form also called A2C), which has the
same arithmetic per update as asynchronous actor-learners and is the form that runs on a GPU.
"""

from __future__ import annotations

import torch

from dnnperf.data.formats import EnvironmentFormat
from dnnperf.models.reinforcement import (
    A3C_PRESETS,
    A3CConfig,
    ActorCritic,
    CatchGame,
    a3c_loss,
    a3c_optimizer,
    rollout,
)
from dnnperf.workloads.base import Batch, Stages, Task, Workload, backward_and_update, no_stages
from dnnperf.workloads.registry import register


class A3CTask(Task):
    def __init__(self, config: A3CConfig, device: torch.device) -> None:
        self.config = config
        self.model = ActorCritic(config).to(device)
        self.optimizer = a3c_optimizer(self.model, config)
        self.games: CatchGame | None = None

    def _games_for(self, seeds: torch.Tensor) -> CatchGame:
        """The running games, (re)started when the number of games asked for changes.
        Episodes carry on across steps, as in A3C."""
        if self.games is None or self.games.num_envs != seeds.numel():
            self.games = CatchGame(
                seeds.numel(), self.config.image_size, self.config.frame_stack, seed=int(seeds[0])
            )
        return self.games

    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        games = self._games_for(batch["env_seed"])
        with stages("environment"):  # play rollout_steps steps of every game, acting with the policy
            played = rollout(games, self.model, self.config.rollout_steps)
        with stages("forward"):
            loss, _ = a3c_loss(self.model, played, self.config)
        backward_and_update(loss, self.optimizer, stages)
        return loss.detach()


A3C = register(
    Workload(
        name="a3c",
        domain="reinforcement learning",
        summary="actor-critic playing a built-in Catch game rendered on the CPU",
        presets=A3C_PRESETS,
        default_batch_size={name: config.num_envs for name, config in A3C_PRESETS.items()},
        make_task=A3CTask,
        make_data=lambda c: EnvironmentFormat(),
        sample_unit="game",
        notes=("batch size = games played side by side; one step plays rollout_steps frames of each",),
    )
)
