"""WGAN-GP (Gulrajani et al. 2017, "Improved Training of Wasserstein GANs") in plain PyTorch.

Architecture: the DCGAN-style networks of the paper's 64x64 experiments (the ``Generator`` /
``Discriminator`` pair of its reference code, ``gan_64x64.py``): a transposed-conv generator with
BatchNorm, and a strided-conv critic whose normalisation is *layer* norm over (C, H, W) with a per-channel
affine (``nn.GroupNorm(1, C)``, exactly the reference code's ``Layernorm``), because the penalty is on
the gradient of each sample's own output and batch norm would couple samples. The critic ends without a
bias: a constant shifts real and fake scores alike, so it would never receive a gradient.

``wgan_gp_iteration`` runs Algorithm 1 of the paper: ``n_critic`` critic updates on
``D(x~) - D(x) + lambda * (||grad D(x^)|| - 1)^2`` and one generator update on ``-D(G(z))``, with the
penalty's double backward through ``torch.autograd.grad(create_graph=True)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "WGANGP",
    "WGANGP_PRESETS",
    "Critic",
    "Generator",
    "WGANGPConfig",
    "gradient_penalty",
    "wgan_gp_iteration",
    "wgan_gp_optimizers",
]


@dataclass(frozen=True)
class WGANGPConfig:
    """WGAN-GP hyper-parameters; ``image_size`` must be a power of two >= 8."""

    image_size: int = 64
    channels: int = 3
    latent_dim: int = 128
    # Channels of the critic's first conv / the generator's last hidden layer (the DCGAN "dim").
    base_width: int = 64
    n_critic: int = 5
    gp_weight: float = 10.0
    # Adam settings of the paper's Algorithm 1 (alpha, beta1, beta2).
    learning_rate: float = 1e-4
    beta1: float = 0.0
    beta2: float = 0.9

    def __post_init__(self) -> None:
        size = self.image_size
        if size < 8 or size & (size - 1):
            raise ValueError(f"image_size must be a power of two >= 8, got {size}")
        if self.channels < 1 or self.latent_dim < 1 or self.base_width < 1 or self.n_critic < 1:
            raise ValueError(f"invalid WGANGPConfig: {self}")

    @property
    def num_stages(self) -> int:
        """Resolution doublings between the 4x4 seed and the image."""
        return int(math.log2(self.image_size)) - 2


WGANGP_PRESETS: dict[str, WGANGPConfig] = {
    "tiny": WGANGPConfig(image_size=16, channels=3, latent_dim=32, base_width=16),
    "small": WGANGPConfig(image_size=32, channels=3, latent_dim=64, base_width=32),
    # The paper's 64x64 DCGAN-style setting: latent 128, dim 64 (critic 64-128-256-512 channels).
    "full": WGANGPConfig(image_size=64, channels=3, latent_dim=128, base_width=64),
}


class Generator(nn.Module):
    """DCGAN generator: ``z [B, latent]`` -> 4x4 seed -> (ConvTranspose 4x4/2 + BN + ReLU)* -> tanh image."""

    def __init__(self, config: WGANGPConfig) -> None:
        super().__init__()
        self.config = config
        stages = config.num_stages
        width = config.base_width * 2 ** (stages - 1)
        # Convs feeding a BatchNorm carry no bias: the norm's shift would cancel it.
        self.project = nn.ConvTranspose2d(config.latent_dim, width, kernel_size=4, bias=False)
        self.project_bn = nn.BatchNorm2d(width)
        self.project_act = nn.ReLU()
        blocks: list[nn.Module] = []
        for _ in range(stages - 1):
            blocks += [
                nn.ConvTranspose2d(width, width // 2, kernel_size=4, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(width // 2),
                nn.ReLU(),
            ]
            width //= 2
        self.blocks = nn.Sequential(*blocks)
        self.to_image = nn.ConvTranspose2d(width, config.channels, kernel_size=4, stride=2, padding=1)
        self.out_act = nn.Tanh()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """``z [B, latent_dim]`` -> images ``[B, channels, image_size, image_size]`` in [-1, 1]."""
        x = self.project_act(self.project_bn(self.project(z[:, :, None, None])))
        return self.out_act(self.to_image(self.blocks(x)))


class Critic(nn.Module):
    """DCGAN critic with layer norm: (Conv 4x4/2 + LayerNorm + LeakyReLU)* -> 4x4 conv -> score ``[B]``."""

    def __init__(self, config: WGANGPConfig) -> None:
        super().__init__()
        self.config = config
        width = config.base_width
        self.from_image = nn.Conv2d(config.channels, width, kernel_size=4, stride=2, padding=1)
        self.from_image_act = nn.LeakyReLU(0.2)
        blocks: list[nn.Module] = []
        for _ in range(config.num_stages - 1):
            blocks += [
                nn.Conv2d(width, width * 2, kernel_size=4, stride=2, padding=1, bias=False),
                nn.GroupNorm(1, width * 2),  # layer norm over (C, H, W) with per-channel affine
                nn.LeakyReLU(0.2),
            ]
            width *= 2
        self.blocks = nn.Sequential(*blocks)
        self.score = nn.Conv2d(width, 1, kernel_size=4, bias=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``images [B, C, S, S]`` -> unbounded critic scores ``[B]``."""
        return self.score(self.blocks(self.from_image_act(self.from_image(images)))).flatten()


