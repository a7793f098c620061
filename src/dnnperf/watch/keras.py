"""``StepCallback``: a Keras callback that marks every training batch for ``dnnperf watch``.

Keras is imported when the callback is first asked for, so this module imports without it::

    from dnnperf.watch.keras import StepCallback
    model.fit(x, y, callbacks=[StepCallback()])
"""

from __future__ import annotations

from functools import cache
from typing import Any

from dnnperf.watch.marks import mark_step


@cache
def step_callback_class() -> type:
    """The callback class, built on the installed Keras's ``Callback``."""
    import keras

    class StepCallback(keras.callbacks.Callback):
        """Calls :func:`dnnperf.watch.marks.mark_step` at the end of every training batch, with the
        number of batches trained so far (Keras's own batch index starts again every epoch)."""

        def __init__(self) -> None:
            super().__init__()
            self.steps = 0

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            mark_step(self.steps)
            self.steps += 1

    return StepCallback


def __getattr__(name: str) -> Any:
    if name == "StepCallback":
        return step_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
