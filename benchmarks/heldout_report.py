"""The held-out CPU figures of docs/validation-heldout.md, the two pages of each set's rows
(``SETS_PAGES``) and validation-heldout-phases.md, from the JSON files of heldout_validation.py's sets.

    python benchmarks/heldout_report.py DIR

reads ``DIR/<set>.json`` for each set of ``SETS`` that is there (``first`` is the run without a set
flag, the others are named by their flag: ``fresh``, ..., ``shapes-again``) and rewrites the parts of
the pages between ``<!-- heldout_report:NAME -->`` and ``<!-- /heldout_report -->``: the run's
machine and times, the summary table, each set's rows and the phases table. The prose around them is
the pages' own.

    python benchmarks/heldout_report.py DIR --host-page validation-heldout-second-host.md

writes another host's sets instead into that one page, between the same markers (``run``,
``summary``, ``sets`` and ``phases``); with ``--host-sets-page PAGE`` each set's rows (``sets``) go
to PAGE, and with ``--host-sets-page PAGE2:SET`` as well those from set SET on to PAGE2.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dnnperf.jsonio import write_text_atomic
from dnnperf.perfmodel.validate import (
    COPIES_AND_GAPS,
    COPIES_CALIBRATED,
    DATA_MOVEMENT_REPLAYED,
    DTYPES_AND_FAULTS_APART,
    ELEMENTWISE_FROM_MEMORY,
    FAULTS_APART,
    LARGE_COPIES_FROM_MEMORY,
    OTHER_DTYPES_REPLAYED,
    REPLAYED_AND_FROM_MEMORY,
    UNTIMED_REPLAYED,
    UPDATE_BACK_TO_BACK,
    UPDATE_CALLS_AND_BYTES,
)
from dnnperf.probes.opcount import PHASES

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: (file name, heading, what the set is), in the pages' order.
SETS = (
    ("first", "first set", "16 models (`MODELS`)."),
    ("fresh", "second set", "Eight models (`FRESH_MODELS`, `--fresh`)."),
    ("third", "third set", "Six models (`THIRD_MODELS`, `--third`) with convolutions among attention."),
    (
        "fourth",
        "fourth set",
        "Eight models (`FOURTH_MODELS`, `--fourth`), fixed before any of them was run by this script "
        "(to judge the interpolation between few-rows classes and kinds).",
    ),
    (
        "fifth",
        "fifth set",
        "Eight models (`FIFTH_MODELS`, `--fifth`), fixed before any of them was run by this script, to "
        "judge the replays between descriptions.",
    ),
    (
        "sixth",
        "sixth set",
        "Eight models (`SIXTH_MODELS`, `--sixth`), fixed before any of them was run by this script, to "
        "judge the replays of matrix products.",
    ),
    (
        "seventh",
        "seventh set",
        "Eight models (`SEVENTH_MODELS`, `--seventh`), fixed (each model's build checked) before any of "
        "them was predicted: three encoders, three decoders and two encoder-decoders.",
    ),
    (
        "eighth",
        "eighth set",
        "Eight models (`EIGHTH_MODELS`, `--eighth`), fixed (each model's build checked) before any of "
        "them was predicted, to judge the host costs by phase and the update's share of its bytes: "
        "four decoders, two encoders and two encoder-decoders.",
    ),
    (
        "ninth",
        "ninth set",
        "Eight models (`NINTH_MODELS`, `--ninth`), fixed (each model's build checked) before any of "
        "them was predicted, to judge the per-element pricing of transcendental functions: four "
        "decoders, two encoders and two encoder-decoders.",
    ),
    (
        "tenth",
        "tenth set",
        "Eight models (`TENTH_MODELS`, `--tenth`), fixed (each model's build checked) before any of "
        "them was predicted, to judge the cost of matrix products' operands out of cache: three vision "
        "transformers, three decoders, an encoder and an encoder-decoder.",
    ),
    (
        "eleventh",
        "eleventh set",
        "Eight models (`ELEVENTH_MODELS`, `--eleventh`), fixed (each model's build checked) before any "
        "of them was predicted, to judge the cold products' calibration by pairs of calls: four "
        "decoders, two encoders and two encoder-decoders (no image classifier of transformers 5.24 "
        "was left that dnnperf builds).",
    ),
    (
        "twelfth",
        "twelfth set",
        "Eight models (`TWELFTH_MODELS`, `--twelfth`), fixed (each model's build checked) before any "
        "of them was predicted, to judge the charge for the host's seconds between operator calls: "
        "three decoders, two encoders and three encoder-decoders.",
    ),
    (
        "thirteenth",
        "thirteenth set",
        "Eight models (`THIRTEENTH_MODELS`, `--thirteenth`), fixed (each model's build checked) before "
        "any of them was predicted, to judge the charge for the part of the host's seconds between "
        "operator calls that does not grow with the batch: five decoders, two encoders and an "
        "encoder-decoder.",
    ),
    (
        "fourteenth",
        "fourteenth set",
        "Nine models (`FOURTEENTH_MODELS`, `--fourteenth`), fixed (each model's build checked) before "
        "any of them was predicted, no rule of the model chosen on it: networks a user brings as their "
        "own `nn.Module`, built in code from diffusers (two denoising U-Nets, a diffusion transformer, "
        "two autoencoders) and x-transformers (a decoder, a vision transformer, an encoder-decoder) by "
        "`benchmarks/own_models.py`, and transformers' data2vec-text encoder.",
    ),
    (
        "fifteenth",
        "fifteenth set",
        "Eight models (`FIFTEENTH_MODELS`, `--fifteenth`), fixed (each model's build checked) before any "
        "of them was predicted, to judge the replays of the CPU's fused attention kernel: networks built "
        "in code from diffusers (two diffusion transformers, an autoencoder, a 1-D U-Net), torchtune "
        "(two decoders), fair-esm (a protein encoder) and x-transformers (a series encoder) by "
        "`benchmarks/own_models.py`.",
    ),
    (
        "sixteenth",
        "sixteenth set",
        "Eight models (`SIXTEENTH_MODELS`, `--sixteenth`), fixed (each model's build checked) before any "
        "of them was predicted, to judge the replays of the CPU's fused attention kernel again: every one "
        "runs it, four at 4-16 dimensions a head. Built in code from diffusers (a ControlNet beside a "
        "frozen U-Net, an image-embedding prior), torchtune (a decoder) and x-transformers (an encoder) "
        "by `benchmarks/own_models.py`, and transformers' gemma3_text, glm4, cohere2 and mixtral.",
    ),
    (
        "seventeenth",
        "seventeenth set",
        "Eight models (`SEVENTEENTH_MODELS`, `--seventeenth`), fixed (each model's build checked) before "
        "any of them was predicted, to judge the replays of the CPU's fused attention kernel by the rows "
        "that run it: every one does, three at 8-16 dimensions a head. Built in code from diffusers (two "
        "diffusion transformers) and x-transformers (a decoder) by `benchmarks/own_models.py`, and "
        "transformers' apertus, lfm2 and three mixtures of experts (phimoe, granitemoe, flex_olmo).",
    ),
    (
        "eighteenth",
        "eighteenth set",
        "Eight models (`EIGHTEENTH_MODELS`, `--eighteenth`), fixed (each model's build checked) before "
        "any of them was predicted, to judge the price of matrix products of few rows: networks written "
        "in torch.nn as a user writes their own (`benchmarks/own_models.py`): an MLP classifier, a wide "
        "and deep model, an actor-critic, latents cross-attending to patches, convolutions then an MLP, "
        "an MLP-Mixer over 16 patches, a causal transformer and a dense autoencoder.",
    ),
    (
        "eighteenth-again",
        "eighteenth set again",
        "The eighteenth set's eight models run a second time, on the host alone (`--eighteenth`).",
    ),
    (
        "nineteenth",
        "nineteenth set",
        "Eight models (`NINETEENTH_MODELS`, `--nineteenth`), fixed (each model's build checked) before "
        "any of them was predicted, to judge the price of matrix products of few rows again, by the "
        "eighteenth's rule: networks written in torch.nn (`benchmarks/own_models.py`): a regression MLP, "
        "a Siamese MLP, a variational autoencoder, a GRU cell and an LSTM cell stepped by hand, a "
        "DeepSets model, 1-D convolutions then an MLP, and a transformer classifier.",
    ),
    (
        "twentieth",
        "twentieth set",
        "Eight models (`TWENTIETH_MODELS`, `--twentieth`), fixed (each model's build checked) before "
        "any of them was predicted, to judge the price of the kernels a compiled function issues after "
        "its first, by the eighteenth's rule: networks written in torch.nn (`benchmarks/own_models.py`): "
        "a GRU, an RNN, an LSTM and a bidirectional GRU over an image's rows, a GRU language model, "
        "convolutions then a GRU, an RNN cell stepped by hand and an MLP trained with a triplet loss.",
    ),
    (
        "twentieth-again",
        "twentieth set again",
        "The twentieth set's eight models run a second time (`--twentieth`), with the corrected calibration "
        "of calls inside compiled functions (`4eee26d`) and the price on.",
    ),
    (
        "nineteenth-again",
        "nineteenth set again",
        "The nineteenth set's eight models run a second time (`--nineteenth`), as the twentieth again.",
    ),
    (
        "twenty-first",
        "twenty-first set",
        "Eight models (`TWENTY_FIRST_MODELS`, `--twenty-first`), fixed (each model's build checked) "
        "before any of them was predicted, to judge normalization and pooling priced per element, by "
        "the eighteenth's rule: networks written in torch.nn (`benchmarks/own_models.py`): VGG-style "
        "stages with batch norm, a DenseNet, a residual network with group norm, an encoder-decoder "
        "with instance norm, 1-D convolutions with batch norm, an MLP-Mixer, a network with a pyramid "
        "of average pools and a tabular MLP with batch norm.",
    ),
    (
        "twenty-second",
        "twenty-second set",
        "Eight models (`TWENTY_SECOND_MODELS`, `--twenty-second`), fixed (each model's build checked) "
        "before any of them was predicted, to judge normalization and pooling priced per element at "
        "their rate beyond the L2, by the eighteenth's rule: networks written in torch.nn "
        "(`benchmarks/own_models.py`): "
        "inception blocks, a U-Net with group norm, ConvNeXt-like blocks, a wide residual network, a "
        "DCGAN discriminator, SqueezeNet-like fire modules, a residual MLP with layer norms and 3-D "
        "convolutions with 3-D batch norm.",
    ),
    (
        "twenty-third",
        "twenty-third set",
        "Eight models (`TWENTY_THIRD_MODELS`, `--twenty-third`), fixed (each model's build checked) "
        "before any of them was predicted, to judge the zoo's normalization and pooling operators priced "
        "per element at their rate beyond the L2, by the eighteenth's rule: networks written in torch.nn "
        "(`benchmarks/own_models.py`): AlexNet-like convolutions with local response norms, a residual "
        "MLP with RMS norms, a residual network of basic blocks, 1-D convolutions with average pools, "
        "convolutions with group norm, a post-norm transformer encoder, depthwise separable "
        "convolutions and 3-D convolutions with average pools.",
    ),
    (
        "twenty-third-again",
        "twenty-third set again",
        "The twenty-third set's eight models run a second time (`--twenty-third`), to judge the update "
        "calibrated right after a backward, by the eighteenth's rule.",
    ),
    (
        "first-again",
        "first set again",
        "The first set's 16 models run a second time, the model unchanged since (same flags as the first).",
    ),
    (
        "twenty-fourth",
        "twenty-fourth set",
        "Eight models (`TWENTY_FOURTH_MODELS`, `--twenty-fourth`), fixed (each one's subnormal outputs "
        "counted by a description) before any of them was predicted, to judge each phase priced at its "
        "slowdown from subnormal floats, by the eighteenth's rule: networks written in torch.nn "
        "(`benchmarks/own_models.py`): a transformer encoder with attention logits scaled by 50, a "
        "residual MLP gated by sigmoids of slope 200, 41 tanh layers whose signal fades, narrow radial "
        "basis units, running products of decays (cumprod), a mixture of experts routed at a "
        "temperature of 1/100, a gated recurrence stepped by hand, and EfficientNet-like inverted "
        "residuals that make no subnormals.",
    ),
    (
        "twenty-fifth",
        "twenty-fifth set",
        "Eight models (`TWENTY_FIFTH_MODELS`, `--twenty-fifth`), fixed (each one's subnormal outputs "
        "counted by a description) before any of them was predicted, to judge the same pricing phase by "
        "phase: networks written in torch.nn (`benchmarks/own_models.py`): 49 sigmoid layers, "
        "stick-breaking attention, a mixture of experts mixed by a Gumbel-softmax at 0.02, a Gaussian "
        "kernel attention, a leaky integrator stepped by hand, a discrete-time survival model, a CNN "
        "distilled at a temperature of 0.005 (few subnormals) and a plain pre-norm encoder (none).",
    ),
    (
        "twenty-sixth",
        "twenty-sixth set",
        "Seven models (`TWENTY_SIXTH_MODELS`, `--twenty-sixth`), fixed (each one's subnormal outputs "
        "counted by a description) before any of them was predicted, to judge the pricing with only the "
        "phases flushing made faster in every pair, by the twenty-fifth's rule: networks written in "
        "torch.nn (`benchmarks/own_models.py`): InfoNCE at a logit scale of 100, 61 ReLU layers from "
        "small weights, a causal decoder with ALiBi of slope 2, a GRU language model with its softmax at "
        "0.01, and three that make few or no subnormals: Sinkhorn attention, a mixture density network "
        "and a GRU over rows.",
    ),
    (
        "twenty-seventh",
        "twenty-seventh set",
        "Eight models (`TWENTY_SEVENTH_MODELS`, `--twenty-seventh`), fixed (each one's subnormal outputs "
        "counted by a description) before any of them was predicted, to judge the pricing with only the "
        "phases whose own outputs are notably subnormal, by the twenty-fifth's rule with a floor of 6 "
        "pairs: networks written in torch.nn (`benchmarks/own_models.py`): noisy-OR over 128 patches, a "
        "retention decoder with decays of 0.1 to 0.8, log-sum-exp pooling at 100, a spiking MLP with an "
        "exponential surrogate gradient, and four that make few or no subnormals: generalized-mean "
        "pooling of power 30, a multi-label tagger at a temperature of 0.001, layer scale from 1e-6 and "
        "a ConvMixer.",
    ),
    (
        "twenty-eighth",
        "twenty-eighth set",
        "Eight models (`TWENTY_EIGHTH_MODELS`, `--twenty-eighth`), fixed (each built and stepped once) "
        "before any of them was predicted, to judge charging the model's host seconds between its "
        'operator calls (variant "host gaps"): hf:ernie4_5 and hf:mamba (transformers, `small`, batch '
        "2 and 3) and six networks written in torch.nn (`benchmarks/own_models.py`): a ResNet of "
        "bottlenecks, a MobileNetV3-like network, a ViT of nn.TransformerEncoder, a GPT of "
        "nn.MultiheadAttention, a bidirectional LSTM tagger and a feature pyramid.",
    ),
    (
        "twenty-ninth",
        "twenty-ninth set",
        "Seven models (`TWENTY_NINTH_MODELS`, `--twenty-ninth`), fixed (each built and stepped a few "
        "times to choose its batches) before any of them was predicted, to judge each optimizer step's "
        'fixed cost (variant "update with a fixed cost a step") and, again, the model\'s host seconds '
        'between its operator calls (variant "host gaps"): hf:olmo3 and hf:exaone (transformers, '
        "`small`, batch 2 and 3) and five networks written in torch.nn (`benchmarks/own_models.py`): a "
        "temporal convolutional network, PointNet, a DLRM-like ranker of EmbeddingBags, graph "
        "convolutions over a dense adjacency and a highway MLP.",
    ),
    (
        "thirtieth",
        "thirtieth set",
        "Eight models (`THIRTIETH_MODELS`, `--thirtieth`), fixed (each built and stepped twice to "
        "choose its batches) before any of them was predicted, to confirm each optimizer step's fixed "
        "cost and the model's host seconds between its calls, on together since the twenty-ninth set: "
        "hf:vaultgemma and hf:eurobert (transformers, `small`, batch 2 and 3) and six networks written "
        "in torch.nn (`benchmarks/own_models.py`): a gated convolutional LM, a Set Transformer, a "
        "NeRF-like coordinate MLP, atrous spatial pyramid pooling, ShuffleNet-like units and a "
        "FiLM-modulated CNN.",
    ),
    (
        "thirty-first",
        "thirty-first set",
        "Eight models (`THIRTY_FIRST_MODELS`, `--thirty-first`), fixed (each built and stepped twice to "
        "choose its batches) before any of them was predicted, to judge the elementwise family priced "
        'at the bandwidth from memory (variant "elementwise from memory"): hf:diffllama, hf:gte and '
        "hf:flaubert (transformers, `small`, batch 2 and 3) and five networks written in torch.nn "
        "(`benchmarks/own_models.py`): an RWKV-like LM of token shifts, a hypernetwork, a capsule "
        "network, a WaveNet and Swin-like shifted window attention by hand.",
    ),
    (
        "thirty-second",
        "thirty-second set",
        "Eight models (`THIRTY_SECOND_MODELS`, `--thirty-second`), fixed (each built and stepped twice "
        "to choose its batches) before any of them was predicted, to judge the memory family's "
        "efficiencies fitted on the zoo's copies too (variant \"memory operators calibrated on "
        'copies"): hf:doge and hf:seed_oss (transformers, `small`, batch 2 and 3) and six networks '
        "written in torch.nn (`benchmarks/own_models.py`): a 1-D U-Net, an ESPCN-like upscaler, a CNN of "
        "gated convolutions, Swin-like patch merging, a temporal channel shift and a densely connected "
        "MLP.",
    ),
    (
        "thirty-third",
        "thirty-third set",
        "Eight models (`THIRTY_THIRD_MODELS`, `--thirty-third`), fixed (each built and stepped twice to "
        "choose its batches) before any of them was predicted, to judge the memory family fitted on the "
        'zoo\'s copies and host gaps together (variant "copies calibrated and host gaps"): '
        "hf:roberta-prelayernorm, hf:granite_swa and hf:mra (transformers, `small`, batch 2 and 3) and "
        "five networks written in torch.nn (`benchmarks/own_models.py`): a CRNN, SIREN, involution "
        "layers, a spatial transformer and PixelCNN-like masked convolutions.",
    ),
    (
        "thirty-fourth",
        "thirty-fourth set",
        "Eight models (`THIRTY_FOURTH_MODELS`, `--thirty-fourth`), fixed (each built and stepped twice "
        "to choose its batches) before any of them was predicted, to judge data movement replayed "
        '(variant "data movement replayed") and, with it, the elementwise family from memory: '
        "hf:bitnet, hf:jetmoe and hf:minimax (transformers, `small`, batch 2 and 3) and five networks "
        "written in torch.nn (`benchmarks/own_models.py`): ResNeXt-like grouped convolutions, a causal "
        "linear-attention LM, a RealNVP-like coupling flow, a neural ODE stepped by Runge-Kutta and a "
        "Fourier neural operator.",
    ),
    (
        "thirty-fifth",
        "thirty-fifth set",
        "Eight models (`THIRTY_FIFTH_MODELS`, `--thirty-fifth`), fixed (each built and stepped twice "
        "to choose its batches) before any of them was predicted, to judge the operators the layer zoo "
        'never timed replayed (variant "untimed operators replayed"): hf:rwkv, hf:recurrent_gemma and '
        "hf:xlm-roberta-xl (transformers, `small`, batch 2 and 3) and five networks written in "
        "torch.nn (`benchmarks/own_models.py`): a message-passing graph network, a product-key memory, "
        "an S4D-like state space LM, a decoder with rotary embeddings by hand and an autoencoder that "
        "upsamples bilinearly and by transposed convolutions.",
    ),
    (
        "thirty-sixth",
        "thirty-sixth set",
        "Eight models (`THIRTY_SIXTH_MODELS`, `--thirty-sixth`), fixed (each built and stepped twice "
        "to choose its batches) before any of them was predicted, to confirm the untimed operators "
        "replayed and to judge the zoo's operators in another dtype replayed (variant \"untimed "
        'operators and dtypes replayed") and the zoo\'s timings net of their page faults (variant "zoo '
        'net of its page faults"): hf:luke, hf:nanochat, hf:cwm and hf:jais2 (transformers, `small`, '
        "batch 2 and 3) and four networks written in torch.nn (`benchmarks/own_models.py`): a "
        "complex-valued CNN, a float64 MLP, a Perceiver-like latent cross-attention classifier and a "
        "Conformer encoder.",
    ),
    (
        "thirty-sixth-again",
        "thirty-sixth set again",
        "The thirty-sixth set's eight models run a second time (`--thirty-sixth`), the model as that set "
        "left it, from a `dnnperf hw` profile made just before (`--profile`) rather than the host's "
        "first: how much of the set's error the host's drift from its profile made.",
    ),
    (
        "first-subnormals",
        "first set, subnormals priced",
        "The first set's 16 models (same flags as the first) with each phase whose own outputs are "
        "notably subnormal priced at its slowdown, the model's default from the twenty-seventh set to the "
        "twenty-eighth.",
    ),
    (
        "shapes",
        "shapes set",
        "The 15 convolutional models of the first three sets at batches 6 and 12 (`--shapes`).",
    ),
    ("shapes-again", "shapes set again", "The same 15 models at batches 5 and 10 (`--shapes-again`)."),
    (
        "thirty-seventh",
        "thirty-seventh set",
        "Eight models (`THIRTY_SEVENTH_MODELS`, `--thirty-seventh`), fixed (each built and stepped to "
        "choose its batches) before any of them was predicted, and run from a `dnnperf hw` profile made "
        "just before, to judge the memory family's calls beyond the L2 priced from memory at the zoo's "
        'large copies\' efficiency (variant "large copies from memory"): hf:nomic_bert, '
        "hf:internlm3, hf:minicpm3 and hf:ministral3 (transformers, `small`, batch 2 and 3) and four "
        "networks written in torch.nn (`benchmarks/own_models.py`): a "
        "Transformer-XL-like LM with segment memory, slot attention over CNN features, an hourglass LM "
        "and DETR-like object queries.",
    ),
    (
        "thirty-eighth",
        "thirty-eighth set",
        "Eight models (`THIRTY_EIGHTH_MODELS`, `--thirty-eighth`), fixed (each built and stepped to "
        "choose its batches) before any of them was predicted, and run from a `dnnperf hw` profile made "
        "just before: the model as it is, judging no pricing, its memory walk charging the gradients a "
        "tensor read in several segments accumulates and a repeated module's partial gradients: "
        "hf:iquestcoder, hf:olmo_hybrid, hf:lfm3 and hf:modernbert-decoder (transformers, `small`, "
        "batch 2 and 3) and four networks written in torch.nn (`benchmarks/own_models.py`): a gMLP, an "
        "ALBERT-like LM whose one layer runs six times, a neural cellular automaton and a Performer-like "
        "LM (batch 2 and 4).",
    ),
    (
        "thirty-ninth",
        "thirty-ninth set",
        "Eight models (`THIRTY_NINTH_MODELS`, `--thirty-ninth`), fixed (each built and stepped to "
        "choose its batches) before any of them was predicted, and run from a `dnnperf hw` profile made "
        "just before: the model as it is, judging no pricing: hf:apertus1p5_text, hf:aria_text, "
        "hf:bert-generation and hf:cohere2_moe (transformers, `small`, batch 2 and 3) and four networks "
        "written in torch.nn (`benchmarks/own_models.py`): a Bahdanau-style decoder (a GRUCell stepped "
        "by hand with additive attention), a Nystromformer-like encoder, a deep-equilibrium MLP and an "
        "Attention U-Net.",
    ),
    (
        "fortieth",
        "fortieth set",
        "Eight models (`FORTIETH_MODELS`, `--fortieth`), fixed (each built and stepped to choose its "
        "batches) before any of them was predicted, and run from a `dnnperf hw` profile made just "
        "before, to judge the host's seconds between a phase's calls charged at their part that does "
        'not grow with the batch (variant "host gaps, fixed part"): hf:dory, hf:esmc, hf:gpt-sw3 and '
        "hf:gpt_neox_japanese (transformers, `small`, batch 2 and 3) and four networks written in "
        "torch.nn (`benchmarks/own_models.py`): an XCiT-like classifier, a GhostNet-like classifier, a "
        "PoolFormer-like classifier and a speech-recognizer-like tagger trained with CTC.",
    ),
    (
        "forty-first",
        "forty-first set",
        "Eight models (`FORTY_FIRST_MODELS`, `--forty-first`), fixed (each built and stepped to choose "
        "its batches) before any of them was predicted, and run from a `dnnperf hw` profile made just "
        "before, to confirm the host gaps' fixed part, the model's since the fortieth set: "
        "hf:granitemoe_swa, hf:granitemoeshared, hf:hrm_text and hf:hyperclovax (transformers, `small`, "
        "batch 2 and 3) and four networks written in torch.nn (`benchmarks/own_models.py`): a "
        "MobileViT-like classifier, a DPN-like classifier, a hierarchical attention network and an "
        "axial-attention classifier.",
    ),
)
#: The pages of each set's rows (a page of every set would be too long to read): each page and the
#: first of its sets, in ``SETS``' order; a page holds its sets up to the next page's first.
SETS_PAGES = (("validation-heldout-sets.md", "first"), ("validation-heldout-sets-2.md", "eighth"))
#: The variants the tables show beside the model (heldout_validation.VARIANTS has them all).
SHOWN = ("no replays", "products in cache", "one call cost, update as counted")
#: The issue's targets: median and max of |error|, median signed error, memory error.
MEDIAN, MAX, BIAS, MEMORY = 0.10, 0.25, 0.05, 0.10


def sets_by_page() -> dict[str, list[str]]:
    """Each page of sets' rows (``SETS_PAGES``) and the keys of the sets it holds."""
    keys = [key for key, _, _ in SETS]
    starts = [keys.index(first) for _, first in SETS_PAGES] + [len(keys)]
    return {
        name: keys[begin:end] for (name, _), begin, end in zip(SETS_PAGES, starts, starts[1:], strict=False)
    }


