"""Third-party networks as workloads: ``timm:NAME`` (a timm image classifier) and ``hf:MODEL_TYPE`` (a
HuggingFace transformers language model or image classifier built from its configuration's defaults).

Nothing is downloaded: timm models are built with ``pretrained=False`` and transformers models from
``AutoConfig.for_model``, both with random weights. Neither library is imported until such a name is
asked for (``pip install dnnperf[zoo]`` installs both).

The presets shrink a model as the suite's own presets do:

- timm (image classification: cross-entropy, the suite's SGD): ``full`` is the library's model with
  1000 classes at its default input size; ``small`` 100 classes at about half that size; ``tiny`` 10
  classes at about a quarter, and 2 blocks where the model's constructor takes a ``depth``. Width is the
  library's at every preset.
- transformers (the model's own loss: causal LM with labels = input ids, masked LM for encoders,
  seq2seq for encoder-decoders): ``full`` is the configuration's defaults with sequences of the longest
  power of two its positions allow (at most 1024; 512 without learned positions); ``small`` 4 layers,
  width 256, 4 heads, a 4096-token vocabulary and 128-token sequences; ``tiny`` 2 layers, width 64,
  4 heads, 256 tokens and 16-token sequences (feed-forward 4x the width, 2x the sequence in positions).
- transformers image classifiers (a model type with no language-modelling head that maps to
  ``AutoModelForImageClassification``: cross-entropy through the model's ``labels``, the suite's SGD):
  ``full`` is the configuration's defaults with 1000 classes at its ``image_size`` (224 without one);
  ``small`` 100 classes at about half that size, half the blocks of each stage (rounded up) or, for a
  plain transformer (ViT, DeiT), 4 layers of width 256 with 4 heads; ``tiny`` 10 classes at about a
  quarter, one block a stage or 2 layers of width 64. Stage widths are the library's. A compound-scaled
  family (EfficientNet, whose defaults are B7 at 600 pixels) is its base model B0 at 224 below ``full``.
"""

from __future__ import annotations

import difflib
import inspect
import math
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
from torch import nn

from dnnperf.data.formats import DataFormat, ImageFormat, LanguageModelFormat, TranslationFormat
from dnnperf.errors import UsageError
from dnnperf.workloads.base import PRESET_NAMES, Batch, SupervisedTask, Task, Workload
from dnnperf.workloads.classification import LEARNING_RATE, classification_loss
from dnnperf.workloads.registry import register_third_party

#: The extra that installs each library (timm also needs a torchvision built for the installed torch).
INSTALL_HINTS = {"timm": "pip install 'dnnperf[timm]'", "transformers": "pip install 'dnnperf[zoo]'"}
CLASSES = {"tiny": 10, "small": 100, "full": 1000}
IMAGE_BATCH_SIZES = {"tiny": 8, "small": 32, "full": 64}
#: Per preset: the share of the model's default input size, as the suite's image presets shrink 224.
RESOLUTION_SCALE = {"tiny": 64 / 224, "small": 128 / 224, "full": 1.0}
#: The transformers presets: layers, width, heads, vocabulary, sequence length (``full``: the defaults).
LANGUAGE_PRESETS = {"tiny": (2, 64, 4, 256, 16), "small": (4, 256, 4, 4096, 128)}
#: Token ids below 3 never occur in the suite's token data (padding, BOS, EOS): 1 marks masked tokens.
MASKED_TOKEN = 1
MASKED_SHARE = 0.15  # BERT's
CAUSAL, MASKED, SEQ2SEQ, IMAGE = "causal", "masked", "seq2seq", "image"
#: The image classifiers' presets for a plain transformer (ViT, DeiT): layers, width, heads.
IMAGE_TRANSFORMER_PRESETS = {"tiny": (2, 64, 4), "small": (4, 256, 4)}
#: A compound-scaled family's base model (EfficientNet-B0): its coefficients, the width of its last
#: convolution (``hidden_dim`` must equal it) and its input size.
BASE_SCALING = {"width_coefficient": 1.0, "depth_coefficient": 1.0, "hidden_dim": 1280}
BASE_SCALING_IMAGE_SIZE = 224


