"""Tests of the detection (Faster R-CNN), adversarial (WGAN-GP) and reinforcement-learning (A3C) models."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from dnnperf.models.adversarial import (
    WGANGP,
    WGANGP_PRESETS,
    WGANGPConfig,
    gradient_penalty,
    wgan_gp_iteration,
    wgan_gp_optimizers,
)
from dnnperf.models.detection import (
    FASTER_RCNN_PRESETS,
    FasterRCNN,
    box_iou,
    decode_boxes,
    encode_boxes,
    generate_anchors,
    nms,
    roi_align,
    sample_fixed,
    synthetic_detection_batch,
)
from dnnperf.models.reinforcement import (
    A3C_PRESETS,
    ActorCritic,
    CatchGame,
    Rollout,
    a3c_loss,
    a3c_optimizer,
    make_env,
    rollout,
)

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

# ---------------------------------------------------------------------------------------------------------
# Detection utilities
# ---------------------------------------------------------------------------------------------------------


def test_box_iou_hand_values() -> None:
    a = torch.tensor([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 4.0, 4.0]])
    b = torch.tensor([[1.0, 1.0, 3.0, 3.0], [2.0, 2.0, 4.0, 4.0], [0.0, 0.0, 2.0, 2.0]])
    expected = torch.tensor(
        [
            [1 / 7, 0.0, 1.0],  # overlap 1 of union 4 + 4 - 1; touching corners; identical
            [4 / 16, 4 / 16, 4 / 16],  # each 2x2 box lies inside the 4x4 one
        ]
    )
    torch.testing.assert_close(box_iou(a, b), expected)
    # Batch dimensions broadcast, and empty boxes give 0 rather than NaN.
    batched = box_iou(a[None].expand(3, -1, -1), b[None])
    assert batched.shape == (3, 2, 3)
    empty = torch.zeros(1, 4)
    assert box_iou(empty, empty).item() == 0.0


def test_box_coding_round_trip() -> None:
    gen = torch.Generator().manual_seed(0)
    refs = torch.rand(50, 4, generator=gen) * 50
    refs[:, 2:] += refs[:, :2] + 1
    targets = torch.rand(50, 4, generator=gen) * 50
    targets[:, 2:] += targets[:, :2] + 1
    weights = (10.0, 10.0, 5.0, 5.0)
    torch.testing.assert_close(decode_boxes(encode_boxes(targets, refs, weights), refs, weights), targets)


def test_anchors_are_centred_on_cells_with_the_requested_shapes() -> None:
    anchors = generate_anchors((2, 3), (16.0, 16.0), (32, 64), (0.5, 1.0, 2.0))
    assert anchors.shape == (2 * 3 * 6, 4)
    centres = (anchors[:, :2] + anchors[:, 2:]) / 2
    # Order is (y, x, anchor): the 7th anchor belongs to cell (0, 1), centred at (24, 8).
    torch.testing.assert_close(centres[6], torch.tensor([24.0, 8.0]))
    wh = anchors[:6, 2:] - anchors[:6, :2]
    torch.testing.assert_close(wh.prod(dim=1), torch.tensor([32.0**2] * 3 + [64.0**2] * 3))
    torch.testing.assert_close(wh[:, 1] / wh[:, 0], torch.tensor([0.5, 1.0, 2.0] * 2))


def _iou(a: list[float], b: list[float]) -> float:
    inter_w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    inter_h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = inter_w * inter_h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def _reference_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> list[int]:
    """The textbook sequential algorithm, one box at a time, in plain Python."""
    box_list = boxes.tolist()
    order = sorted(range(len(box_list)), key=lambda i: -float(scores[i]))
    kept: list[int] = []
    for i in order:
        if all(_iou(box_list[i], box_list[j]) <= threshold for j in kept):
            kept.append(i)
    return kept


@pytest.mark.parametrize("block_size", [512, 7])
def test_nms_matches_brute_force(block_size: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for trial in range(12):
        count = int(torch.randint(1, 150, (1,), generator=gen))
        xy = torch.rand(count, 2, generator=gen) * 60
        wh = torch.rand(count, 2, generator=gen) * 30 + 1
        boxes = torch.cat((xy, xy + wh), dim=1)
        scores = torch.rand(count, generator=gen)
        threshold = (0.3, 0.5, 0.7)[trial % 3]
        assert nms(boxes, scores, threshold, block_size).tolist() == _reference_nms(boxes, scores, threshold)
    assert nms(torch.zeros(0, 4), torch.zeros(0), 0.5).numel() == 0


def test_roi_align_hand_computed_value() -> None:
    # A 2x2 map whose cell is not planar, so bilinear interpolation is really exercised:
    #     f(y, x) = (1-y)(1-x)*0 + (1-y)x*1 + y(1-x)*2 + yx*7   for y, x in [0, 1].
    features = torch.tensor([[[[0.0, 1.0], [2.0, 7.0]]]])
    # RoI (0.5, 0.5)-(2.0, 1.5) in pixels; the aligned half-pixel shift makes it x in [0, 1.5], y in [0, 1].
    # One output bin with a 2x2 sub-grid samples at x in {0.375, 1.125 -> clamped to 1} and y in {0.25, 0.75}:
    #     f(.25,.375) = 1.25, f(.25,1) = 2.5, f(.75,.375) = 3.0, f(.75,1) = 5.5 -> mean 3.0625.
    rois = torch.tensor([[[0.5, 0.5, 2.0, 1.5]]])
    out = roi_align(features, rois, output_size=1, spatial_scale=1.0, sampling_ratio=2, aligned=True)
    assert out.shape == (1, 1, 1, 1)
    assert out.item() == pytest.approx(3.0625)
    # Without the shift and with one sample at the centre (0.75, 0.5): 0.375 + 0.25 + 2.625 = 3.25.
    rois = torch.tensor([[[0.0, 0.0, 1.5, 1.0]]])
    out = roi_align(features, rois, output_size=1, spatial_scale=1.0, sampling_ratio=1, aligned=False)
    assert out.item() == pytest.approx(3.25)


def _reference_roi_align(
    features: torch.Tensor, rois: torch.Tensor, size: int, scale: float, ratio: int
) -> torch.Tensor:
    """Direct port of torchvision's aligned RoIAlign loops (one bilinear sample at a time)."""
    batch, channels, height, width = features.shape
    out = torch.zeros(batch * rois.shape[1], channels, size, size, dtype=torch.float64)

    def bilinear(image: torch.Tensor, y: float, x: float) -> torch.Tensor:
        y, x = min(max(y, 0.0), height - 1), min(max(x, 0.0), width - 1)
        y0, x0 = math.floor(y), math.floor(x)
        y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
        ly, lx = y - y0, x - x0
        return (
            image[:, y0, x0] * (1 - ly) * (1 - lx)
            + image[:, y0, x1] * (1 - ly) * lx
            + image[:, y1, x0] * ly * (1 - lx)
            + image[:, y1, x1] * ly * lx
        )

    for b in range(batch):
        for r in range(rois.shape[1]):
            x1, y1, x2, y2 = (float(v) * scale - 0.5 for v in rois[b, r])
            bin_w, bin_h = (x2 - x1) / size, (y2 - y1) / size
            for i in range(size):
                for j in range(size):
                    acc = torch.zeros(channels, dtype=torch.float64)
                    for iy in range(ratio):
                        for ix in range(ratio):
                            y = y1 + i * bin_h + (iy + 0.5) * bin_h / ratio
                            x = x1 + j * bin_w + (ix + 0.5) * bin_w / ratio
                            acc += bilinear(features[b].double(), y, x)
                    out[b * rois.shape[1] + r, :, i, j] = acc / ratio**2
    return out


