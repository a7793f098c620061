"""What a workload is: a model at a preset, its data, its loss and optimizer, and one training step.

A training step reads top to bottom (forward, backward, update); each phase sits in a ``stages(name)``
block so that a stage profiler can time it without the step knowing how. The default clock does nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

if TYPE_CHECKING:
    from dnnperf.data.formats import DataFormat

Batch = dict[str, torch.Tensor]

PRESET_NAMES = ("tiny", "small", "full")

# The stage names a training step reports, in data-flow order. Reading, preprocessing and copying are
# the runner's; "environment" is reinforcement learning's data stage (playing the game inside the step).
STAGE_NAMES = ("read", "preprocess", "copy", "environment", "forward", "backward", "update", "exchange")


class Stages(Protocol):
    """A clock the step reports its phases to: ``with stages("forward"): ...``."""

    def __call__(self, name: str) -> AbstractContextManager[Any]: ...


def no_stages(name: str) -> AbstractContextManager[Any]:
    """The default clock: times nothing and costs next to nothing."""
    return nullcontext()


class Task(ABC):
    """One workload built at one preset on one device, ready to train."""

    #: Every trainable module of the workload (several networks are grouped in a ModuleDict).
    model: nn.Module

    @abstractmethod
    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        """Run one complete training step on a batch already on the device; return the detached loss."""

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer the task steps (WGAN-GP has two)."""
        return [value for value in vars(self).values() if isinstance(value, torch.optim.Optimizer)]

    def close(self) -> None:
        """Remove what the task attached to its model (hooks) once the run is over; nothing by default."""
        return None  # a task that attaches nothing has nothing to remove


class SupervisedTask(Task):
    """The common case: loss = loss_fn(model, batch); backward; optimizer step."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, Batch], torch.Tensor],
        optimizer: torch.optim.Optimizer,
    ) -> None:
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer

    def step(self, batch: Batch, stages: Stages = no_stages) -> torch.Tensor:
        with stages("forward"):
            loss = self.loss_fn(self.model, batch)
        backward_and_update(loss, self.optimizer, stages)
        return loss.detach()


def backward_and_update(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    stages: Stages,
    inputs: list[torch.Tensor] | None = None,
) -> None:
    """The second half of every training step: gradients (into ``inputs`` only, when given), then the
    optimizer's update."""
    with stages("backward"):
        loss.backward(inputs=inputs)
    with stages("update"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class Workload:
    """A named training job of the suite, buildable at each of its presets."""

    name: str
    domain: str
    summary: str
    #: Preset name ("tiny", "small", "full") -> the model's config dataclass.
    presets: Mapping[str, Any]
    #: Preset name -> the batch size used when none is given.
    default_batch_size: Mapping[str, int]
    #: Builds model, optimizer and step for a config on a device.
    make_task: Callable[[Any, torch.device], Task]
    #: The data the step consumes at a config.
    make_data: Callable[[Any], DataFormat]
    #: What "one sample" means for throughput (an image, a sentence pair, an environment step...).
    sample_unit: str = "sample"
    notes: tuple[str, ...] = field(default=())

    def config(self, preset: str) -> Any:
        from dnnperf.errors import UsageError

        if preset not in self.presets:
            raise UsageError(
                f"unknown preset {preset!r} for {self.name}: choose one of {', '.join(self.presets)}"
            )
        return self.presets[preset]

    def build(self, preset: str, device: torch.device | str = "cpu") -> Task:
        """Build the task at a preset on a device (parameters initialised from torch's global RNG).

        Tensors are created on the device directly: no host copy to move, nothing allocated on
        ``meta``, and tied weights stay tied (moving a module to ``meta`` replaces each parameter).
        """
        device = torch.device(device)
        with device:
            return self.make_task(self.config(preset), device)

    def data(self, preset: str) -> DataFormat:
        return self.make_data(self.config(preset))

    def batch_size(self, preset: str, given: int | None = None) -> int:
        """The batch size a run at ``preset`` trains: ``given``, else the preset's default (the one
        place the default is looked up)."""
        self.config(preset)  # an unknown preset is a UsageError naming the choices, not a KeyError
        return given if given is not None else self.default_batch_size[preset]


def count_parameters(module: nn.Module) -> int:
    """Number of trainable parameter elements, each shared tensor counted once."""
    seen: set[int] = set()
    total = 0
    for parameter in module.parameters():
        if parameter.requires_grad and id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    return total
