"""Adversarial training: WGAN-GP (Gulrajani et al. 2017), DCGAN-style networks.

One step is one generator iteration of the paper's Algorithm 1: ``n_critic`` critic updates, each with
the gradient penalty computed through double backward, then one generator update. Every critic update
reuses the step's batch of real images, so a step reads one batch like the other workloads.
"""

from __future__ import annotations

import torch

from dnnperf.data.formats import ImageFormat
from dnnperf.models.adversarial import (
    WGANGP,
    WGANGP_PRESETS,
    WGANGPConfig,
    gradient_penalty,
    wgan_gp_optimizers,
)
from dnnperf.workloads.base import Batch, Stages, Task, Workload, backward_and_update, no_stages
from dnnperf.workloads.registry import register


class WGANGPTask(Task):
    def __init__(self, config: WGANGPConfig, device: torch.device) -> None:
        self.config = config
        self.model = WGANGP(config).to(device)
        self.generator_optimizer, self.critic_optimizer = wgan_gp_optimizers(self.model)
        self._critic_parameters = list(self.model.critic.parameters())

    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        real = batch["image"]
        generator, critic = self.model.generator, self.model.critic
        for _ in range(self.config.n_critic):
            with stages("forward"):
                with torch.no_grad():
                    fake = generator(self.model.sample_latent(real.shape[0]))
                wasserstein = critic(real).mean() - critic(fake).mean()
                critic_loss = -wasserstein + gradient_penalty(critic, real, fake, self.config.gp_weight)
            # backward differentiates through the penalty's gradient: double backward. Into the critic's
            # parameters only: a gradient left on the penalty's interpolates would hold its own graph
            # (create_graph) in a cycle the collector cannot see, leaking one batch of images per update.
            backward_and_update(critic_loss, self.critic_optimizer, stages, inputs=self._critic_parameters)

        with stages("forward"):
            critic.requires_grad_(False)  # the generator step needs no critic weight gradients
            try:
                generator_loss = -critic(generator(self.model.sample_latent(real.shape[0]))).mean()
            finally:
                critic.requires_grad_(True)
        backward_and_update(generator_loss, self.generator_optimizer, stages)
        return critic_loss.detach()


WGAN_GP = register(
    Workload(
        name="wgan_gp",
        domain="adversarial",
        summary="WGAN-GP: critic and generator updates, gradient penalty by double backward",
        presets=WGANGP_PRESETS,
        default_batch_size={"tiny": 8, "small": 32, "full": 64},
        make_task=WGANGPTask,
        make_data=lambda c: ImageFormat(image_size=c.image_size, num_classes=1, with_labels=False),
        sample_unit="image",
        notes=("one step = n_critic critic updates + 1 generator update; the loss reported is the critic's",),
    )
)