def _library(name: str, workload: str) -> Any:
    """The library imported, or a one-line UsageError saying how to install it."""
    import importlib

    try:
        return importlib.import_module(name)
    except Exception as error:  # not installed, or broken (a torchvision built for another torch)
        missing = isinstance(error, ModuleNotFoundError) and error.name == name
        why = "which is not installed" if missing else f"which cannot be imported ({error})"
        raise UsageError(f"{workload} needs {name}, {why}: {INSTALL_HINTS[name]}") from None


def _suggest(kind: str, name: str, prefix: str, choices: list[str]) -> UsageError:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(prefix + c for c in close)}?" if close else ""
    return UsageError(f"unknown {kind} {name!r}{hint}")


@cache
def third_party_workload(name: str) -> Workload:
    """The workload ``timm:NAME`` or ``hf:MODEL_TYPE``; a one-line UsageError for a bad name."""
    prefix, _, model = name.partition(":")
    if not model:
        raise UsageError(f"workload {name!r} names no model: write timm:NAME or hf:MODEL_TYPE")
    if prefix == "timm":
        return _timm_workload(model)
    if prefix == "hf":
        return _hf_workload(model)
    raise UsageError(f"unknown workload {name!r}: third-party models are named timm:NAME or hf:MODEL_TYPE")


def _training_on(model: nn.Module, device: torch.device) -> nn.Module:
    """The model in training mode on ``device`` (a library may build it in evaluation mode)."""
    return model.to(device).train()


# ---------------------------------------------------------------------------------------------------
# timm
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimmConfig:
    """A timm model at one preset: ``timm.create_model(model, num_classes=..., **arguments)``."""

    model: str
    image_size: int
    num_classes: int
    arguments: dict[str, Any] = field(default_factory=dict)


def _default_input_size(timm: Any, name: str) -> int:
    config = timm.models.get_pretrained_cfg(name)
    size = getattr(config, "input_size", None) if config is not None else None
    return int(size[-1]) if size else 224


def _timm_constructor_parameters(timm: Any, name: str) -> set[str]:
    """The keyword arguments the model's class takes (its class known by building it on ``meta``)."""
    with torch.device("meta"):
        probe = timm.create_model(name, pretrained=False)
    return set(inspect.signature(type(probe)).parameters)


def preset_image_size(default: int, preset: str) -> int:
    """The input size of ``preset`` for a model whose default is ``default`` pixels: the default at
    ``full``, else its RESOLUTION_SCALE share in a multiple of 32 (the stride of most backbones, so
    every stage keeps whole feature maps)."""
    if preset == "full":
        return default
    return max(32, 32 * round(default * RESOLUTION_SCALE[preset] / 32))


def _timm_presets(timm: Any, name: str) -> dict[str, TimmConfig]:
    default = _default_input_size(timm, name)
    accepted = _timm_constructor_parameters(timm, name)
    presets = {}
    for preset in PRESET_NAMES:
        size = preset_image_size(default, preset)
        arguments: dict[str, Any] = {}
        if "img_size" in accepted and preset != "full":  # models built for one input size (ViT, Swin)
            arguments["img_size"] = size
        if "depth" in accepted and preset == "tiny":
            arguments["depth"] = 2
        presets[preset] = TimmConfig(name, size, CLASSES[preset], arguments)
    return presets


def _timm_task(config: TimmConfig, device: torch.device) -> Task:
    import timm

    model = timm.create_model(
        config.model, pretrained=False, num_classes=config.num_classes, **config.arguments
    )
    model = _training_on(model, device)
    # The suite's image-classification recipe (workloads.classification).
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9, weight_decay=1e-4)
    return SupervisedTask(model, classification_loss, optimizer)


def _timm_workload(name: str) -> Workload:
    timm = _library("timm", f"timm:{name}")
    if not timm.is_model(name):
        raise _suggest("timm model", name, "timm:", timm.list_models())
    try:
        presets = _timm_presets(timm, name)
    except Exception as error:  # the library's own refusal, in one line
        raise UsageError(f"timm:{name} cannot be built: {error}") from None
    return Workload(
        name=f"timm:{name}",
        domain="image classification",
        summary=f"timm's {name} (random weights)",
        presets=presets,
        default_batch_size=IMAGE_BATCH_SIZES,
        make_task=_timm_task,
        make_data=lambda c: ImageFormat(image_size=c.image_size, num_classes=c.num_classes),
        sample_unit="image",
        notes=(
            "full: the library's model, 1000 classes, its default input size; small: 100 classes at half "
            "the size; tiny: 10 classes at a quarter, 2 blocks where the constructor takes a depth",
        ),
    )


