"""Object detection: Faster R-CNN with a ResNet-C4 backbone (ResNet-101 at full), two stages.

The loss is the sum of the model's four losses (RPN objectness and box, head classification and box);
SGD with momentum 0.9 and weight decay 1e-4 as in Detectron.
"""

from __future__ import annotations

import torch
from torch import nn

from dnnperf.data.formats import DetectionFormat
from dnnperf.models.detection import FASTER_RCNN_PRESETS, FasterRCNN
from dnnperf.workloads.base import Batch, SupervisedTask, Task, Workload
from dnnperf.workloads.registry import register


def detection_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    losses = model(batch["image"], batch["boxes"], batch["labels"])
    return torch.stack(list(losses.values())).sum()


def _faster_rcnn_task(config, device: torch.device) -> Task:
    model = FasterRCNN(config).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    return SupervisedTask(model, detection_loss, optimizer)


FASTER_RCNN = register(
    Workload(
        name="faster_rcnn",
        domain="object detection",
        summary="Faster R-CNN, ResNet-C4 backbone, RPN, RoIAlign, box head",
        presets=FASTER_RCNN_PRESETS,
        default_batch_size={"tiny": 2, "small": 4, "full": 2},
        make_task=_faster_rcnn_task,
        make_data=lambda c: DetectionFormat(
            image_size=c.image_size, num_classes=c.num_classes, boxes_per_image=c.max_boxes
        ),
        sample_unit="image",
    )
)
