"""Microbenchmarks the model calibrates from (besides ``dnnperf hw``), never the runs it predicts.

:func:`op_overhead` times eager training steps of a network whose operators do next to no arithmetic
(32 blocks of a 4x4 linear layer and a ReLU, batch 2, SGD with momentum): the step time divided by the
kernel calls it dispatches is what one operator call of a training step costs on the host (dispatch,
autograd bookkeeping, module calls). ``dnnperf hw``'s dispatch overhead times a bare ``torch.add``
without autograd and is several times smaller.
"""

from __future__ import annotations

import platform
import statistics
import time

import torch
from torch import nn

from dnnperf.analysis.opcount import OpCounter
from dnnperf.cache import JsonCache
from dnnperf.model.compute import NO_KERNEL

BLOCKS = 32


def _tiny_step() -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(BLOCKS)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randn(2, 4)

    def step(stages: object = None) -> None:
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def kernel_calls() -> int:
    """Operator calls (views and metadata excluded) of one step of the tiny network."""
    model, step = _tiny_step()
    step()  # the optimizer's first step creates its state: count a later one
    counter = OpCounter(model, count=False)
    with counter:
        step()
    return sum(r.calls for r in counter.table() if r.family not in NO_KERNEL)


def measure_op_overhead(repeats: int = 30) -> float:
    """Seconds per operator call: the median step of the tiny network over its kernel calls."""
    calls = kernel_calls()
    _, step = _tiny_step()
    for _ in range(5):
        step()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) / calls


def op_overhead(refresh: bool = False) -> float:
    """The per-call overhead of this host at the current thread count, measured once and cached."""
    store = JsonCache("model-calibration")
    key = f"op_overhead/{platform.node()}/{torch.get_num_threads()}/{torch.__version__}"
    cached = store.get(key)
    if isinstance(cached, (int, float)) and cached > 0 and not refresh:
        return float(cached)
    value = measure_op_overhead()
    store.put(key, value)
    return value