def test_roi_align_matches_reference_loops() -> None:
    gen = torch.Generator().manual_seed(2)
    features = torch.randn(2, 3, 5, 6, generator=gen)
    xy = torch.rand(2, 4, 2, generator=gen) * 60
    wh = torch.rand(2, 4, 2, generator=gen) * 40 + 2
    rois = torch.cat((xy, xy + wh), dim=-1).clamp(max=80.0)
    out = roi_align(features, rois, output_size=3, spatial_scale=1 / 16, sampling_ratio=2)
    expected = _reference_roi_align(features, rois, 3, 1 / 16, 2)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_sample_fixed_counts() -> None:
    labels = torch.tensor([[1, 1, 1, 1, 0, 0, 0, 0, -1, -1], [0, -1, -1, -1, -1, -1, -1, -1, -1, 1]])
    indices, valid, positive = sample_fixed(labels, batch_size=4, positive_fraction=0.5)
    assert indices.shape == valid.shape == positive.shape == (2, 4)
    assert positive[0].sum() == 2 and valid[0].all()
    assert (labels[0][indices[0][~positive[0]]] == 0).all()
    # Row 1 has only two candidates: one positive, one negative, two padded slots.
    assert valid[1].sum() == 2 and positive[1].sum() == 1


# ---------------------------------------------------------------------------------------------------------
# Faster R-CNN
# ---------------------------------------------------------------------------------------------------------


