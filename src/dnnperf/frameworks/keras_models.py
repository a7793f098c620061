"""``basic_cnn`` and ``alexnet`` in Keras 3, written once for any backend (TensorFlow, JAX).

Each mirrors its PyTorch twin in ``dnnperf.models.vision`` layer by layer: the same kernel sizes,
strides, padding and widths (so the same parameter count), PyTorch's default initialisation
(weights and biases uniform in +-1/sqrt(fan_in)), cross-entropy on logits, and SGD with momentum
0.9, learning rate 0.01 and weight decay 1e-4 applied as PyTorch applies it: added to the gradient
(an L2 penalty of 5e-5 * w**2 on every weight and bias, whose gradient is 1e-4 * w), not decoupled.
Images are channels-last (NHWC): TensorFlow's CPU convolutions take no other layout. The flatten
before the classifier therefore orders the same features differently; the shapes are the same.

This module imports Keras, never torch: it runs in the child process of ``dnnperf.frameworks``
whose backend was chosen (``KERAS_BACKEND``) before Keras was imported.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import keras
from keras import layers

from dnnperf.frameworks import KERAS_WORKLOADS

#: The PyTorch workloads' optimizer recipe (``dnnperf.workloads.classification``).
LEARNING_RATE = 0.01
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4

MODELS = KERAS_WORKLOADS


# PyTorch's default Conv2d/Linear weight init, kaiming_uniform(a=sqrt(5)), is U(+-sqrt(1/fan_in)):
# variance scaling with scale 1/3 gives the bound sqrt(3 * scale / fan_in), the same one.
class Seeds:
    """A distinct seed for every initializer and dropout of one model, from the run's seed.

    Explicit seeds, not ``keras.utils.set_random_seed``: that one imports TensorFlow whatever the
    backend, which would put TensorFlow's threads into a JAX process."""

    def __init__(self, seed: int) -> None:
        self.counter = itertools.count(seed * 1000)

    def __call__(self) -> int:
        return next(self.counter)


def weights(seeds: Seeds) -> keras.initializers.Initializer:
    return keras.initializers.VarianceScaling(
        scale=1 / 3, mode="fan_in", distribution="uniform", seed=seeds()
    )


def bias(fan_in: int, seeds: Seeds) -> keras.initializers.Initializer:
    bound = 1 / math.sqrt(fan_in)
    return keras.initializers.RandomUniform(-bound, bound, seed=seeds())


def decay() -> keras.regularizers.Regularizer:
    # The gradient of (WEIGHT_DECAY / 2) * w**2 is WEIGHT_DECAY * w: torch.optim.SGD's weight_decay.
    return keras.regularizers.L2(WEIGHT_DECAY / 2)


def conv(
    seeds: Seeds,
    in_channels: int,
    filters: int,
    kernel: int,
    stride: int = 1,
    padding: int = 0,
    name: str = "",
) -> list[layers.Layer]:
    """A PyTorch-style Conv2d: explicit zero padding, then a valid convolution."""
    fan_in = in_channels * kernel * kernel
    made: list[layers.Layer] = [layers.ZeroPadding2D(padding, name=f"{name}_pad")] if padding else []
    made.append(
        layers.Conv2D(
            filters,
            kernel,
            strides=stride,
            padding="valid",
            kernel_initializer=weights(seeds),
            bias_initializer=bias(fan_in, seeds),
            kernel_regularizer=decay(),
            bias_regularizer=decay(),
            name=name,
        )
    )
    return made


def dense(seeds: Seeds, in_features: int, units: int, name: str) -> layers.Dense:
    """A PyTorch-style Linear."""
    return layers.Dense(
        units,
        kernel_initializer=weights(seeds),
        bias_initializer=bias(in_features, seeds),
        kernel_regularizer=decay(),
        bias_regularizer=decay(),
        name=name,
    )


def scaled(channels: int, mult: float) -> int:
    """AlexNet's channel scaling, as ``dnnperf.models.vision`` rounds it."""
    return max(1, round(channels * mult))


def stage(
    seeds: Seeds, in_channels: int, filters: int, kernel: int, index: int, stride: int = 1, padding: int = 0,
    pool: int | None = None,
) -> list[layers.Layer]:  # fmt: skip
    """conv{index} -> relu{index}, then a max-pool of ``pool`` (stride 2) when given."""
    made = [*conv(seeds, in_channels, filters, kernel, stride, padding, name=f"conv{index}")]
    made.append(layers.ReLU(name=f"relu{index}"))
    if pool is not None:
        made.append(layers.MaxPooling2D(pool, 2, name=f"pool{index}"))
    return made


def basic_cnn(config: dict[str, Any], seeds: Seeds) -> keras.Model:
    """conv5x5 -> ReLU -> maxpool2, twice, then flatten -> Dense(hidden) -> ReLU -> Dense(classes)."""
    c1, c2 = config["channels"]
    size, hidden = config["image_size"], config["hidden"]
    spatial = size // 2 // 2
    stack = [
        keras.Input((size, size, config["in_channels"])),
        *stage(seeds, config["in_channels"], c1, 5, 1, padding=2, pool=2),
        *stage(seeds, c1, c2, 5, 2, padding=2, pool=2),
        layers.Flatten(name="flatten"),
        dense(seeds, c2 * spatial * spatial, hidden, "fc1"),
        layers.ReLU(name="relu3"),
        dense(seeds, hidden, config["num_classes"], "fc2"),
    ]
    return keras.Sequential(stack, name="basic_cnn")


def alexnet(config: dict[str, Any], seeds: Seeds) -> keras.Model:
    """Five convs with three max-pools, a 6x6 adaptive average pool and a three-layer classifier."""
    c1, c2, c3, c4, c5 = (scaled(c, config["width_mult"]) for c in (64, 192, 384, 256, 256))
    size, hidden, rate = config["image_size"], config["classifier_width"], config["dropout"]
    stack = [
        keras.Input((size, size, config["in_channels"])),
        *stage(seeds, config["in_channels"], c1, 11, 1, stride=4, padding=2, pool=3),
        *stage(seeds, c1, c2, 5, 2, padding=2, pool=3),
        *stage(seeds, c2, c3, 3, 3, padding=1),
        *stage(seeds, c3, c4, 3, 4, padding=1),
        *stage(seeds, c4, c5, 3, 5, padding=1, pool=3),
        # The same 6x6 as PyTorch's AdaptiveAvgPool2d, so the classifier's shape is the input's.
        layers.AdaptiveAveragePooling2D((6, 6), name="avgpool"),
        layers.Flatten(name="flatten"),
        layers.Dropout(rate, seed=seeds(), name="dropout1"),
        dense(seeds, c5 * 6 * 6, hidden, "fc1"),
        layers.ReLU(name="relu6"),
        layers.Dropout(rate, seed=seeds(), name="dropout2"),
        dense(seeds, hidden, hidden, "fc2"),
        layers.ReLU(name="relu7"),
        dense(seeds, hidden, config["num_classes"], "fc3"),
    ]
    return keras.Sequential(stack, name="alexnet")


def build(workload: str, config: dict[str, Any], seed: int = 0) -> keras.Model:
    """The workload's model for ``config`` (its preset's fields), compiled with the PyTorch recipe."""
    if workload not in MODELS:
        raise ValueError(f"no Keras version of {workload!r}: one of {', '.join(MODELS)}")
    seeds = Seeds(seed)
    model = basic_cnn(config, seeds) if workload == "basic_cnn" else alexnet(config, seeds)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model