def errors(values: list[float]) -> tuple[float, float, float]:
    """(median |error|, max |error|, median signed error)."""
    return (
        statistics.median(abs(v) for v in values),
        max(abs(v) for v in values),
        statistics.median(values),
    )


def triple(values: list[float]) -> str:
    return ", ".join(f"{v:+.1%}" if i == 2 else f"{v:.1%}" for i, v in enumerate(errors(values)))


def bold(text: str, met: bool) -> str:
    return f"**{text}**" if met else text


def summary_row(title: str, document: dict[str, Any]) -> str:
    rows = document["rows"]
    median, largest, signed = errors([r["step_error"] for r in rows])
    models = len({r["workload"] for r in rows})
    memory = [abs(r["memory_error"]) for r in rows if r.get("memory_error") is not None]
    within = sum(m <= MEMORY for m in memory)
    cells = [
        f"{title} ({models} model{'s' if models > 1 else ''})",
        str(len(rows)),
        bold(f"{median:.1%}", median <= MEDIAN),
        bold(f"{largest:.1%}", largest <= MAX),
        bold(f"{signed:+.1%}", abs(signed) <= BIAS),
        *[triple([r["variant_errors"][v] for r in rows]) for v in SHOWN],
        f"{within} of {len(memory)}",
    ]
    return "| " + " | ".join(cells) + " |"


