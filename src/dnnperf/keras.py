"""``dnnperf.keras.StepCallback``: a Keras callback marking every training batch for ``dnnperf watch``.

Importing this module does not import Keras; the class is built on Keras's ``Callback`` when first
asked for (:mod:`dnnperf.watch.keras`)::

    from dnnperf.keras import StepCallback
    model.fit(x, y, callbacks=[StepCallback()])
"""

from __future__ import annotations

from typing import Any

from dnnperf.watch.keras import step_callback_class


def __getattr__(name: str) -> Any:
    if name == "StepCallback":
        return step_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