# ---------------------------------------------------------------------------------------------------
# transformers
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HFConfig:
    """A transformers model at one preset: ``AutoConfig.for_model(model_type, **settings)`` with the
    head ``head`` (causal, masked or seq2seq), trained on ``seq_len``-token sequences."""

    model_type: str
    head: str
    seq_len: int
    vocab_size: int
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HFImageConfig:
    """A transformers image classifier at one preset: ``AutoConfig.for_model(model_type, **settings)``
    (``settings`` names its classes) trained on ``image_size`` pixels square."""

    model_type: str
    image_size: int
    num_classes: int
    settings: dict[str, Any] = field(default_factory=dict)
    head: str = IMAGE


def _head(model_type: str, config: Any) -> str:
    from transformers.models.auto import modeling_auto

    if getattr(config, "is_encoder_decoder", False):
        if model_type in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
            return SEQ2SEQ
    elif model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return MASKED  # an encoder (BERT-like); decoders have no masked-LM head
    elif model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return CAUSAL
    if model_type in modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        return IMAGE
    raise UsageError(
        f"hf:{model_type} has no language-modelling head (causal, masked or seq2seq) and no image "
        "classifier in transformers"
    )


def _present(config: Any, names: tuple[str, ...]) -> list[str]:
    """The names (standard ones mapped to the model's own) the configuration sets to a value."""
    mapping = getattr(config, "attribute_map", {})
    found = []
    for name in names:
        own = mapping.get(name, name)
        if getattr(config, own, None) is not None and own not in found:
            found.append(own)
    return found


