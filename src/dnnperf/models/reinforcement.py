"""A3C (Mnih et al. 2016) on a built-in "Catch" game rendered to frames on the CPU, in plain PyTorch.

The game (``CatchGame``) keeps ``E`` independent games in numpy arrays: a ball falls from the top,
bouncing off the side walls, and the agent moves a paddle along the bottom to catch it. Every step draws
each game to a grayscale ``S x S`` frame pixel by pixel (background texture, an anti-aliased ball sprite, a
bevelled paddle sprite), so environment cost is real CPU work as with an Atari emulator, and the agent
sees a stack of the last ``frame_stack`` frames.

Learning is the A3C update of the paper's feed-forward agent: the Atari network (conv 16 8x8/4, conv 32
4x4/2, fc 256, softmax policy and linear value), ``t_max``-step rollouts, n-step returns bootstrapped from
the value of the last state, the policy gradient with advantage ``R - V``, a value loss and an entropy
bonus. The ``E`` actors run in lock-step in one process (the synchronous form, a.k.a. A2C) rather than as
Hogwild threads; the arithmetic of one update is the same, and it is the form that runs on a GPU.

The acting path runs under ``torch.no_grad``; ``a3c_loss`` then recomputes the rollout's logits and
values with gradients in one batched forward pass (identical values, since the parameters have not
changed in between), which is what A3C's per-thread graph over ``t_max`` steps amounts to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "A3C_PRESETS",
    "CATCH_NUM_ACTIONS",
    "A3CConfig",
    "ActorCritic",
    "CatchGame",
    "Rollout",
    "a3c_loss",
    "a3c_optimizer",
    "make_env",
    "rollout",
]


# Catch's actions: 0 stay, 1 left, 2 right.
CATCH_NUM_ACTIONS = 3


@dataclass(frozen=True)
class A3CConfig:
    """A3C hyper-parameters (defaults: the paper's Atari agent) plus the number of parallel games."""

    image_size: int = 84
    frame_stack: int = 4
    num_actions: int = 3
    hidden: int = 256
    rollout_steps: int = 5
    gamma: float = 0.99
    entropy_coef: float = 0.01
    value_coef: float = 0.5
    num_envs: int = 16
    # RMSProp learning rate (the usual A3C/A2C Atari value).
    learning_rate: float = 7e-4

    def __post_init__(self) -> None:
        if self.image_size < 20:
            raise ValueError(f"image_size must be >= 20 for the 8x8/4 + 4x4/2 convs, got {self.image_size}")
        if self.num_actions != CATCH_NUM_ACTIONS:
            raise ValueError(f"the Catch game has {CATCH_NUM_ACTIONS} actions, got {self.num_actions}")
        if min(self.frame_stack, self.hidden, self.rollout_steps, self.num_envs) < 1:
            raise ValueError(f"invalid A3CConfig: {self}")


A3C_PRESETS: dict[str, A3CConfig] = {
    "tiny": A3CConfig(image_size=32, frame_stack=2, hidden=64, rollout_steps=5, num_envs=8),
    "small": A3CConfig(image_size=64, frame_stack=4, hidden=128, rollout_steps=5, num_envs=16),
    # The paper's Atari setting: 84x84, 4 frames, fc 256, t_max 5, 16 actor-learners.
    "full": A3CConfig(image_size=84, frame_stack=4, hidden=256, rollout_steps=5, num_envs=16),
}


# ---------------------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------------------


class CatchGame:
    """``num_envs`` independent games of Catch, rendered to ``image_size`` grayscale frames every step.

    State (float pixel units, public so tests and tools can inspect or set it): ``ball_x``, ``ball_y``
    (ball centre), ``ball_vx``, ``ball_vy``, ``paddle_x`` (paddle centre), ``balls_left``. The paddle
    occupies rows ``paddle_top .. paddle_top + paddle_height - 1`` and columns within ``paddle_width / 2``
    of ``paddle_x``. ``background`` is the static ``[S, S]`` backdrop the sprites are drawn over.

    Actions: 0 stay, 1 left, 2 right (the paddle moves ``paddle_speed`` pixels, clamped to the screen).
    Each step moves the paddle, then the ball. When the ball's centre reaches ``catch_y`` (the row just
    above the paddle) the ball is resolved: reward +1 if ``|ball_x - paddle_x| <= paddle_width / 2``
    (caught), else -1 (missed); a new ball then drops from the top. An episode is ``balls_per_episode``
    balls; a finished game is reset at once (``done`` is True for that step, and the returned observation
    is the first one of the new episode).
    """

    NUM_ACTIONS = CATCH_NUM_ACTIONS

    def __init__(
        self,
        num_envs: int,
        image_size: int = 84,
        frame_stack: int = 4,
        seed: int | np.random.Generator | None = None,
        balls_per_episode: int = 3,
    ) -> None:
        if num_envs < 1 or image_size < 16 or frame_stack < 1 or balls_per_episode < 1:
            raise ValueError("invalid CatchGame arguments")
        self.num_envs = num_envs
        self.image_size = size = image_size
        self.frame_stack = frame_stack
        self.balls_per_episode = balls_per_episode
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        # Geometry scales with the screen so every size plays the same game.
        unit = size / 32.0
        self.ball_radius = 1.5 * unit
        self.paddle_width = 8.0 * unit
        self.paddle_height = max(2, round(1.5 * unit))
        self.paddle_top = size - 2 - self.paddle_height
        self.catch_y = self.paddle_top - self.ball_radius
        self.paddle_speed = 2.0 * unit
        # The ball falls in about 14 steps, within reach of the paddle from anywhere.
        self.fall_speed = 2.0 * unit
        self.max_drift = 1.0 * unit

        coords = np.arange(size, dtype=np.float32)
        self._xs = coords[None, None, :]  # broadcast shapes for per-pixel drawing
        self._ys = coords[None, :, None]
        # Static background: a faint vertical gradient with a dotted grid, so frames are not blank.
        gradient = 0.05 + 0.1 * coords[:, None] / size
        dots = ((np.arange(size)[:, None] % 8 == 0) & (np.arange(size)[None, :] % 8 == 0)) * 0.15
        self.background = (gradient + dots).astype(np.float32)

        shape = (num_envs,)
        self.ball_x = np.zeros(shape, np.float32)
        self.ball_y = np.zeros(shape, np.float32)
        self.ball_vx = np.zeros(shape, np.float32)
        self.ball_vy = np.zeros(shape, np.float32)
        self.paddle_x = np.zeros(shape, np.float32)
        self.balls_left = np.zeros(shape, np.int64)
        self._stack = np.zeros((num_envs, frame_stack, size, size), np.float32)
        self._started = False

    # -- state -----------------------------------------------------------------------------------------

    def _spawn_balls(self, mask: np.ndarray) -> None:
        count = int(mask.sum())
        if count == 0:
            return
        r = self.ball_radius
        self.ball_x[mask] = self.rng.uniform(r, self.image_size - r, count)
        self.ball_y[mask] = r
        self.ball_vx[mask] = self.rng.uniform(-self.max_drift, self.max_drift, count)
        self.ball_vy[mask] = self.fall_speed

    def _reset_games(self, mask: np.ndarray) -> None:
        self.paddle_x[mask] = self.image_size / 2
        self.balls_left[mask] = self.balls_per_episode
        self._spawn_balls(mask)

    # -- rendering -------------------------------------------------------------------------------------

    def render(self) -> np.ndarray:
        """Draw every game's current state: ``[E, S, S]`` float32 in [0, 1]."""
        # Anti-aliased disc: coverage falls from 1 to 0 across the one-pixel rim of the sprite.
        dist = np.sqrt(
            (self._xs - self.ball_x[:, None, None]) ** 2 + (self._ys - self.ball_y[:, None, None]) ** 2
        )
        ball = np.clip(self.ball_radius + 0.5 - dist, 0.0, 1.0)
        # Paddle: a filled bar with a brighter top edge (bevel).
        half = self.paddle_width / 2
        in_columns = np.abs(self._xs - self.paddle_x[:, None, None]) <= half
        rows = self._ys[0, :, 0]
        in_rows = (rows >= self.paddle_top) & (rows < self.paddle_top + self.paddle_height)
        top_row = rows == self.paddle_top
        paddle = in_columns * np.where(top_row, 1.0, 0.7).astype(np.float32)[None, :, None]
        paddle = paddle * in_rows[None, :, None]
        frames = np.maximum(self.background[None], 0.9 * ball)
        return np.maximum(frames, paddle).astype(np.float32, copy=False)

    def _observation(self) -> torch.Tensor:
        return torch.from_numpy(self._stack.copy())

    # -- API -------------------------------------------------------------------------------------------

    def reset(self) -> torch.Tensor:
        """Start every game afresh; returns the observation ``[E, frame_stack, S, S]`` (CPU, float32)."""
        self._reset_games(np.ones(self.num_envs, dtype=bool))
        self._stack[:] = self.render()[:, None]
        self._started = True
        return self._observation()

    def observation(self) -> torch.Tensor:
        """Current observation (resets first if the games have not started)."""
        return self._observation() if self._started else self.reset()

    def step(self, actions: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Advance every game by one frame: ``actions [E]`` -> ``(observations, rewards [E], dones [E])``."""
        if not self._started:
            self.reset()
        if isinstance(actions, torch.Tensor):
            actions = actions.detach().cpu().numpy()
        actions = np.asarray(actions).reshape(self.num_envs)
        move = np.where(actions == 1, -1.0, np.where(actions == 2, 1.0, 0.0)).astype(np.float32)
        half = self.paddle_width / 2
        self.paddle_x = np.clip(self.paddle_x + move * self.paddle_speed, half, self.image_size - half)

        r = self.ball_radius
        self.ball_x = self.ball_x + self.ball_vx
        self.ball_y = self.ball_y + self.ball_vy
        # Bounce off the side walls.
        left, right = self.ball_x < r, self.ball_x > self.image_size - r
        mirrored = np.where(left, 2 * r - self.ball_x, 2 * (self.image_size - r) - self.ball_x)
        self.ball_x = np.where(left | right, mirrored, self.ball_x)
        self.ball_vx = np.where(left | right, -self.ball_vx, self.ball_vx)

        landed = self.ball_y >= self.catch_y
        caught = landed & (np.abs(self.ball_x - self.paddle_x) <= half)
        rewards = np.where(landed, np.where(caught, 1.0, -1.0), 0.0).astype(np.float32)
        self.balls_left = self.balls_left - landed
        dones = self.balls_left <= 0
        self._spawn_balls(landed & ~dones)
        self._reset_games(dones)

        frames = self.render()
        self._stack[:, :-1] = self._stack[:, 1:].copy()
        self._stack[:, -1] = frames
        # A new episode must not see frames of the previous one.
        self._stack[dones] = frames[dones][:, None]
        return self._observation(), torch.from_numpy(rewards), torch.from_numpy(dones)


def make_env(config: A3CConfig, seed: int | np.random.Generator | None = None) -> CatchGame:
    """The ``CatchGame`` matching ``config`` (``num_envs`` games of ``image_size`` pixels)."""
    return CatchGame(config.num_envs, config.image_size, config.frame_stack, seed)


# ---------------------------------------------------------------------------------------------------------
# Agent
# ---------------------------------------------------------------------------------------------------------


class ActorCritic(nn.Module):
    """A3C's Atari network: conv 16 8x8/4, conv 32 4x4/2, fc ``hidden``, policy logits and value heads."""

    def __init__(self, config: A3CConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else A3CConfig()
        self.conv1 = nn.Conv2d(config.frame_stack, 16, kernel_size=8, stride=4)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, kernel_size=4, stride=2)
        self.relu2 = nn.ReLU()
        side = ((config.image_size - 8) // 4 + 1 - 4) // 2 + 1
        self.fc = nn.Linear(32 * side * side, config.hidden)
        self.relu3 = nn.ReLU()
        self.policy = nn.Linear(config.hidden, config.num_actions)
        self.value = nn.Linear(config.hidden, 1)
        # Small initial policy logits: a near-uniform starting policy explores evenly.
        nn.init.normal_(self.policy.weight, std=0.01)
        nn.init.zeros_(self.policy.bias)

    def forward(self, observations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``observations [N, frame_stack, S, S]`` -> ``(logits [N, num_actions], values [N])``."""
        x = self.relu2(self.conv2(self.relu1(self.conv1(observations))))
        x = self.relu3(self.fc(torch.flatten(x, 1)))
        return self.policy(x), self.value(x).squeeze(-1)


@dataclass
class Rollout:
    """``T`` steps of ``E`` games, all on the network's device.

    ``observations [T, E, F, S, S]``, ``actions [T, E]`` int64, ``rewards [T, E]``, ``dones [T, E]`` bool
    (episode ended at that step), ``bootstrap_value [E]`` = V(observation after the last step).
    """

    observations: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    bootstrap_value: torch.Tensor


def rollout(
    env: CatchGame, net: ActorCritic, steps: int, generator: torch.Generator | None = None
) -> Rollout:
    """Play ``steps`` steps in every game, sampling actions from ``net``'s policy (no autograd graph).

    Observations are moved to the network's device; actions go back to the CPU for the game. ``generator``
    (on the network's device) makes the action sampling reproducible.
    """
    device = next(net.parameters()).device
    observation = env.observation().to(device)
    observations, actions, rewards, dones = [], [], [], []
    with torch.no_grad():
        for _ in range(steps):
            logits, _ = net(observation)
            action = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)
            next_observation, reward, done = env.step(action.cpu())
            observations.append(observation)
            actions.append(action)
            rewards.append(reward)
            dones.append(done)
            observation = next_observation.to(device)
        _, bootstrap_value = net(observation)
    return Rollout(
        observations=torch.stack(observations),
        actions=torch.stack(actions),
        rewards=torch.stack(rewards).to(device),
        dones=torch.stack(dones).to(device),
        bootstrap_value=bootstrap_value,
    )


def a3c_loss(
    net: ActorCritic, batch: Rollout, config: A3CConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A3C loss of one rollout: ``policy + value_coef * value - entropy_coef * entropy``.

    n-step returns ``R_t = r_t + gamma * R_{t+1}`` (cut at episode ends) start from the bootstrap value;
    the advantage ``R_t - V(s_t)`` weights ``-log pi(a_t | s_t)`` without passing gradient into the value;
    the value loss is ``(R_t - V(s_t))^2 / 2``. Returns the total and detached components.
    """
    steps, envs = batch.actions.shape
    logits, values = net(batch.observations.flatten(0, 1))
    logits = logits.reshape(steps, envs, -1)
    values = values.reshape(steps, envs)
    with torch.no_grad():
        not_done = (~batch.dones).to(values.dtype)
        returns = torch.empty_like(values)
        running = batch.bootstrap_value
        for t in range(steps - 1, -1, -1):
            running = batch.rewards[t] + config.gamma * running * not_done[t]
            returns[t] = running
    advantages = returns - values
    log_probs = F.log_softmax(logits, dim=-1)
    chosen = log_probs.gather(-1, batch.actions[..., None]).squeeze(-1)
    policy_loss = -(chosen * advantages.detach()).mean()
    value_loss = 0.5 * advantages.square().mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    total = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    stats = {
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy.detach(),
        "mean_reward": batch.rewards.mean(),
    }
    return total, stats


def a3c_optimizer(net: ActorCritic, config: A3CConfig) -> torch.optim.RMSprop:
    """RMSProp with decay 0.99 as in the paper, and OpenAI Baselines' eps 1e-5.

    The paper's eps of 0.1 sits inside the square root of its own RMSProp; PyTorch adds eps outside, where
    0.1 would shrink every step of this small network's small gradients to almost nothing.
    """
    return torch.optim.RMSprop(net.parameters(), lr=config.learning_rate, alpha=0.99, eps=1e-5)
