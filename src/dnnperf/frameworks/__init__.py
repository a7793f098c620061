"""The suite's CNNs in other frameworks: ``basic_cnn`` and ``alexnet`` in Keras 3 on TensorFlow and JAX.

:func:`bench_framework` trains a workload in a fresh child process per framework, under
``dnnperf.watch`` (the process tree's resident memory, page faults and busy cores), and returns a
normal ``bench`` record: step times, throughput, and per batch size the system figures
(:func:`system_figures`). ``torch`` through the same path is the in-process bench, run in the child.
Needs the ``frameworks`` extra for TensorFlow and JAX (Keras, tensorflow-cpu, jax[cpu]).

Names are imported on first use: importing this package imports neither torch nor Keras.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Every framework ``--framework`` takes; the Keras backends among them.
FRAMEWORKS = ("torch", "tensorflow", "jax")
KERAS_FRAMEWORKS = ("tensorflow", "jax")
#: The workloads written in Keras.
KERAS_WORKLOADS = ("basic_cnn", "alexnet")

_EXPORTS = {
    "bench_framework": "dnnperf.frameworks.bench",
    "system_figures": "dnnperf.frameworks.bench",
    "missing_packages": "dnnperf.frameworks.bench",
}

__all__ = ["FRAMEWORKS", "KERAS_FRAMEWORKS", "KERAS_WORKLOADS", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