def _shrunk_body(config: Any, layers: int, width: int, heads: int) -> dict[str, Any]:
    """The settings that shrink a transformer's layers, width, heads and feed-forward (4x the width);
    only attributes the configuration has are set."""
    groups = (
        (layers, ("num_hidden_layers", "num_decoder_layers", "encoder_layers", "decoder_layers")),
        (width, ("hidden_size", "d_model")),
        (
            heads,
            (
                "num_attention_heads",
                "num_key_value_heads",
                "encoder_attention_heads",
                "decoder_attention_heads",
            ),
        ),
        (width // heads, ("head_dim",)),
        (
            4 * width,
            ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim"),
        ),
    )
    return {name: value for value, names in groups for name in _present(config, names)}


def _shrunk(config: Any, layers: int, width: int, heads: int, vocab: int, seq_len: int) -> dict[str, Any]:
    """The settings that shrink a language model's configuration; only attributes it has are set."""
    settings = _shrunk_body(config, layers, width, heads)
    for name in _present(config, ("vocab_size",)):
        settings[name] = vocab
    for name in _present(config, ("max_position_embeddings",)):
        settings[name] = 2 * seq_len  # room for models whose positions start past 0
    # GPT-Neo lists its attention kinds per layer as [[pattern, repeats]]: as many as the layers.
    patterns = getattr(config, "attention_types", None)
    if patterns and isinstance(patterns[0][0], list):
        pattern = patterns[0][0]
        settings["attention_types"] = [[pattern, max(1, layers // len(pattern))]]
        settings["num_layers"] = len(pattern) * max(1, layers // len(pattern))
    # Special tokens past the shrunk vocabulary would index outside the embeddings.
    for name, value in vars(config).items():
        if name.endswith("_token_id") and isinstance(value, int) and value >= vocab:
            settings[name] = 0
    return settings


def _full_seq_len(config: Any) -> int:
    positions = next((getattr(config, n) for n in _present(config, ("max_position_embeddings",))), None)
    if not isinstance(positions, int) or positions <= 0:
        return 512
    return min(1024, 1 << (positions.bit_length() - 1))


def _hf_presets(transformers: Any, model_type: str) -> dict[str, HFConfig | HFImageConfig]:
    default = transformers.AutoConfig.for_model(model_type)
    head = _head(model_type, default)
    if head == IMAGE:
        return {p: _image_preset(default, model_type, p) for p in PRESET_NAMES}
    presets: dict[str, HFConfig | HFImageConfig] = {
        "full": HFConfig(model_type, head, _full_seq_len(default), int(default.vocab_size))
    }
    for preset, (layers, width, heads, vocab, seq_len) in LANGUAGE_PRESETS.items():
        settings = _shrunk(default, layers, width, heads, vocab, seq_len)
        presets[preset] = HFConfig(model_type, head, seq_len, vocab, settings)
    return {p: presets[p] for p in PRESET_NAMES}


def _image_preset(default: Any, model_type: str, preset: str) -> HFImageConfig:
    """An image classifier's configuration at ``preset`` (the module docstring says how each shrinks)."""
    tower = getattr(default, "vision_config", None)
    if getattr(default, "image_size", None) is None and isinstance(getattr(tower, "image_size", None), int):
        # A classifier on an image tower configured apart (CLIP's, SigLIP's): the tower shrinks as a
        # plain model does and is handed back whole.
        inner = _image_preset(tower, model_type, preset)
        settings = {k: v for k, v in inner.settings.items() if k != "num_labels"}
        return HFImageConfig(
            model_type,
            inner.image_size,
            CLASSES[preset],
            {"num_labels": CLASSES[preset], "vision_config": {**tower.to_dict(), **settings}},
        )
    settings: dict[str, Any] = {"num_labels": CLASSES[preset]}
    own_size = getattr(default, "image_size", None)
    pair = isinstance(own_size, (list, tuple)) and len(own_size) == 2  # (height, width): Hiera's
    pair = pair and all(isinstance(v, int) for v in own_size)
    size = own_size if isinstance(own_size, int) else own_size[0] if pair else 224
    if preset != "full":
        if all(hasattr(default, name) for name in BASE_SCALING):
            settings.update(BASE_SCALING)
            size = BASE_SCALING_IMAGE_SIZE
        depths = getattr(default, "depths", None)
        if isinstance(depths, (list, tuple)):  # a model in stages: fewer blocks a stage, widths kept
            settings["depths"] = [1 if preset == "tiny" else math.ceil(d / 2) for d in depths]
        elif all(isinstance(getattr(default, n, None), int) for n in ("hidden_size", "num_attention_heads")):
            settings.update(_shrunk_body(default, *IMAGE_TRANSFORMER_PRESETS[preset]))
    size = preset_image_size(size, preset)
    if isinstance(own_size, int):  # models built for one input size (ViT's positions, Swin's windows)
        settings["image_size"] = size
    elif pair:  # the suite's images are square
        settings["image_size"] = type(own_size)((size, size))
    window, patch, depths = (getattr(default, n, None) for n in ("window_size", "patch_size", "depths"))
    if preset != "full" and all(isinstance(v, int) for v in (window, patch)) and depths:
        # Attention windows no larger than the last stage's feature map: the library cannot shrink a
        # window's position biases to a smaller map.
        settings["window_size"] = max(1, min(window, size // patch // 2 ** (len(depths) - 1)))
    return HFImageConfig(model_type, size, CLASSES[preset], settings)


def hf_model(config: HFConfig | HFImageConfig) -> nn.Module:
    """The transformers model of a preset, as the library builds it (random weights)."""
    import transformers

    try:
        model_config = transformers.AutoConfig.for_model(config.model_type, **config.settings)
    except Exception as error:  # a setting the library refuses: one line naming it, not its traceback
        raise UsageError(f"hf:{config.model_type}: transformers refuses its settings ({error})") from None
    if getattr(model_config, "use_cache", None):
        # A training step needs no key/value cache, and a cache filled again when a recomputed block
        # reruns its forward would no longer match the one the forward saw (memsave).
        model_config.use_cache = False
    if model_config.architectures is None:
        # A type with several classes for one head (DeiT's with and without teacher) picks the first
        # when the configuration names none; the library reads the names as a list.
        model_config.architectures = []
    auto = {
        CAUSAL: transformers.AutoModelForCausalLM,
        MASKED: transformers.AutoModelForMaskedLM,
        SEQ2SEQ: transformers.AutoModelForSeq2SeqLM,
        IMAGE: transformers.AutoModelForImageClassification,
    }[config.head]
    try:
        model = auto.from_config(model_config)
    except Exception as error:
        raise UsageError(f"hf:{config.model_type}: transformers cannot build it ({error})") from None
    if config.head == CAUSAL and getattr(model, "loss_type", "") is None:
        # transformers names a model's loss by its class (``...ForCausalLM``) and gives a causal LM
        # named otherwise (GPT2LMHeadModel) the same loss with a warning on every run: named here.
        model.loss_type = "ForCausalLM"
    return model


def _causal_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(input_ids=batch["tokens"], labels=batch["tokens"]).loss


def _masked_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    tokens = batch["tokens"]
    scores = torch.rand(tokens.shape, device=tokens.device)
    # A share of the positions masked, and at least one per sequence (no empty loss).
    masked = (scores < MASKED_SHARE) | (scores == scores.min(dim=1, keepdim=True).values)
    inputs = torch.where(masked, torch.full_like(tokens, MASKED_TOKEN), tokens)
    labels = torch.where(masked, tokens, torch.full_like(tokens, -100))  # -100: ignored by the loss
    return model(input_ids=inputs, labels=labels).loss


def _seq2seq_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # The decoder's inputs given (BOS + target): a configuration built from defaults may name no
    # decoder start token for the model to shift the labels with.
    return model(input_ids=batch["src"], decoder_input_ids=batch["tgt_in"], labels=batch["tgt_out"]).loss


def _image_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    output = model(pixel_values=batch["image"], labels=batch["label"])
    if getattr(output, "loss", None) is not None:
        return output.loss
    # A classifier that returns its logits and no loss (PP-LCNet's, as ``last_hidden_state``): the
    # cross-entropy its labels would have given.
    logits = output["logits"] if "logits" in output else output[0]
    if logits.dim() != 2 or logits.shape[0] != batch["label"].shape[0]:
        raise UsageError(f"{type(model).__name__} returns no loss and no (batch, classes) logits")
    return nn.functional.cross_entropy(logits, batch["label"])


def _hf_task(config: HFConfig | HFImageConfig, device: torch.device) -> Task:
    model = _training_on(hf_model(config), device)
    if config.head == IMAGE:  # the suite's image-classification recipe (workloads.classification)
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9, weight_decay=1e-4)
        return SupervisedTask(model, _image_loss, optimizer)
    if config.head == SEQ2SEQ:  # the suite's translation recipe (workloads.translation)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
        return SupervisedTask(model, _seq2seq_loss, optimizer)
    # The suite's language-modelling recipe (workloads.language).
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    return SupervisedTask(model, _causal_loss if config.head == CAUSAL else _masked_loss, optimizer)


def _hf_data(config: HFConfig | HFImageConfig) -> DataFormat:
    if isinstance(config, HFImageConfig):
        return ImageFormat(image_size=config.image_size, num_classes=config.num_classes)
    if config.head == SEQ2SEQ:
        return TranslationFormat(vocab_size=config.vocab_size, src_len=config.seq_len, tgt_len=config.seq_len)
    return LanguageModelFormat(vocab_size=config.vocab_size, seq_len=config.seq_len)


def _hf_workload(model_type: str) -> Workload:
    transformers = _library("transformers", f"hf:{model_type}")
    types = list(transformers.CONFIG_MAPPING.keys())
    if model_type not in types:
        raise _suggest("transformers model type", model_type, "hf:", types)
    try:
        presets = _hf_presets(transformers, model_type)
    except UsageError:
        raise
    except Exception as error:  # the library's own refusal, in one line
        raise UsageError(f"hf:{model_type} cannot be configured: {error}") from None
    head = presets["full"].head
    if head == IMAGE:
        domain, kind, unit = "image classification", "image classifier", "image"
        batch_sizes = IMAGE_BATCH_SIZES
        notes = (
            "full: the configuration's defaults, 1000 classes at its image size; small: 100 classes at "
            "half the size, half the blocks a stage (a plain transformer: 4 layers, width 256); tiny: 10 "
            "classes at a quarter, one block a stage (2 layers, width 64); EfficientNet: B0 below full"
        )
    else:
        translation = head == SEQ2SEQ
        domain = "machine translation" if translation else "language modelling"
        kind, unit = f"{head} LM", "sentence pair" if translation else "sequence"
        batch_sizes = {"tiny": 8, "small": 16, "full": 8}
        notes = (
            "full: the configuration's defaults; small: 4 layers, width 256, 4 heads, vocabulary 4096, "
            "128 tokens; tiny: 2 layers, width 64, 4 heads, vocabulary 256, 16 tokens"
        )
    return Workload(
        name=f"hf:{model_type}",
        domain=domain,
        summary=f"transformers' {model_type} ({kind}, configuration defaults, random weights)",
        presets=presets,
        default_batch_size=batch_sizes,
        make_task=_hf_task,
        make_data=_hf_data,
        sample_unit=unit,
        notes=(notes,),
    )


register_third_party(third_party_workload)