def test_faster_rcnn_tiny_losses_gradients_and_learning() -> None:
    torch.manual_seed(0)
    config = FASTER_RCNN_PRESETS["tiny"]
    model = FasterRCNN(config)
    images, boxes, labels = synthetic_detection_batch(config, 2, torch.Generator().manual_seed(0))
    assert boxes.shape == (2, config.max_boxes, 4) and labels.dtype == torch.int64

    losses = model(images, boxes, labels)
    assert set(losses) == {"rpn_objectness", "rpn_box", "roi_cls", "roi_box"}
    assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values())
    start = sum(losses.values())
    start.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(20):
        total = sum(model(images, boxes, labels).values())
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    end = sum(model(images, boxes, labels).values())
    assert torch.isfinite(end)
    assert end.item() < 0.8 * start.item()


def test_faster_rcnn_ignores_padding_boxes() -> None:
    torch.manual_seed(0)
    config = FASTER_RCNN_PRESETS["tiny"]
    model = FasterRCNN(config)
    images, boxes, labels = synthetic_detection_batch(config, 2, torch.Generator().manual_seed(1))
    labels[:, -1] = 0  # padding slot
    boxes[:, -1] = 0.0
    losses = model(images, boxes, labels)
    assert all(torch.isfinite(v) for v in losses.values())


# ---------------------------------------------------------------------------------------------------------
# WGAN-GP
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", [0.3, 1.0, 2.5])
def test_gradient_penalty_of_a_linear_critic(norm: float) -> None:
    # f(x) = w.x + b has gradient w everywhere, so the penalty is gp_weight * (||w|| - 1)^2 exactly and
    # its gradient with respect to w is 2 * gp_weight * (||w|| - 1) * w / ||w|| (needs double backward).
    gen = torch.Generator().manual_seed(3)
    critic = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 1))
    with torch.no_grad():
        w = torch.randn(1, 48, generator=gen)
        critic[1].weight.copy_(w / w.norm() * norm)
    real = torch.randn(6, 3, 4, 4, generator=gen)
    fake = torch.randn(6, 3, 4, 4, generator=gen)
    penalty = gradient_penalty(critic, real, fake, gp_weight=10.0)
    assert penalty.item() == pytest.approx(10.0 * (norm - 1) ** 2, abs=1e-5)
    penalty.backward()
    weight = critic[1].weight.detach()
    expected_grad = 2 * 10.0 * (norm - 1) * weight / weight.norm()
    torch.testing.assert_close(critic[1].weight.grad, expected_grad, atol=1e-4, rtol=1e-4)


def test_wgan_gp_shapes_and_full_iteration_updates_everything() -> None:
    torch.manual_seed(0)
    config = WGANGP_PRESETS["tiny"]
    model = WGANGP(config)
    z = model.sample_latent(4)
    images = model.generator(z)
    assert images.shape == (4, config.channels, config.image_size, config.image_size)
    assert images.abs().max() <= 1.0
    assert model.critic(images).shape == (4,)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.critic.modules())

    before = copy.deepcopy(model.state_dict())
    gen_opt, critic_opt = wgan_gp_optimizers(model)
    real = torch.rand(8, config.channels, config.image_size, config.image_size) * 2 - 1
    stats = wgan_gp_iteration(model, gen_opt, critic_opt, real)
    assert set(stats) == {"critic_loss", "wasserstein", "gradient_penalty", "generator_loss"}
    assert all(torch.isfinite(v) for v in stats.values())
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    # The critic is trainable again after the generator step froze it.
    assert all(p.requires_grad for p in model.critic.parameters())


def test_wgan_gp_config_rejects_non_power_of_two() -> None:
    with pytest.raises(ValueError):
        WGANGPConfig(image_size=48)


# ---------------------------------------------------------------------------------------------------------
# A3C and the Catch game
# ---------------------------------------------------------------------------------------------------------


