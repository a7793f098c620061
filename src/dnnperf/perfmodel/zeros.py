"""Operators whose kernels may take a slow path on inputs equal to zero, and the zeros a step feeds them.

On this project's Xeon, ``torch.sqrt`` of a million zeros takes 17 times as long as of a million
positive values (``log`` 35 times); ``rsqrt``, ``exp``, ``tanh`` and the rest run at one speed. Adam
takes the square root of its second moments every step, and an embedding row no batch has touched
yet has a second moment of exactly zero: neumf's update spends most of its time there. A description
made of shapes cannot see it, so the description counts, for these operators only, how many input
elements are zero (:class:`ZeroCounts`), and the calibration measures what a zero costs on this host
(``calibrate.zero_operand_cost``); whether a kernel is slow on zeros is the machine's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dnnperf.probes.opcount import tensors_of

#: Operator (as the description names it) -> a call of it on one tensor, for the microbenchmark.
CANDIDATES: dict[str, Callable[[torch.Tensor], Any]] = {
    "aten.sqrt": torch.sqrt,
    "aten._foreach_sqrt": lambda x: torch._foreach_sqrt([x]),
    "aten.rsqrt": torch.rsqrt,
    "aten.log": torch.log,
    "aten.reciprocal": torch.reciprocal,
}


def zero_elements(value: Any) -> int:
    """Elements equal to zero in a tensor or a list of tensors (meta tensors: none known)."""
    return sum(int((t == 0).sum()) for t in tensors_of(value) if t.device.type != "meta")


class ZeroCounts:
    """An ``OpCounter`` observer: zero input elements per (module, phase, operator) of the candidates."""

    def __init__(self) -> None:
        self.zeros: dict[tuple[str, str, str], int] = {}

    def __call__(self, module: str, phase: str, call: Any, info: Any) -> None:
        if info.name in CANDIDATES and call.args:
            key = (module, phase, info.name)
            self.zeros[key] = self.zeros.get(key, 0) + zero_elements(call.args[0])