def summary(documents: dict[str, dict[str, Any]]) -> str:
    head = ["set", "rows", "median abs error", "max abs error", "median signed error", *SHOWN]
    lines = [
        "| " + " | ".join([*head, "memory within 10%"]) + " |",
        "|---|---:|---:|---:|---:|" + "---|" * (len(SHOWN) + 1),
    ]
    lines += [summary_row(title, documents[key]) for key, title, _ in SETS if key in documents]
    return "\n".join(lines)


def host_speed(document: dict[str, Any]) -> str:
    speed = document["host_speed"]
    start, end = speed["start"], speed["end"]
    return (
        f"product {start['matmul_flops'] / 1e9:.1f} / {end['matmul_flops'] / 1e9:.1f} GFLOP/s, "
        f"copy {start['copy_bytes_per_s'] / 1e9:.1f} / {end['copy_bytes_per_s'] / 1e9:.1f} GB/s"
    )


def set_section(title: str, what: str, document: dict[str, Any]) -> str:
    finished = document["finished"].split(" ")[1]
    lines = [
        f"### The {title}",
        "",
        f"{what} Finished {finished} UTC; host speed before / after: {host_speed(document)}:",
        "",
        "| model | preset | batch | measured ms | predicted ms (spread) | error | "
        + " | ".join(SHOWN)
        + " | measured MiB | predicted MiB | memory error |",
        "|---|---|---:|---:|---:|---:|" + "---:|" * len(SHOWN) + "---:|---:|---:|",
    ]
    for r in document["rows"]:
        variants = " | ".join(f"{r['variant_errors'][v]:+.1%}" for v in SHOWN)
        memory = r.get("memory_error")
        lines.append(
            f"| {r['workload']} | {r['preset']} | {r['batch']} | {r['measured_s'] * 1e3:.1f} | "
            f"{r['predicted_s'] * 1e3:.1f} ({r['predicted_spread']:.1%}) | {r['step_error']:+.1%} | "
            f"{variants} | {r['measured_bytes'] / 2**20:.2f} | {r['predicted_bytes'] / 2**20:.2f} | "
            + (f"{memory:+.1%} |" if memory is not None else "- |")
        )
    rows = document["rows"]
    variants = "; ".join(f'"{v}" {triple([r["variant_errors"][v] for r in rows])}' for v in SHOWN)
    memory = [abs(r["memory_error"]) for r in rows if r.get("memory_error") is not None]
    lines += [
        "",
        f"Median, max, signed: the model {triple([r['step_error'] for r in rows])}; {variants}. "
        f"Memory: {sum(m <= MEMORY for m in memory)} of {len(memory)} within 10% (max {max(memory):.1%}).",
    ]
    return "\n".join(lines)


