"""The process that trains one framework's model: ``python -m dnnperf.frameworks.child SPEC``.

``SPEC`` is a JSON object (``dnnperf.frameworks.bench`` writes it): the framework, the workload and its
preset's config, the batch sizes, steps, warm-up and seed, where to read the data (an ``.npz`` of
images and labels per batch size, for Keras) and where to write the result (JSON). One child per run,
so that a Keras backend, chosen by ``KERAS_BACKEND`` before Keras is imported, never shares a process
with another framework's threads. Every step ends with ``mark_step`` for the watcher around it.

For Keras a step is one ``train_on_batch`` call on a batch already converted to the backend's tensors:
forward, loss, backward and the SGD update, compiled (``tf.function`` or ``jax.jit``) after the first
call, and synchronised when it returns the loss to the host. Its time is the host's wall clock around
the call. For torch the child runs ``dnnperf.runner.bench`` itself, the in-process bench unchanged.

The result is written after every batch size and when the child is stopped (Ctrl-C or SIGTERM, which
the watcher passes on), so a child stopped part-way leaves what it measured.
Errors are written into the result, not to the terminal (the frameworks' own logs are silenced).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from dnnperf.interrupts import interrupted_exit_code, stop_if_requested, stop_on_signals
from dnnperf.watch.marks import mark_step


def write_result(path: str, result: dict[str, Any]) -> None:
    # The result file is the parent's in-memory file: rewritten whole each time.
    with open(path, "w") as file:
        json.dump(result, file)


def is_oom(error: BaseException) -> bool:
    """Whether ``error`` is the framework saying it ran out of memory."""
    text = f"{type(error).__name__} {error}"
    return isinstance(error, MemoryError) or "ResourceExhausted" in text or "RESOURCE_EXHAUSTED" in text


def keras_versions() -> dict[str, str]:
    import keras

    versions = {"keras": keras.__version__}
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        versions["tensorflow"] = tf.__version__
    elif backend == "jax":
        import jax
        import jaxlib

        versions["jax"], versions["jaxlib"] = jax.__version__, jaxlib.__version__
    return versions


def framework_threads() -> dict[str, Any]:
    """The backend's CPU thread pools as configured (0 or absent: the framework's own default)."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return {
            "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        }
    return {"xla_flags": os.environ.get("XLA_FLAGS", "")}


def run_keras(spec: dict[str, Any]) -> dict[str, Any]:
    """Train the Keras model at every batch size of ``spec``; the result document."""
    import keras
    import numpy as np

    from dnnperf.frameworks.keras_models import build

    result: dict[str, Any] = {"points": [], "software": keras_versions(), "threads": framework_threads()}
    result["backend"] = keras.backend.backend()
    per_point = spec["warmup"] + spec["steps"]
    with np.load(spec["data"], allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    for index, batch_size in enumerate(spec["batch_sizes"]):
        point: dict[str, Any] = {"batch_size": batch_size, "status": "running", "warmup_s": [], "step_s": [],
                                 "loss": [], "error": None}  # fmt: skip
        result["points"].append(point)
        try:
            model = build(spec["workload"], spec["config"], spec["seed"])
            images, labels = arrays[f"image_{batch_size}"], arrays[f"label_{batch_size}"]
            pool = len(images) // batch_size
            batches = [
                (
                    keras.ops.convert_to_tensor(images[i * batch_size : (i + 1) * batch_size]),
                    keras.ops.convert_to_tensor(labels[i * batch_size : (i + 1) * batch_size]),
                )
                for i in range(pool)
            ]
            for step in range(per_point):
                # A stop whose KeyboardInterrupt the backend's native code swallowed still stops here.
                stop_if_requested()
                x, y = batches[step % pool]
                began = time.perf_counter()
                loss = model.train_on_batch(x, y)  # returns the loss as a host number: synchronised
                took = time.perf_counter() - began
                mark_step(index * per_point + step)
                (point["warmup_s"] if step < spec["warmup"] else point["step_s"]).append(took)
                value = float(np.asarray(loss).reshape(-1)[0])
                point["loss"].append(value if np.isfinite(value) else None)
            point["status"] = "complete"
        except KeyboardInterrupt:  # stopped: what was measured is written, then the stop goes on
            point["status"] = "partial"
            write_result(spec["result"], result)
            raise
        except Exception as error:  # one batch size's failure is recorded; an OOM lets the sweep go on
            point["status"] = "oom" if is_oom(error) else "failed"
            point["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            if point["status"] == "failed":
                write_result(spec["result"], result)
                break
        finally:
            model = batches = None
            keras.backend.clear_session()
        write_result(spec["result"], result)
    return result


def run_torch(spec: dict[str, Any]) -> dict[str, Any]:
    """The in-process bench, unchanged, with every step marked; the result holds its record."""
    from dnnperf.runner import BenchSettings, Interrupted, RunFailed, bench

    settings = BenchSettings(
        workload=spec["workload"],
        preset=spec["preset"],
        batch_sizes=tuple(spec["batch_sizes"]),
        steps=spec["steps"],
        warmup=spec["warmup"],
        device=spec["device"],
        seed=spec["seed"],
    )
    sizes, per_point = list(settings.batch_sizes or ()), settings.steps_per_point
    position = -1  # the batch size's place in the sweep

    def marked(batch_size: int, done: int, total: int) -> None:
        # Numbered by batch-size place and step, as system_figures reads them: a batch size that runs
        # out of memory or stops early leaves a gap, not a shift of every later window.
        nonlocal position
        if done == 1:
            position = sizes.index(batch_size, position + 1)
        mark_step(position * per_point + done - 1)

    stopped = None
    try:
        record = bench(settings, on_step=marked)
    except RunFailed as failure:
        record = failure.record
    except Interrupted as interrupt:
        record, stopped = interrupt.record, interrupt
    result = {"record": record.to_dict()}
    write_result(spec["result"], result)
    if stopped is not None:
        raise stopped
    return result


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    # The frameworks' import-time logs would reach the terminal of the parent's command: errors go
    # into the result instead.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        with stop_on_signals():  # SIGTERM, as Ctrl-C, stops the run and leaves its result written
            (run_torch if spec["framework"] == "torch" else run_keras)(spec)
    except KeyboardInterrupt:
        return interrupted_exit_code()
    except Exception as error:
        write_result(spec["result"], {"error": f"{type(error).__name__}: {error}".splitlines()[0][:300]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