def test_catch_renders_ball_and_paddle_where_the_state_says() -> None:
    env = CatchGame(num_envs=2, image_size=32, frame_stack=3, seed=0)
    env.reset()
    env.ball_x[:] = [5.0, 20.0]
    env.ball_y[:] = [10.0, 4.0]
    env.paddle_x[:] = [8.0, 24.0]
    frames = env.render()
    background = env.background
    for e in range(2):
        bx, by, px = int(env.ball_x[e]), int(env.ball_y[e]), int(env.paddle_x[e])
        assert frames[e, by, bx] == pytest.approx(0.9)  # ball centre: full coverage
        assert frames[e, by, bx + 4] == pytest.approx(background[by, bx + 4])  # beyond the radius
        top = env.paddle_top
        assert frames[e, top, px] == pytest.approx(1.0)  # paddle's bright top edge
        assert frames[e, top + 1, px] == pytest.approx(0.7)
        half = int(env.paddle_width // 2)
        assert frames[e, top, px + half + 1] == pytest.approx(background[top, px + half + 1])
    # The paddle of game 1 is not drawn in game 0.
    assert frames[0, env.paddle_top, 24] == pytest.approx(background[env.paddle_top, 24])


def test_catch_rewards_done_and_frame_stack() -> None:
    env = CatchGame(num_envs=3, image_size=32, frame_stack=2, seed=0, balls_per_episode=2)
    first = env.reset()
    assert first.shape == (3, 2, 32, 32) and first.dtype == torch.float32
    assert first.min() >= 0.0 and first.max() <= 1.0
    # Every ball lands on the next step: game 0 over the paddle, games 1 and 2 far from it.
    env.paddle_x[:] = 16.0
    env.ball_x[:] = [16.0, 3.0, 29.0]
    env.ball_vx[:] = 0.0
    env.ball_y[:] = env.catch_y - env.ball_vy / 2
    env.balls_left[:] = [2, 2, 1]
    obs, rewards, dones = env.step(torch.zeros(3, dtype=torch.int64))
    assert rewards.tolist() == [1.0, -1.0, -1.0]
    assert dones.tolist() == [False, False, True]
    assert env.balls_left.tolist() == [1, 1, 2]  # game 2 was reset
    np.testing.assert_allclose(env.ball_y, env.ball_radius)  # new balls at the top
    frames = env.render()
    np.testing.assert_allclose(obs[:, -1].numpy(), frames)
    # The finished game's stack holds only the new episode's frame; the others keep their history.
    np.testing.assert_allclose(obs[2, 0].numpy(), frames[2])
    np.testing.assert_allclose(obs[0, 0].numpy(), first[0, -1].numpy(), atol=0, rtol=0)
    # A step in mid-air gives no reward; "right" moves the paddle by paddle_speed.
    paddle = env.paddle_x.copy()
    _, rewards, dones = env.step(np.array([2, 1, 0]))
    assert rewards.tolist() == [0.0, 0.0, 0.0] and not dones.any()
    np.testing.assert_allclose(env.paddle_x, paddle + np.array([1, -1, 0]) * env.paddle_speed)


def test_catch_is_reproducible_from_its_seed() -> None:
    runs = []
    for _ in range(2):
        env = CatchGame(num_envs=4, image_size=32, frame_stack=2, seed=np.random.default_rng(7))
        obs = [env.reset()]
        for t in range(20):
            obs.append(env.step(np.full(4, t % 3))[0])
        runs.append(torch.stack(obs))
    assert torch.equal(runs[0], runs[1])


def test_a3c_rollout_loss_and_update_changes_every_parameter() -> None:
    torch.manual_seed(0)
    config = A3C_PRESETS["tiny"]
    env = make_env(config, seed=0)
    net = ActorCritic(config)
    batch = rollout(env, net, config.rollout_steps)
    steps, envs = config.rollout_steps, config.num_envs
    assert batch.observations.shape == (steps, envs, config.frame_stack, config.image_size, config.image_size)
    assert batch.actions.shape == batch.rewards.shape == batch.dones.shape == (steps, envs)
    assert batch.bootstrap_value.shape == (envs,)
    assert batch.actions.min() >= 0 and batch.actions.max() < config.num_actions

    before = copy.deepcopy(net.state_dict())
    optimizer = a3c_optimizer(net, config)
    loss, stats = a3c_loss(net, batch, config)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert stats["entropy"].item() == pytest.approx(math.log(config.num_actions), rel=0.05)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert [n for n, p in net.named_parameters() if torch.equal(p, before[n])] == []


def test_a3c_returns_are_n_step_and_cut_at_episode_ends() -> None:
    config = A3C_PRESETS["tiny"]
    net = ActorCritic(config)
    size, stack = config.image_size, config.frame_stack
    # Two steps of two games, rewards 1 then 2; game 1's episode ends at step 0.
    batch = Rollout(
        observations=torch.rand(2, 2, stack, size, size),
        actions=torch.zeros(2, 2, dtype=torch.int64),
        rewards=torch.tensor([[1.0, 1.0], [2.0, 2.0]]),
        dones=torch.tensor([[False, True], [False, False]]),
        bootstrap_value=torch.tensor([10.0, 10.0]),
    )
    with torch.no_grad():
        _, values = net(batch.observations.flatten(0, 1))
    gamma = config.gamma
    returns = torch.tensor([[1 + gamma * (2 + gamma * 10), 1.0], [2 + gamma * 10, 2 + gamma * 10]])
    expected_value_loss = 0.5 * (returns - values.reshape(2, 2)).square().mean()
    _, stats = a3c_loss(net, batch, config)
    assert stats["value_loss"].item() == pytest.approx(expected_value_loss.item(), rel=1e-5)
