"""``dnnperf.predict``: the performance model's answer for a user's own model, in one call."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dnnperf.errors import UsageError
from dnnperf.perfmodel.graph import ScalableGraph, describe_model, example_rows, first_rows, tensors_in
from dnnperf.perfmodel.machine import Machine, preset
from dnnperf.perfmodel.predict import Prediction
from dnnperf.perfmodel.predict import predict as predict_graph
from dnnperf.perfmodel.subnormals import warnings_of


def predict(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    machine: str | Machine | None = None,
    batch_size: int | None = None,
    strategy: str = "single",
) -> Prediction:
    """Predict one training step of ``model`` on ``batch`` (a tensor, or a dict, tuple or list of
    tensors, as ``loss_fn(model, batch)`` takes it; their first dimension is the batch): step time
    (``.step_s``, with ``.compute_s``, ``.communication_s``, ``.bubble_s``, ``.other_s`` and, per phase,
    ``.detail["phases_s"]``) and the peak memory per device (``.memory_bytes``, its parts in
    ``.memory``).

    ``machine``: a preset's name (``dnnperf.perfmodel.machine.PRESETS``), a :class:`Machine`, or None for
    this host's device the batch is on, as ``dnnperf hw`` calibrated it. ``batch_size``: the batch to
    predict at (default: the example batch's; dp: the global batch), from a second description at half
    the example batch (FLOPs, bytes and activations are affine in the batch). Loss and optimizer as in
    :func:`~dnnperf.perfmodel.graph.describe_model`, which runs real steps and puts the model back.
    On this host's CPU (``machine=None``) both descriptions time the host between their operator calls
    too, seven more steps each: the model's own Python is charged at its part that does not grow with
    the batch (``ComputeOptions.fixed_gaps``).
    A phase whose operator outputs are 0.1% subnormal floats or more gets a RuntimeWarning
    (``.detail["subnormal_outputs"]`` has every phase's share, ``.detail["subnormal_slowdown"]`` how
    much slower each phase ran with them than flushed to zero where the model was described:
    perfmodel/subnormals.py)."""
    example = example_rows(batch)
    device = next(t.device for t in tensors_in(batch))
    resolved = resolve_machine(machine, device, fsdp=strategy == "fsdp")
    # This host's CPU charges the model's own Python between its calls, at the part that does not
    # grow with the batch (ComputeOptions.fixed_gaps): two descriptions, each with its gaps timed.
    gaps = device.type == "cpu" and resolved.replay_device == "cpu" and example >= 2
    graph = describe_model(model, batch, loss_fn=loss_fn, optimizer=optimizer, time_gaps=gaps)
    if batch_size is None and not gaps:
        prediction = predict_graph(graph, resolved, example, strategy)
    elif example < 2:
        raise UsageError("predicting at another batch size needs an example batch of at least 2")
    else:
        source = scalable(graph, model, batch, loss_fn, optimizer)
        prediction = predict_graph(source, resolved, batch_size or example, strategy)
    for text in warnings_of(prediction.detail):
        warnings.warn(text, RuntimeWarning, stacklevel=2)
    return prediction


def scalable(
    graph: Any,
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> ScalableGraph:
    """``graph`` (the description of ``model`` on ``batch``) made predictable at any batch size.

    FLOPs, bytes and activations are affine in the batch: a second description at half the example
    batch gives the step at any batch size (its host gaps timed if ``graph``'s were)."""
    half = describe_model(
        model,
        first_rows(batch, example_rows(batch) // 2),
        loss_fn=loss_fn,
        optimizer=optimizer,
        time_gaps=bool(graph.gaps),
    )
    return ScalableGraph(graph, half)


def resolve_machine(machine: str | Machine | None, device: torch.device, fsdp: bool = False) -> Machine:
    """A preset by name, a Machine as given, or (None) ``device`` as this host's profile calibrated it:
    one device, so no link between devices, and FSDP's host work only where asked (``fsdp``)."""
    if isinstance(machine, Machine):
        return machine
    if isinstance(machine, str):
        return preset(machine)
    if machine is None:
        from dnnperf.perfmodel.validate import calibrated_machine  # runs the model's calibrations

        return calibrated_machine(device.type, collectives=(), fsdp=fsdp)
    raise UsageError(f"machine must be a preset's name, a Machine or None, got {type(machine).__name__}")
