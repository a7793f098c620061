"""Image classification: the basic CNN of seed 000, AlexNet, VGG-16/19, ResNet-18/50, Inception-v3.

Cross-entropy loss and SGD with momentum 0.9 and weight decay 1e-4, the recipe these models were
published with, at learning rate 0.01: AlexNet's and VGG's published rate, and ResNet's 0.1 at batch 256
scaled linearly to the suite's batch sizes. Learning-rate schedules are left out: a benchmark step does
not need one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.data.formats import ImageFormat
from dnnperf.models import vision
from dnnperf.workloads.base import Batch, SupervisedTask, Task, Workload
from dnnperf.workloads.registry import register

# Inception-v3 trains with its auxiliary classifier weighted 0.4 (Szegedy et al. 2016).
AUX_LOSS_WEIGHT = 0.4
LEARNING_RATE = 0.01


def classification_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    output = model(batch["image"])
    if isinstance(output, tuple):  # (logits, auxiliary logits)
        logits, aux = output
        return F.cross_entropy(logits, batch["label"]) + AUX_LOSS_WEIGHT * F.cross_entropy(
            aux, batch["label"]
        )
    return F.cross_entropy(output, batch["label"])


def _task_builder(model_class: Callable[[Any], nn.Module]) -> Callable[[Any, torch.device], Task]:
    def make_task(config: Any, device: torch.device) -> Task:
        model = model_class(config).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9, weight_decay=1e-4)
        return SupervisedTask(model, classification_loss, optimizer)

    return make_task


def _images(config: Any) -> ImageFormat:
    return ImageFormat(image_size=config.image_size, num_classes=config.num_classes)


def _classifier(
    name: str,
    summary: str,
    model_class: Callable[[Any], nn.Module],
    presets: Mapping[str, Any],
    batch_sizes: tuple[int, int, int] = (8, 32, 64),
    notes: tuple[str, ...] = (),
) -> Workload:
    return register(
        Workload(
            name=name,
            domain="image classification",
            summary=summary,
            presets=presets,
            default_batch_size=dict(zip(("tiny", "small", "full"), batch_sizes, strict=True)),
            make_task=_task_builder(model_class),
            make_data=_images,
            sample_unit="image",
            notes=notes,
        )
    )


BASIC_CNN = _classifier(
    "basic_cnn",
    "two conv + two fully-connected layers (seed 000's basic CNN, CIFAR-sized)",
    vision.BasicCNN,
    vision.BASIC_CNN_PRESETS,
    batch_sizes=(8, 64, 128),
)
ALEXNET = _classifier(
    "alexnet", "AlexNet, single-tower (61.1 M parameters)", vision.AlexNet, vision.ALEXNET_PRESETS
)
VGG16 = _classifier("vgg16", "VGG-16 without batch norm (138.4 M)", vision.VGG, vision.VGG16_PRESETS)
VGG19 = _classifier("vgg19", "VGG-19 without batch norm (143.7 M)", vision.VGG, vision.VGG19_PRESETS)
RESNET18 = _classifier("resnet18", "ResNet-18 (11.7 M)", vision.ResNet, vision.RESNET18_PRESETS)
RESNET50 = _classifier("resnet50", "ResNet-50 v1.5 (25.6 M)", vision.ResNet, vision.RESNET50_PRESETS)
INCEPTION_V3 = _classifier(
    "inception_v3",
    "Inception-v3 at 299x299 (23.8 M without the auxiliary head)",
    vision.InceptionV3,
    vision.INCEPTION_V3_PRESETS,
    notes=(
        "parameter count excludes the auxiliary classifier unless the preset enables it (27.2 M with it)",
    ),
)
