"""Faster R-CNN (Ren et al. 2015) with a ResNet-C4 backbone, in plain PyTorch (no torchvision).

The layout is the classic "C4" one used by the original ResNet paper for detection and by Detectron:

* backbone: ResNet ``stem`` + ``layer1``..``layer3`` (stride 16) shared by the RPN and the box head;
* RPN: 3x3 conv + 1x1 objectness / box-delta convs over anchors of several sizes and aspect ratios;
* proposals: decode, clip, drop tiny boxes, top-k, NMS (written here in tensor ops), top-k;
* RoIAlign (written here as separable bilinear-interpolation matmuls, sampling ratio 2) to 14x14, then
  ``layer4`` as the box head (stride 2 -> 7x7), global average pool, and class / per-class box regressors;
* training targets: IoU matching of anchors and proposals to the ground truth, with fixed-size random
  positive / negative samples per image (shapes never depend on the data).

Batch norm in the backbone and head trains normally (no frozen BN: the models start from scratch).

``FasterRCNN.forward`` is the training step: it takes images with ground-truth boxes and returns the four
named losses. Every helper (IoU, box coding, NMS, RoIAlign, sampling) is public and works on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.models.vision import ResNet, ResNetConfig

__all__ = [
    "FASTER_RCNN_PRESETS",
    "FasterRCNN",
    "FasterRCNNConfig",
    "RPNHead",
    "box_iou",
    "clip_boxes",
    "decode_boxes",
    "encode_boxes",
    "generate_anchors",
    "nms",
    "roi_align",
    "sample_fixed",
    "synthetic_detection_batch",
]

# Box-coding weights of the second stage (Detectron / torchvision default); the RPN uses unit weights.
ROI_BOX_WEIGHTS: tuple[float, float, float, float] = (10.0, 10.0, 5.0, 5.0)
RPN_BOX_WEIGHTS: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
# exp() of a predicted log-size delta is clamped so an untrained head cannot produce inf boxes.
_MAX_LOG_SCALE = math.log(1000.0 / 16)


@dataclass(frozen=True)
class FasterRCNNConfig:
    """Faster R-CNN hyper-parameters (defaults: the Detectron C4 recipe on 800 px COCO images)."""

    image_size: int = 800
    num_classes: int = 80
    backbone_depth: int = 101
    backbone_width: int = 64
    anchor_sizes: tuple[int, ...] = (32, 64, 128, 256, 512)
    aspect_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    rpn_pre_nms_top_n: int = 12000
    rpn_post_nms_top_n: int = 2000
    rpn_batch_size: int = 256
    roi_batch_size: int = 512
    # Ground-truth boxes per image (K of the [B, K, 4] inputs; labels <= 0 mark padding).
    max_boxes: int = 20
    rpn_nms_threshold: float = 0.7
    rpn_fg_iou: float = 0.7
    rpn_bg_iou: float = 0.3
    rpn_positive_fraction: float = 0.5
    roi_fg_iou: float = 0.5
    roi_positive_fraction: float = 0.25
    roi_output_size: int = 14
    sampling_ratio: int = 2
    min_box_size: float = 1e-3

    def __post_init__(self) -> None:
        if self.image_size < 32 or self.num_classes < 1 or self.max_boxes < 1:
            raise ValueError(f"invalid FasterRCNNConfig: {self}")
        if not self.anchor_sizes or not self.aspect_ratios:
            raise ValueError("anchor_sizes and aspect_ratios must be non-empty")

    @property
    def num_anchors(self) -> int:
        """Anchors per feature-map cell."""
        return len(self.anchor_sizes) * len(self.aspect_ratios)


FASTER_RCNN_PRESETS: dict[str, FasterRCNNConfig] = {
    "tiny": FasterRCNNConfig(
        image_size=96,
        num_classes=3,
        backbone_depth=18,
        backbone_width=8,
        anchor_sizes=(16, 32, 64),
        aspect_ratios=(0.5, 1.0, 2.0),
        rpn_pre_nms_top_n=200,
        rpn_post_nms_top_n=48,
        rpn_batch_size=64,
        roi_batch_size=32,
        max_boxes=3,
    ),
    "small": FasterRCNNConfig(
        image_size=256,
        num_classes=20,
        backbone_depth=50,
        backbone_width=16,
        anchor_sizes=(32, 64, 128, 256),
        aspect_ratios=(0.5, 1.0, 2.0),
        rpn_pre_nms_top_n=1000,
        rpn_post_nms_top_n=200,
        rpn_batch_size=256,
        roi_batch_size=64,
        max_boxes=8,
    ),
    # ResNet-101 C4 on 800x800 COCO-sized images with the standard anchors and sample counts.
    "full": FasterRCNNConfig(),
}


# ---------------------------------------------------------------------------------------------------------
# Box utilities
# ---------------------------------------------------------------------------------------------------------


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Area of xyxy boxes ``[..., 4]`` (degenerate boxes count as 0)."""
    return (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """IoU of all pairs of xyxy boxes ``[..., N, 4]`` x ``[..., M, 4]`` -> ``[..., N, M]``."""
    area1 = box_area(boxes1)
    area2 = box_area(boxes2)
    # Coordinate by coordinate rather than on [..., N, M, 2] stacks: fewer and contiguous temporaries.
    left = torch.maximum(boxes1[..., :, None, 0], boxes2[..., None, :, 0])
    top = torch.maximum(boxes1[..., :, None, 1], boxes2[..., None, :, 1])
    right = torch.minimum(boxes1[..., :, None, 2], boxes2[..., None, :, 2])
    bottom = torch.minimum(boxes1[..., :, None, 3], boxes2[..., None, :, 3])
    inter = (right - left).clamp(min=0) * (bottom - top).clamp(min=0)
    union = area1[..., :, None] + area2[..., None, :] - inter
    # Two empty boxes have IoU 0, not NaN.
    return inter / union.clamp(min=1e-9)


def encode_boxes(
    targets: torch.Tensor, references: torch.Tensor, weights: tuple[float, float, float, float]
) -> torch.Tensor:
    """Regression deltas ``(dx, dy, dw, dh)`` that map ``references`` onto ``targets`` (both ``[..., 4]``)."""
    wx, wy, ww, wh = weights
    ref_w = (references[..., 2] - references[..., 0]).clamp(min=1e-6)
    ref_h = (references[..., 3] - references[..., 1]).clamp(min=1e-6)
    ref_x = references[..., 0] + 0.5 * ref_w
    ref_y = references[..., 1] + 0.5 * ref_h
    tgt_w = (targets[..., 2] - targets[..., 0]).clamp(min=1e-6)
    tgt_h = (targets[..., 3] - targets[..., 1]).clamp(min=1e-6)
    tgt_x = targets[..., 0] + 0.5 * tgt_w
    tgt_y = targets[..., 1] + 0.5 * tgt_h
    return torch.stack(
        (
            wx * (tgt_x - ref_x) / ref_w,
            wy * (tgt_y - ref_y) / ref_h,
            ww * torch.log(tgt_w / ref_w),
            wh * torch.log(tgt_h / ref_h),
        ),
        dim=-1,
    )


def decode_boxes(
    deltas: torch.Tensor, references: torch.Tensor, weights: tuple[float, float, float, float]
) -> torch.Tensor:
    """Inverse of :func:`encode_boxes`: apply ``deltas [..., 4]`` to ``references [..., 4]`` -> xyxy boxes."""
    wx, wy, ww, wh = weights
    ref_w = references[..., 2] - references[..., 0]
    ref_h = references[..., 3] - references[..., 1]
    ref_x = references[..., 0] + 0.5 * ref_w
    ref_y = references[..., 1] + 0.5 * ref_h
    center_x = deltas[..., 0] / wx * ref_w + ref_x
    center_y = deltas[..., 1] / wy * ref_h + ref_y
    width = torch.exp((deltas[..., 2] / ww).clamp(max=_MAX_LOG_SCALE)) * ref_w
    height = torch.exp((deltas[..., 3] / wh).clamp(max=_MAX_LOG_SCALE)) * ref_h
    return torch.stack(
        (center_x - 0.5 * width, center_y - 0.5 * height, center_x + 0.5 * width, center_y + 0.5 * height),
        dim=-1,
    )


def clip_boxes(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Clip xyxy boxes to the image ``[0, width] x [0, height]``."""
    x = boxes[..., 0::2].clamp(min=0, max=width)
    y = boxes[..., 1::2].clamp(min=0, max=height)
    return torch.stack((x[..., 0], y[..., 0], x[..., 1], y[..., 1]), dim=-1)


def generate_anchors(
    feature_size: tuple[int, int],
    stride: tuple[float, float],
    sizes: tuple[int, ...],
    aspect_ratios: tuple[float, ...],
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Anchors ``[H * W * A, 4]`` (xyxy pixels) centred on every feature cell, ordered (y, x, anchor).

    ``A = len(sizes) * len(aspect_ratios)``; an anchor of size ``s`` and ratio ``r = h / w`` has area
    ``s**2``. The order matches an RPN output permuted to ``[B, H, W, A]``.
    """
    ratios = torch.tensor(aspect_ratios, device=device, dtype=dtype)
    scales = torch.tensor(sizes, device=device, dtype=dtype)
    widths = (scales[:, None] / ratios.sqrt()[None, :]).reshape(-1)
    heights = (scales[:, None] * ratios.sqrt()[None, :]).reshape(-1)
    base = torch.stack((-widths, -heights, widths, heights), dim=1) / 2  # [A, 4] centred at 0
    feat_h, feat_w = feature_size
    # Cell centres (x + 0.5) * stride, so anchors are symmetric about the image.
    ys = (torch.arange(feat_h, device=device, dtype=dtype) + 0.5) * stride[0]
    xs = (torch.arange(feat_w, device=device, dtype=dtype) + 0.5) * stride[1]
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    shifts = torch.stack((grid_x, grid_y, grid_x, grid_y), dim=-1).reshape(-1, 1, 4)
    return (shifts + base[None]).reshape(-1, 4)


def nms(
    boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float, block_size: int = 512
) -> torch.Tensor:
    """Greedy non-maximum suppression; returns the indices of kept boxes in decreasing score order.

    Same result as the classic sequential algorithm (a box survives iff no higher-scoring *surviving* box
    overlaps it by more than ``iou_threshold``), computed block by block in score order so that each step
    is a vectorised op rather than one Python iteration per box (the structure of torchvision's CUDA
    kernel). A block is first tested against the boxes already kept, then resolved internally by a
    fixed-point iteration: round ``k`` settles at least the ``k`` best boxes of the block and the fixed
    point is unique, so it ends at the exact greedy answer, in practice after a handful of rounds. Memory
    stays at ``block_size x kept`` instead of a full ``N x N`` IoU matrix.
    """
    order = torch.argsort(scores, descending=True)
    sorted_boxes = boxes[order]
    kept_boxes = sorted_boxes[:0]
    kept_blocks: list[torch.Tensor] = []
    for start in range(0, sorted_boxes.shape[0], block_size):
        block = sorted_boxes[start : start + block_size]
        alive = torch.ones(block.shape[0], dtype=torch.bool, device=boxes.device)
        if kept_boxes.shape[0] > 0:
            alive = ~(box_iou(block, kept_boxes) > iou_threshold).any(dim=1)
        # overlaps[j, i] = 1: box j (earlier, so higher-scoring) would suppress box i. Float, so that
        # "does any kept box suppress i" is one mat-vec product, the fastest reduction on CPUs and GPUs.
        overlaps = (box_iou(block, block) > iou_threshold).triu_(diagonal=1).to(block.dtype)
        alive_float = alive.to(block.dtype)
        keep = alive_float
        for _ in range(block.shape[0]):
            new_keep = alive_float * ((keep @ overlaps) == 0).to(block.dtype)
            if torch.equal(new_keep, keep):
                break
            keep = new_keep
        keep_mask = keep.bool()
        kept_boxes = torch.cat((kept_boxes, block[keep_mask]))
        kept_blocks.append(keep_mask)
    if not kept_blocks:
        return order[:0]
    return order[torch.cat(kept_blocks)]


def _interpolation_weights(
    low: torch.Tensor, high: torch.Tensor, size: int, output_size: int, sampling_ratio: int
) -> torch.Tensor:
    """Bin-averaged linear-interpolation weights ``[B, R, output_size, size]`` along one axis.

    ``low`` / ``high`` (``[B, R]``) are the RoI edges in pixel-centre coordinates. Each of the
    ``output_size * sampling_ratio`` sample points spreads weight ``max(0, 1 - |p - i|)`` over pixels ``i``
    after clamping ``p`` into ``[0, size - 1]`` (torchvision's RoIAlign clamps to the edge the same way);
    the points of one bin are then averaged.
    """
    batch, num_rois = low.shape
    points = output_size * sampling_ratio
    frac = (torch.arange(points, device=low.device, dtype=low.dtype) + 0.5) / points
    position = (low[..., None] + (high - low)[..., None] * frac).clamp(min=0, max=size - 1)
    pixels = torch.arange(size, device=low.device, dtype=low.dtype)
    weights = (1 - (position[..., None] - pixels).abs()).clamp(min=0)  # [B, R, points, size]
    return weights.reshape(batch, num_rois, output_size, sampling_ratio, size).mean(dim=3)


def roi_align(
    features: torch.Tensor,
    rois: torch.Tensor,
    output_size: int,
    spatial_scale: float,
    sampling_ratio: int = 2,
    aligned: bool = True,
) -> torch.Tensor:
    """RoIAlign (He et al. 2017) of ``rois [B, R, 4]`` (xyxy, image pixels) on ``features [B, C, H, W]``.

    Returns ``[B * R, C, output_size, output_size]`` (RoIs of image 0 first). Each output bin averages
    ``sampling_ratio x sampling_ratio`` bilinear samples on the bin's regular sub-grid; ``aligned`` applies
    the half-pixel offset of Detectron2's ROIAlignV2.

    Bilinear sampling on a Cartesian grid of points is separable, and so is the average over a bin's
    sub-grid, so the whole op is ``Wy @ F @ Wx^T`` per RoI with small dense interpolation matrices ``Wy
    [out, H]`` and ``Wx [out, W]``. Two batched matmuls give torchvision's values and gradients (to rounding)
    and run far faster (forward and backward) than ``F.grid_sample`` on CPUs.
    """
    batch, channels, _, _ = features.shape
    num_rois = rois.shape[1]
    height, width = features.shape[-2:]
    # Coordinates and weights in float32 even for half-precision features: bf16 cannot even hold pixel
    # positions to a quarter pixel; only the two matmuls run in the features' dtype.
    rois = rois.float() * spatial_scale - (0.5 if aligned else 0.0)
    x1, y1, x2, y2 = rois.unbind(-1)  # each [B, R], feature-pixel-centre coordinates
    weight_y = _interpolation_weights(y1, y2, height, output_size, sampling_ratio).to(features.dtype)
    weight_x = _interpolation_weights(x1, x2, width, output_size, sampling_ratio).to(features.dtype)
    rows = torch.einsum("brih,bchw->brciw", weight_y, features)
    pooled = torch.einsum("brciw,brjw->brcij", rows, weight_x)
    return pooled.reshape(batch * num_rois, channels, output_size, output_size)


def sample_fixed(
    labels: torch.Tensor, batch_size: int, positive_fraction: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw exactly ``batch_size`` indices per row of ``labels [B, N]`` (1 positive, 0 negative, -1 ignore).

    At most ``batch_size * positive_fraction`` positives are taken at random and negatives fill the rest,
    as in Faster R-CNN; shapes are fixed so the loss never depends on data-dependent sizes. Returns
    ``(indices [B, S], valid [B, S], positive [B, S])``: ``valid`` is False for slots that had to be padded
    because the row had too few candidates.
    """
    rows, count = labels.shape
    size = min(batch_size, count)
    max_positive = int(batch_size * positive_fraction)
    positive = labels == 1
    draws = torch.rand((2, rows, count), device=labels.device, generator=generator)
    # Cap positives: keep the max_positive positives with the highest random draw.
    chosen_positive = torch.zeros_like(positive)
    if max_positive > 0:
        positive_key = torch.where(positive, draws[0], -1.0)
        top = positive_key.topk(min(max_positive, count), dim=1).indices
        chosen_positive.scatter_(1, top, True)
        chosen_positive &= positive
    # Ranking key: chosen positives (2..3) before negatives (1..2) before everything else (-1).
    key = torch.where(chosen_positive, 2.0 + draws[1], torch.where(labels == 0, 1.0 + draws[1], -1.0))
    top_key, indices = key.topk(size, dim=1)
    return indices, top_key >= 0, top_key >= 2


def synthetic_detection_batch(
    config: FasterRCNNConfig, batch_size: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images with ``max_boxes`` filled rectangles drawn on noise, and their boxes and labels.

    Each class has its own fill intensity per channel so that the task is learnable. Returns
    ``(images [B, 3, S, S], boxes [B, K, 4] float xyxy pixels, labels [B, K] int64 in 1..num_classes)``
    on the CPU.
    """
    size, k = config.image_size, config.max_boxes
    labels = torch.randint(1, config.num_classes + 1, (batch_size, k), generator=generator)
    # Box sides between 1/8 and 1/2 of the image, anywhere inside it.
    wh = (torch.rand((batch_size, k, 2), generator=generator) * 3 / 8 + 1 / 8) * size
    xy = torch.rand((batch_size, k, 2), generator=generator) * (size - wh)
    boxes = torch.cat((xy, xy + wh), dim=-1).round()
    images = 0.1 * torch.randn((batch_size, 3, size, size), generator=generator)
    colours = torch.linspace(-1.0, 1.0, config.num_classes + 1)
    for b in range(batch_size):
        for j in range(k):
            x1, y1, x2, y2 = (int(v) for v in boxes[b, j].tolist())
            cls = int(labels[b, j])
            images[b, 0, y1:y2, x1:x2] = colours[cls]
            images[b, 1, y1:y2, x1:x2] = -colours[cls]
            images[b, 2, y1:y2, x1:x2] = 0.5
    return images, boxes, labels


# ---------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------


class RPNHead(nn.Module):
    """Region proposal head: shared 3x3 conv, then per-anchor objectness and box deltas (1x1 convs)."""

    def __init__(self, in_channels: int, num_anchors: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, in_channels, kernel_size=3, padding=1)
        self.relu = nn.ReLU()
        self.objectness = nn.Conv2d(in_channels, num_anchors, kernel_size=1)
        self.box_deltas = nn.Conv2d(in_channels, 4 * num_anchors, kernel_size=1)
        for layer in (self.conv, self.objectness, self.box_deltas):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.zeros_(layer.bias)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``features [B, C, H, W]`` -> objectness logits ``[B, H*W*A]`` and deltas ``[B, H*W*A, 4]``."""
        hidden = self.relu(self.conv(features))
        batch = features.shape[0]
        logits = self.objectness(hidden).permute(0, 2, 3, 1).reshape(batch, -1)
        deltas = self.box_deltas(hidden).permute(0, 2, 3, 1).reshape(batch, -1, 4)
        return logits, deltas


class FasterRCNN(nn.Module):
    """Faster R-CNN, ResNet-C4: ``backbone`` (stem..layer3) -> ``rpn`` -> RoIAlign -> ``box_head`` (layer4).

    ``forward(images, boxes, labels)`` runs one training pass and returns the named scalar losses
    ``rpn_objectness``, ``rpn_box``, ``roi_cls``, ``roi_box`` (sum them for the total).
    """

    def __init__(self, config: FasterRCNNConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else FasterRCNNConfig()
        resnet = ResNet(
            ResNetConfig(
                depth=config.backbone_depth,
                width=config.backbone_width,
                num_classes=config.num_classes + 1,
                image_size=config.image_size,
                in_channels=3,
            )
        )
        # The ResNet's own fc is dropped: the detector has its own heads, and an unused layer would
        # leave parameters without gradients.
        self.backbone = nn.Sequential(resnet.stem, resnet.layer1, resnet.layer2, resnet.layer3)
        self.rpn = RPNHead(resnet.stage_channels[2], config.num_anchors)
        self.box_head = resnet.layer4
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        head_channels = resnet.stage_channels[3]
        self.cls_score = nn.Linear(head_channels, config.num_classes + 1)
        self.bbox_pred = nn.Linear(head_channels, 4 * (config.num_classes + 1))
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        nn.init.zeros_(self.cls_score.bias)
        nn.init.zeros_(self.bbox_pred.bias)

    # -- proposals -------------------------------------------------------------------------------------

    @torch.no_grad()
    def propose(
        self, anchors: torch.Tensor, logits: torch.Tensor, deltas: torch.Tensor, image_hw: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RPN outputs -> ``(proposals [B, post_nms_top_n, 4], valid [B, post_nms_top_n])``.

        Proposals carry no gradient (as in Faster R-CNN's approximate joint training).
        """
        cfg = self.config
        batch, count = logits.shape
        pre = min(cfg.rpn_pre_nms_top_n, count)
        post = cfg.rpn_post_nms_top_n
        scores, order = logits.topk(pre, dim=1)
        top_deltas = deltas.gather(1, order[..., None].expand(-1, -1, 4))
        boxes = clip_boxes(decode_boxes(top_deltas, anchors[order], RPN_BOX_WEIGHTS), *image_hw)
        proposals = boxes.new_zeros((batch, post, 4))
        valid = torch.zeros((batch, post), dtype=torch.bool, device=boxes.device)
        for b in range(batch):  # NMS output sizes differ per image
            wh = boxes[b, :, 2:] - boxes[b, :, :2]
            large = (wh >= cfg.min_box_size).all(dim=1)
            image_boxes, image_scores = boxes[b][large], scores[b][large]
            keep = nms(image_boxes, image_scores, cfg.rpn_nms_threshold)[:post]
            proposals[b, : keep.numel()] = image_boxes[keep]
            valid[b, : keep.numel()] = True
        return proposals, valid

    # -- losses ----------------------------------------------------------------------------------------

    def _rpn_losses(
        self,
        anchors: torch.Tensor,
        logits: torch.Tensor,
        deltas: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_valid: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        cfg = self.config
        with torch.no_grad():
            iou = box_iou(gt_boxes, anchors[None])  # [B, K, N]
            iou = torch.where(gt_valid[..., None], iou, -1.0)
            best_iou, matched = iou.max(dim=1)  # per anchor
            labels = torch.full_like(best_iou, -1.0)
            labels = torch.where(best_iou < cfg.rpn_bg_iou, 0.0, labels)
            labels = torch.where(best_iou >= cfg.rpn_fg_iou, 1.0, labels)
            # Each ground-truth box also claims the anchors it overlaps best, so none goes unmatched.
            best_per_gt = iou.amax(dim=2, keepdim=True)
            is_best = ((iou == best_per_gt) & (best_per_gt > 0) & gt_valid[..., None]).any(dim=1)
            labels = torch.where(is_best, 1.0, labels)
            indices, valid, positive = sample_fixed(labels, cfg.rpn_batch_size, cfg.rpn_positive_fraction)
            matched_boxes = gt_boxes.gather(1, matched.gather(1, indices)[..., None].expand(-1, -1, 4))
            targets = encode_boxes(matched_boxes, anchors[indices], RPN_BOX_WEIGHTS)
            targets = torch.where(positive[..., None], targets, 0.0)
            num_sampled = valid.sum().clamp(min=1)
        sampled_logits = logits.gather(1, indices)
        objectness = F.binary_cross_entropy_with_logits(
            sampled_logits, positive.to(logits.dtype), reduction="none"
        )
        sampled_deltas = deltas.gather(1, indices[..., None].expand(-1, -1, 4))
        box = F.smooth_l1_loss(sampled_deltas, targets, beta=1.0 / 9, reduction="none").sum(-1)
        return {
            "rpn_objectness": (objectness * valid).sum() / num_sampled,
            "rpn_box": (box * positive).sum() / num_sampled,
        }

    @torch.no_grad()
    def _sample_rois(
        self,
        proposals: torch.Tensor,
        proposal_valid: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_labels: torch.Tensor,
        gt_valid: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Match proposals (+ the ground truth itself) to boxes and sample ``roi_batch_size`` RoIs per image.

        Returns ``(rois [B, S, 4], classes [B, S], box targets [B, S, 4], valid [B, S], positive [B, S])``.
        """
        cfg = self.config
        # Adding the ground-truth boxes guarantees positives early in training.
        candidates = torch.cat((proposals, gt_boxes), dim=1)
        candidate_valid = torch.cat((proposal_valid, gt_valid), dim=1)
        iou = box_iou(gt_boxes, candidates)
        iou = torch.where(gt_valid[..., None], iou, -1.0)
        best_iou, matched = iou.max(dim=1)
        labels = torch.where(best_iou >= cfg.roi_fg_iou, 1.0, 0.0)
        labels = torch.where(candidate_valid, labels, -1.0)
        indices, valid, positive = sample_fixed(labels, cfg.roi_batch_size, cfg.roi_positive_fraction)
        rois = candidates.gather(1, indices[..., None].expand(-1, -1, 4))
        matched = matched.gather(1, indices)
        classes = torch.where(positive, gt_labels.gather(1, matched), 0)
        matched_boxes = gt_boxes.gather(1, matched[..., None].expand(-1, -1, 4))
        targets = encode_boxes(matched_boxes, rois, ROI_BOX_WEIGHTS)
        targets = torch.where(positive[..., None], targets, 0.0)
        return rois, classes, targets, valid, positive

    def forward(
        self, images: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """One training pass: ``images [B, 3, H, W]``, ``boxes [B, K, 4]`` xyxy pixels, ``labels [B, K]``.

        Labels are in ``1..num_classes``; a label ``<= 0`` marks a padding box that is ignored.
        """
        height, width = images.shape[-2:]
        # Box geometry stays in float32 whatever the image dtype (or autocast) is.
        boxes = boxes.to(device=images.device, dtype=torch.float32)
        labels = labels.to(images.device)
        gt_valid = labels > 0
        features = self.backbone(images)
        feat_h, feat_w = features.shape[-2:]
        stride = (height / feat_h, width / feat_w)
        anchors = generate_anchors(
            (feat_h, feat_w),
            stride,
            self.config.anchor_sizes,
            self.config.aspect_ratios,
            device=images.device,
            dtype=torch.float32,
        )
        logits, deltas = self.rpn(features)
        logits, deltas = logits.float(), deltas.float()
        losses = self._rpn_losses(anchors, logits, deltas, boxes, gt_valid)

        proposals, proposal_valid = self.propose(anchors, logits.detach(), deltas.detach(), (height, width))
        rois, classes, targets, valid, positive = self._sample_rois(
            proposals, proposal_valid, boxes, labels, gt_valid
        )
        pooled = roi_align(
            features,
            rois,
            self.config.roi_output_size,
            spatial_scale=feat_h / height,
            sampling_ratio=self.config.sampling_ratio,
        )
        head = torch.flatten(self.avgpool(self.box_head(pooled)), 1)
        # Losses in float32 also under autocast.
        class_logits = self.cls_score(head).float()
        box_deltas = self.bbox_pred(head).float().reshape(head.shape[0], -1, 4)

        classes, targets = classes.reshape(-1), targets.reshape(-1, 4)
        valid, positive = valid.reshape(-1).float(), positive.reshape(-1).float()
        num_sampled = valid.sum().clamp(min=1)
        cls_loss = F.cross_entropy(class_logits, classes, reduction="none")
        class_deltas = box_deltas.gather(1, classes[:, None, None].expand(-1, 1, 4)).squeeze(1)
        box_loss = F.smooth_l1_loss(class_deltas, targets, beta=1.0, reduction="none").sum(-1)
        losses["roi_cls"] = (cls_loss * valid).sum() / num_sampled
        losses["roi_box"] = (box_loss * positive).sum() / num_sampled
        return losses