def phase_cells(rows: list[dict[str, Any]]) -> list[str]:
    """Per phase and for the products: the median error and, in parentheses, the median miss over the
    measured step."""
    parts: list[tuple[Callable[[dict], float], Callable[[dict], float]]] = [
        (lambda r, p=p: r["measured_phases_s"][p], lambda r, p=p: r["predicted_phases_s"][p]) for p in PHASES
    ]
    parts.append((lambda r: r["measured_products_s"], lambda r: r["predicted_products_s"]))
    cells = []
    for index, (measured, predicted) in enumerate(parts):
        # The products where the profiler timed them (a step under heldout_validation.PROFILED_STEP_S).
        kept = rows if index < len(PHASES) else [r for r in rows if "measured_products_s" in r]
        error = statistics.median(predicted(r) / measured(r) - 1 for r in kept if measured(r) > 0)
        miss = statistics.median((predicted(r) - measured(r)) / r["measured_s"] for r in kept)
        cells.append(f"{error:+.1%} ({miss:+.1%})")
    return cells


def phases(documents: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| set | rows | forward | backward | update | matrix products | products' share of the step "
        "| product calls as counted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, title, _ in SETS:
        if key not in documents:
            continue
        rows = documents[key]["rows"]
        profiled = [r for r in rows if "measured_products_s" in r]
        share = statistics.median(r["measured_products_s"] / r["measured_s"] for r in profiled)
        same = sum(r["measured_product_calls"] == r["counted_product_calls"] for r in profiled)
        cells = [title, str(len(rows)), *phase_cells(rows), f"{share:.0%}", f"{same} of {len(profiled)}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The variants of the CPU's fused attention kernel replayed and priced by its products' FLOPs
#: (heldout_validation.ATTENTION_REPLAYED, ATTENTION_AS_PRODUCTS): a set run before the model replayed
#: it has the first beside the model, a set run after the second.
REPLAYED, AS_PRODUCTS = "attention replayed", "attention as products"
#: A row whose |error| grows by more than this with the replays counts against them (the seventeenth
#: set's rule).
GROWN = 0.05


def judged_cells(pairs: list[tuple[float, float]]) -> list[str]:
    """The rows a variant is judged on, each (error without, error with): how many, their median
    |error| each way, and how many grew by more than ``GROWN`` with it."""
    if not pairs:
        return ["0", "-", "-"]
    before = statistics.median(abs(a) for a, _ in pairs)
    after = statistics.median(abs(b) for _, b in pairs)
    grown = sum(abs(b) - abs(a) > GROWN for a, b in pairs)
    return [str(len(pairs)), f"{before:.2%} / {after:.2%}", str(grown)]


def attention_errors(row: dict[str, Any]) -> tuple[float, float] | None:
    """A row's error with the fused attention kernel priced by its products' FLOPs and replayed; None
    where its set ran neither variant."""
    variants = row["variant_errors"]
    if AS_PRODUCTS in variants:
        return variants[AS_PRODUCTS], row["step_error"]
    if REPLAYED in variants:
        return row["step_error"], variants[REPLAYED]
    return None


def attention(documents: dict[str, dict[str, Any]]) -> str:
    """The fused attention kernel priced by its products' FLOPs against replayed, on each set that ran
    a variant of it: the set's median, max and signed error, and over the rows that run the kernel
    (where the set recorded them) the median |error| and the rows whose |error| grew by more than
    ``GROWN`` with the replays."""
    lines = [
        "| set | rows | attention as products | attention replayed | rows running the kernel | their median "
        "abs error, as products / replayed | rows grown over 5 points |",
        "|---|---:|---|---|---:|---|---:|",
    ]
    for key, title, _ in SETS:
        found = [attention_errors(r) for r in documents.get(key, {}).get("rows", [])]
        pairs = [p for p in found if p is not None]
        if not pairs or len(pairs) < len(found):
            continue
        rows = documents[key]["rows"]
        cells = [title, str(len(rows)), triple([p[0] for p in pairs]), triple([p[1] for p in pairs])]
        fused = [p for r, p in zip(rows, pairs, strict=True) if r.get("fused_attention_calls", 0) > 0]
        recorded = "fused_attention_calls" in rows[0]
        cells += judged_cells(fused) if recorded else ["not recorded", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The model with and without the price of products of few rows (heldout_validation.FEW_ROWS_AT_RATE,
#: ANY_ROWS): a set run while the model priced them has the second beside the model, a later set the
#: first.
AT_RATE, ANY_ROWS = "products of few rows at their rate", "products of any rows"
#: A row whose prediction the price moves by more than this is one it changes (the eighteenth set's rule).
CHANGED = 0.02


#: The model with and without the price of a compiled function's later kernels
#: (heldout_validation.COMPILED_AT_COST, EVERY_CALL_OUTER), as AT_RATE and ANY_ROWS.
AT_COST, EVERY_CALL = "compiled calls' later kernels at their cost", "every forward call at its phase's cost"


#: The model with normalization and pooling priced through the cache's curve and per element
#: (heldout_validation.NORMS_IN_CACHE, NORMS_PER_ELEMENT).
NORMS_PER_ELEMENT = "normalization and pooling per element"
NORMS_IN_CACHE = "normalization and pooling in cache"
#: And per element at the rate of the zoo's calls beyond the L2 (heldout_validation.NORMS_OUT_OF_CACHE).
NORMS_OUT_OF_CACHE = "normalization and pooling out of cache"
#: And only the operators the zoo timed (heldout_validation.ZOO_NORMS_OUT_OF_CACHE).
ZOO_NORMS_OUT_OF_CACHE = "the zoo's normalization and pooling out of cache"


def option_errors(
    row: dict[str, Any], off: str, on: str, stand_in: bool = True
) -> tuple[float, float] | None:
    """A row's error without an option of the model (variant ``off``) and with it (``on``); None
    where its set ran neither variant (where it ran one, the model itself is the other, unless not
    ``stand_in``: then None unless it ran both)."""
    variants = row["variant_errors"]
    if (off in variants and on in variants) or (stand_in and (off in variants or on in variants)):
        return variants.get(off, row["step_error"]), variants.get(on, row["step_error"])
    return None


def option_table(
    documents: dict[str, dict[str, Any]],
    off: str,
    on: str,
    short: tuple[str, str],
    stand_in: bool = True,
    since: str | None = None,
) -> str:
    """An option of the model, off (variant ``off``) against on (``on``), on each set that ran a
    variant of it (from set ``since`` on, in ``SETS``' order, where given): the set's median, max and
    signed error each way, and over the rows whose prediction it moves by more than ``CHANGED`` their
    median |error| each way (``short`` names the two) and those whose |error| grew by more than
    ``GROWN`` with it."""
    lines = [
        f"| set | rows | {off} | {on} | rows it changes | "
        f"their median abs error, {short[0]} / {short[1]} | rows grown over 5 points |",
        "|---|---:|---|---|---:|---|---:|",
    ]
    first = [key for key, _, _ in SETS].index(since) if since else 0
    for key, title, _ in SETS[first:]:
        found = [option_errors(r, off, on, stand_in) for r in documents.get(key, {}).get("rows", [])]
        pairs = [p for p in found if p is not None]
        if not pairs or len(pairs) < len(found):
            continue
        # Both errors are against the same measured step: their ratio is the predictions'.
        changed = [(a, b) for a, b in pairs if abs((1 + b) / (1 + a) - 1) > CHANGED]
        cells = [title, str(len(pairs)), triple([a for a, _ in pairs]), triple([b for _, b in pairs])]
        lines.append("| " + " | ".join([*cells, *judged_cells(changed)]) + " |")
    return "\n".join(lines)


def few_rows(documents: dict[str, dict[str, Any]]) -> str:
    """Products of few rows priced at their rows' rate against at their FLOPs' (option_table)."""
    return option_table(documents, ANY_ROWS, AT_RATE, ("any rows", "few rows"))


def compiled_calls(documents: dict[str, dict[str, Any]]) -> str:
    """A compiled function's later kernels at their own cost against the forward's (option_table)."""
    return option_table(documents, EVERY_CALL, AT_COST, ("every call", "later kernels"))


def norms(documents: dict[str, dict[str, Any]]) -> str:
    """Normalization and pooling per element against through the cache's curve (option_table)."""
    return option_table(
        documents, NORMS_IN_CACHE, NORMS_PER_ELEMENT, ("in cache", "per element"), stand_in=False
    )


def norms_out_of_cache(documents: dict[str, dict[str, Any]]) -> str:
    """Normalization and pooling per element at the rate beyond the L2 against in cache (option_table)."""
    return option_table(
        documents, NORMS_IN_CACHE, NORMS_OUT_OF_CACHE, ("in cache", "out of cache"), stand_in=False
    )


def zoo_norms_out_of_cache(documents: dict[str, dict[str, Any]]) -> str:
    """The zoo's normalization and pooling per element beyond the L2 against in cache (option_table)."""
    return option_table(
        documents, NORMS_IN_CACHE, ZOO_NORMS_OUT_OF_CACHE, ("in cache", "zoo's out of cache"), stand_in=False
    )


#: The model with its update calibrated back to back and right after a backward (the model's since the
#: twenty-third set again, whose runs have it as a variant; heldout_validation.UPDATE_BACK_TO_BACK).
UPDATE_AFTER_BACKWARD = "update calibrated after a backward"


def update_after_backward(documents: dict[str, dict[str, Any]]) -> str:
    """The update calibrated right after a backward against back to back (option_table)."""
    return option_table(
        documents, UPDATE_BACK_TO_BACK, UPDATE_AFTER_BACKWARD, ("back to back", "after a backward")
    )


#: Each phase at its slowdown from subnormal floats, or unpriced (ComputeOptions.subnormals; the
#: runs since the twenty-fourth set have both as variants).
SUBNORMALS_UNPRICED = "subnormals unpriced"
SUBNORMALS_PRICED = "subnormals at their slowdown"


def subnormals(documents: dict[str, dict[str, Any]]) -> str:
    """Each phase at its slowdown from subnormal floats against unpriced (option_table)."""
    return option_table(
        documents, SUBNORMALS_UNPRICED, SUBNORMALS_PRICED, ("unpriced", "at their slowdown"), stand_in=False
    )


#: Variants of the model named in the sets' JSON, judged from the twenty-eighth set on: each optimizer
#: step at a fixed cost (the model's since the twenty-ninth set, whose run has it as a variant)
#: against the update by its calls and bytes alone (a variant of the later runs); the model's host
#: seconds between its calls charged (the thirtieth run's model) against not (a variant of that
#: run, the model elsewhere); the thirtieth run's model (both) against neither; the elementwise
#: family from memory, the memory family fitted on the zoo's copies, and that with host gaps, each
#: against the model (its name never in the JSON: the model stands in).
UPDATE_STEP_COST = "update with a fixed cost a step"
HOST_GAPS = "host gaps"
#: The gaps charged at their part that does not grow with the batch (heldout_validation.FIXED_GAPS).
FIXED_GAPS = "host gaps, fixed part"
NO_HOST_GAPS = "no host gaps"
NEITHER = "neither the update's fixed cost nor host gaps"

#: Each such table by its marker: option_table's off and on variants, the short names of the two, and
#: the first set it shows (None: every set that ran a variant of it).
LATER_OPTIONS: dict[str, tuple[str, str, tuple[str, str], str | None]] = {
    "update-step": (UPDATE_CALLS_AND_BYTES, UPDATE_STEP_COST, ("calls and bytes", "with a fixed cost"), None),
    "host-gaps": (NO_HOST_GAPS, HOST_GAPS, ("without", "with the gaps"), "twenty-eighth"),
    "update-step-and-gaps": (NEITHER, "the update's fixed cost and host gaps", ("neither", "both"), None),
    "fixed-gaps": (NO_HOST_GAPS, FIXED_GAPS, ("without", "the fixed part"), "twenty-eighth"),
    "elementwise": (
        "elementwise through the cache's curve",
        ELEMENTWISE_FROM_MEMORY,
        ("cache's curve", "from memory"),
        None,
    ),
    "copies": (
        "memory operators calibrated on a recurrent layer's",
        COPIES_CALIBRATED,
        ("a recurrent layer's", "copies too"),
        None,
    ),
    "copies-and-gaps": ("neither", COPIES_AND_GAPS, ("neither", "both"), None),
    "data-movement": (
        "data movement by its bytes",
        DATA_MOVEMENT_REPLAYED,
        ("by its bytes", "replayed"),
        None,
    ),
    "untimed": (
        "untimed operators by their family",
        UNTIMED_REPLAYED,
        ("by their family", "replayed"),
        None,
    ),
    "other-dtypes": (
        UNTIMED_REPLAYED,
        OTHER_DTYPES_REPLAYED,
        ("by operator", "and by dtype"),
        "thirty-sixth",
    ),
    "faults-apart": (
        "the zoo with its page faults",
        FAULTS_APART,
        ("with its faults", "net of them"),
        "thirty-sixth",
    ),
    "dtypes-and-faults-apart": ("neither", DTYPES_AND_FAULTS_APART, ("neither", "both"), "thirty-sixth"),
    "large-copies": (
        "large copies through the cache's curve",
        LARGE_COPIES_FROM_MEMORY,
        ("cache's curve", "from memory"),
        "thirty-seventh",
    ),
    "data-movement-and-elementwise": (
        DATA_MOVEMENT_REPLAYED,
        REPLAYED_AND_FROM_MEMORY,
        ("replayed", "and elementwise from memory"),
        None,
    ),
}


def phase_errors(row: dict[str, Any], off: str, on: str) -> list[tuple[float, float]]:
    """Each phase's error without an option of the model (variant ``off``) and with it (``on``), for a
    row whose run kept both variants' phases (``variants_phases_s``); none otherwise."""
    phases = row.get("variants_phases_s", {})
    if off not in phases or on not in phases:
        return []
    measured = row["measured_phases_s"]
    return [
        (phases[off][p] / measured[p] - 1, phases[on][p] / measured[p] - 1)
        for p in PHASES
        if measured.get(p, 0) > 0 and p in phases[off] and p in phases[on]
    ]


def option_phase_table(
    documents: dict[str, dict[str, Any]], off: str, on: str, short: tuple[str, str]
) -> str:
    """An option of the model judged by phase: on each set that kept both variants' phases, the
    (row, phase) pairs whose prediction it moves by more than ``CHANGED``, their median |error| each way
    (``short`` names the two) and those whose |error| grew by more than ``GROWN`` with it."""
    lines = [
        f"| set | phases | phases it changes | their median abs error, {short[0]} / {short[1]} | "
        "phases grown over 5 points |",
        "|---|---:|---:|---|---:|",
    ]
    for key, title, _ in SETS:
        pairs = [p for r in documents.get(key, {}).get("rows", []) for p in phase_errors(r, off, on)]
        if not pairs:
            continue
        changed = [(a, b) for a, b in pairs if abs((1 + b) / (1 + a) - 1) > CHANGED]
        lines.append("| " + " | ".join([title, str(len(pairs)), *judged_cells(changed)]) + " |")
    return "\n".join(lines)


def subnormal_phases(documents: dict[str, dict[str, Any]]) -> str:
    """Each phase at its slowdown from subnormal floats against unpriced, phase by phase."""
    return option_phase_table(
        documents, SUBNORMALS_UNPRICED, SUBNORMALS_PRICED, ("unpriced", "at their slowdown")
    )


def run_line(documents: dict[str, dict[str, Any]]) -> str:
    first = next(iter(documents.values()))
    finished = sorted(d["finished"] for d in documents.values())
    day, time = finished[-1].split(" ")[:2]  # "2026-11-28 16:18 UTC": the day only where it changed
    last = f"{day} {time}" if day != finished[0].split(" ")[0] else time
    commits = sorted({d["commit"] for d in documents.values()})
    by_commit = "; ".join(
        f"`{c}`: " + ", ".join(k for k, d in documents.items() if d["commit"] == c) for c in commits
    )
    return (
        f"{first['machine']}; finished from {finished[0]} to {last} UTC; by commit, {by_commit}."
        if len(commits) > 1
        else f"{first['machine']}; the sets one after another, finished from {finished[0]} to "
        f"{last} UTC; commit `{commits[0]}`."
    )


def host_sets(documents: dict[str, dict[str, Any]], keys: list[str] | None = None) -> str:
    """Every set's rows of another host (of ``keys`` only, where given), one section a set."""
    return "\n\n".join(
        set_section(title, what, documents[key])
        for key, title, what in SETS
        if key in documents and (keys is None or key in keys)
    )


def host_sets_pages(pages: list[str], documents: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """The sets each of another host's sets pages holds: ``pages`` are ``PAGE`` (the first) or
    ``PAGE:SET`` (the page from that set on, in ``SETS``' order, up to the next page's first)."""
    keys = [key for key, _, _ in SETS if key in documents]
    starts, names = [], []
    for index, page in enumerate(pages):
        name, _, first = page.partition(":")
        if index and first not in keys:
            raise SystemExit(f"--host-sets-page {page}: name the set its page starts at (one of {keys})")
        starts.append(keys.index(first) if index else 0)
        names.append(name)
    if starts != sorted(starts):
        raise SystemExit("--host-sets-page: give the pages in the order of their sets")
    bounds = [*starts, len(keys)]
    return {name: keys[bounds[i] : bounds[i + 1]] for i, name in enumerate(names)}


def host_page(text: str, documents: dict[str, dict[str, Any]]) -> str:
    """A page of another host's sets (``--host-page``): ``text`` with its run line, summary, every
    set's rows (where the page holds them) and the phases table written from ``documents``."""
    text = replace_between(text, "run", run_line(documents))
    text = replace_between(text, "summary", summary(documents))
    return replace_between(host_tables(text, documents), "phases", phases(documents))


def host_tables(text: str, documents: dict[str, dict[str, Any]]) -> str:
    """``text`` with each of ``HOST_TABLES`` it has a marker of written from ``documents``."""
    for name, table in HOST_TABLES.items():
        if f"<!-- heldout_report:{name} -->" in text:
            text = replace_between(text, name, table(documents))
    return text


#: The parts a host page may hold, by marker: each written where the page has its marker.
HOST_TABLES: dict[str, Callable[[dict[str, dict[str, Any]]], str]] = {
    "sets": host_sets,
    "few-rows": few_rows,
    "compiled-calls": compiled_calls,
    "norms": norms,
    "norms-out": norms_out_of_cache,
    "zoo-norms": zoo_norms_out_of_cache,
    "update-lead": update_after_backward,
    "subnormals": subnormals,
    "subnormal-phases": subnormal_phases,
    **{
        name: functools.partial(option_table, off=off, on=on, short=short, since=since)
        for name, (off, on, short, since) in LATER_OPTIONS.items()
    },
}


def replace_between(text: str, name: str, content: str) -> str:
    """``text`` with what stands between the markers of ``name`` replaced by ``content``."""
    pattern = re.compile(
        rf"(<!-- heldout_report:{re.escape(name)} -->\n).*?(<!-- /heldout_report -->)", re.DOTALL
    )
    if not pattern.search(text):
        raise SystemExit(f"no <!-- heldout_report:{name} --> ... <!-- /heldout_report --> in the page")
    return pattern.sub(lambda m: m.group(1) + content + "\n" + m.group(2), text, count=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where the sets' JSON files are (<set>.json)")
    parser.add_argument("--host-page", help="another host's runs: the page (in docs/) they go to, whole")
    parser.add_argument(
        "--host-sets-page",
        action="append",
        help="with --host-page: the page (in docs/) each set's rows go to, apart; again as PAGE:SET for a "
        "further page holding the sets from SET on",
    )
    parser.add_argument(
        "--host-tables-page",
        action="append",
        help="with --host-page: a further page (in docs/) whose tables of the host's sets are written",
    )
    args = parser.parse_args()
    if (args.host_sets_page or args.host_tables_page) and not args.host_page:
        parser.error("--host-sets-page and --host-tables-page go with --host-page")
    found = {
        key: json.loads((args.directory / f"{key}.json").read_text())
        for key, _, _ in SETS
        if (args.directory / f"{key}.json").is_file()
    }
    # A run stopped after its steps were measured leaves them marked "partial": not a set's figures.
    documents = {key: document for key, document in found.items() if "partial" not in document}
    if not documents:
        parser.error(f"no set's JSON in {args.directory} (first.json, fresh.json, ...)")
    if args.host_page:
        page = DOCS / args.host_page
        if not page.is_file():
            parser.error(f"no page {page}")
        write_text_atomic(page, host_page(page.read_text(), documents))
        for name, keys in host_sets_pages(args.host_sets_page or [], documents).items():
            page = DOCS / name
            if not page.is_file():
                parser.error(f"no page {page}")
            write_text_atomic(page, replace_between(page.read_text(), "sets", host_sets(documents, keys)))
        for name in args.host_tables_page or []:
            page = DOCS / name
            if not page.is_file():
                parser.error(f"no page {page}")
            write_text_atomic(page, host_tables(page.read_text(), documents))
        return
    page = DOCS / "validation-heldout.md"
    text = replace_between(page.read_text(), "run", run_line(documents))
    text = replace_between(text, "summary", summary(documents))
    text = replace_between(text, "attention", attention(documents))
    write_text_atomic(page, text)
    for name, keys in sets_by_page().items():
        sections = [
            set_section(title, what, documents[key])
            for key, title, what in SETS
            if key in documents and key in keys
        ]
        page = DOCS / name
        write_text_atomic(page, replace_between(page.read_text(), "sets", "\n\n".join(sections)))
    page = DOCS / "validation-heldout-phases.md"
    write_text_atomic(page, replace_between(page.read_text(), "phases", phases(documents)))


if __name__ == "__main__":
    main()