class WGANGP(nn.Module):
    """Container for the ``generator`` and ``critic`` of one WGAN-GP."""

    def __init__(self, config: WGANGPConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else WGANGPConfig()
        self.generator = Generator(config)
        self.critic = Critic(config)

    def sample_latent(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Standard-normal latent codes on the model's device."""
        device = next(self.parameters()).device
        return torch.randn((batch_size, self.config.latent_dim), device=device, generator=generator)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Generate images from latent codes."""
        return self.generator(z)


def gradient_penalty(
    critic: nn.Module,
    real: torch.Tensor,
    fake: torch.Tensor,
    gp_weight: float = 10.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``gp_weight * E[(||grad_x critic(x^)||_2 - 1)^2]`` on random interpolates ``x^`` of real and fake.

    One uniform mixing coefficient per sample. The gradient is taken with ``create_graph=True`` so that
    backpropagating the penalty differentiates through it (double backward). For a linear critic
    ``f(x) = w.x + b`` the result is exactly ``gp_weight * (||w|| - 1)^2``.
    """
    alpha_shape = (real.shape[0],) + (1,) * (real.dim() - 1)
    alpha = torch.rand(alpha_shape, device=real.device, dtype=real.dtype, generator=generator)
    # A fresh leaf: the penalty is a function of the critic only, not of the generator that made `fake`.
    interpolates = (alpha * real.detach() + (1 - alpha) * fake.detach()).requires_grad_(True)
    scores = critic(interpolates)
    (grad,) = torch.autograd.grad(scores.sum(), interpolates, create_graph=True)
    # The epsilon keeps the norm differentiable at a zero gradient.
    norms = torch.sqrt(grad.flatten(1).square().sum(dim=1) + 1e-12)
    return gp_weight * (norms - 1).square().mean()


def wgan_gp_optimizers(model: WGANGP) -> tuple[torch.optim.Adam, torch.optim.Adam]:
    """Adam optimisers ``(generator, critic)`` with the paper's settings (lr 1e-4, betas (0, 0.9))."""
    cfg = model.config
    betas = (cfg.beta1, cfg.beta2)
    return (
        torch.optim.Adam(model.generator.parameters(), lr=cfg.learning_rate, betas=betas),
        torch.optim.Adam(model.critic.parameters(), lr=cfg.learning_rate, betas=betas),
    )


def wgan_gp_iteration(
    model: WGANGP,
    generator_optimizer: torch.optim.Optimizer,
    critic_optimizer: torch.optim.Optimizer,
    real: torch.Tensor | Sequence[torch.Tensor],
    rng: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """One generator iteration of Algorithm 1: ``n_critic`` critic steps, then one generator step.

    ``real`` is either one batch ``[B, C, S, S]`` (reused for every critic step) or ``n_critic`` batches.
    Returns detached scalars ``critic_loss``, ``wasserstein`` (estimate of the distance, last critic step),
    ``gradient_penalty`` and ``generator_loss``; no host synchronisation happens here.
    """
    cfg = model.config
    batches = [real] * cfg.n_critic if isinstance(real, torch.Tensor) else list(real)
    if len(batches) != cfg.n_critic:
        raise ValueError(f"expected {cfg.n_critic} real batches, got {len(batches)}")
    gen, critic = model.generator, model.critic
    stats: dict[str, torch.Tensor] = {}
    for batch in batches:
        z = model.sample_latent(batch.shape[0], rng)
        with torch.no_grad():
            fake = gen(z)
        real_score = critic(batch).mean()
        fake_score = critic(fake).mean()
        penalty = gradient_penalty(critic, batch, fake, cfg.gp_weight, rng)
        critic_loss = fake_score - real_score + penalty
        critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        critic_optimizer.step()
        stats["critic_loss"] = critic_loss.detach()
        stats["wasserstein"] = (real_score - fake_score).detach()
        stats["gradient_penalty"] = penalty.detach()

    # Freeze the critic for the generator step: its weight gradients would be discarded anyway.
    flags = [p.requires_grad for p in critic.parameters()]
    for p in critic.parameters():
        p.requires_grad_(False)
    try:
        z = model.sample_latent(batches[-1].shape[0], rng)
        generator_loss = -critic(gen(z)).mean()
        generator_optimizer.zero_grad(set_to_none=True)
        generator_loss.backward()
        generator_optimizer.step()
    finally:
        for p, flag in zip(critic.parameters(), flags, strict=True):
            p.requires_grad_(flag)
    stats["generator_loss"] = generator_loss.detach()
    return stats
