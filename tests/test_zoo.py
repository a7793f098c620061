"""Third-party models as workloads (``timm:NAME``, ``hf:MODEL_TYPE`` for transformers' language models
and image classifiers): they train, their parameters are the library's own model's, bad names and a
missing library get one line, and nothing imports either library until such a name is asked for.
The timm tests need a working timm (and its torchvision)."""

from __future__ import annotations

import logging
import math
import subprocess
import sys

import pytest
import torch
from tests.conftest import run_cli_batch

from dnnperf.errors import UsageError
from dnnperf.runner import workload_section
from dnnperf.workloads import get_workload

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

STEPS = 6


def library(name: str):
    """The library, or a skip naming why it cannot be used here."""
    try:
        return __import__(name)
    except Exception as error:  # a torchvision built for another torch fails with a RuntimeError
        pytest.skip(f"{name} cannot be imported here: {error}")


def losses_on_a_fixed_batch(name: str) -> list[float]:
    """The loss of each of STEPS steps on one batch, the RNG reset before each step (the same dropout
    and the same masked tokens every time): training must make it fall."""
    workload = get_workload(name)
    torch.manual_seed(0)
    task = workload.build("tiny")
    batch = workload.data("tiny").synthesize(4, seed=0)
    losses = []
    for _ in range(STEPS):
        torch.manual_seed(1)
        losses.append(float(task.step(batch)))
    return losses


def assert_trains(losses: list[float]) -> None:
    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < 0.95 * losses[0], losses


HF_MODELS = [
    # model type, the library's class for it, the suite's domain (what each kind of model is known to be)
    ("gpt2", "GPT2LMHeadModel", "language modelling"),  # decoder: causal LM
    ("bert", "BertForMaskedLM", "language modelling"),  # encoder: masked LM
    ("t5", "T5ForConditionalGeneration", "machine translation"),  # encoder-decoder: seq2seq
    ("gpt_neo", "GPTNeoForCausalLM", "language modelling"),  # attention kinds listed per layer
]


@pytest.mark.parametrize(("model_type", "model_class", "domain"), HF_MODELS)
def test_a_transformers_model_trains_with_its_own_loss(model_type, model_class, domain):
    library("transformers")
    workload = get_workload(f"hf:{model_type}")
    assert workload.domain == domain
    assert type(workload.build("tiny", "meta").model).__name__ == model_class
    assert_trains(losses_on_a_fixed_batch(f"hf:{model_type}"))


@pytest.mark.parametrize("model_type", [m for m, _, _ in HF_MODELS])
def test_a_transformers_models_parameters_are_the_librarys(model_type):
    """The record counts on ``meta``; the library's own model, built from the same configuration on
    the CPU, counts the same."""
    transformers = library("transformers")
    workload = get_workload(f"hf:{model_type}")
    config = workload.config("small")
    model_config = transformers.AutoConfig.for_model(model_type, **config.settings)
    auto = {
        "causal": transformers.AutoModelForCausalLM,
        "masked": transformers.AutoModelForMaskedLM,
        "seq2seq": transformers.AutoModelForSeq2SeqLM,
    }[config.head]
    own = auto.from_config(model_config)
    assert workload_section(workload, "small")["parameters"] == sum(p.numel() for p in own.parameters())


@pytest.mark.parametrize("named", [True, False])
def test_a_causal_lm_named_otherwise_trains_on_next_token_cross_entropy_without_a_warning(named):
    """GPT2LMHeadModel's class name is not one transformers maps to a loss: its loss is named for it,
    the next token's cross-entropy (computed here from its logits), and the library warns of nothing;
    unnamed (as the library builds it), the same loss with the library's warning."""
    transformers = library("transformers")
    transformers.utils.logging.warning_once.cache_clear()  # warned once a process: this test's own
    workload = get_workload("hf:gpt2")
    torch.manual_seed(0)
    task = workload.build("tiny")
    if not named:
        task.model.loss_type = None
    tokens = workload.data("tiny").synthesize(2, seed=0)["tokens"]
    heard: list[str] = []  # the library's own logger: it does not propagate to the root's
    handler = logging.Handler()
    handler.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("transformers").addHandler(handler)
    try:
        torch.manual_seed(1)  # the same dropout in both forwards
        loss = task.loss_fn(task.model, {"tokens": tokens})
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    warned = any("loss_type" in message for message in heard)
    torch.manual_seed(1)
    logits = task.model(input_ids=tokens).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert warned != named


def test_gpt2_presets_match_their_analytic_counts():
    """tiny: V*H + P*H + L*(12H^2 + 13H) + 2H (tied head) with V=256, P=32, H=64, L=2; full: the
    library's defaults, GPT-2 small's published 124,439,808."""
    library("transformers")
    workload = get_workload("hf:gpt2")
    vocab, positions, width, layers = 256, 32, 64, 2
    expected = vocab * width + positions * width + layers * (12 * width**2 + 13 * width) + 2 * width
    assert workload_section(workload, "tiny")["parameters"] == expected
    assert workload_section(workload, "full")["parameters"] == 124_439_808
    assert workload.config("full").seq_len == 1024 and workload.config("full").settings == {}


HF_IMAGE_MODELS = [
    # model type, the library's class for it (a CNN, a plain transformer, one of two classes for the
    # type, windowed attention, an input size given as a pair)
    ("resnet", "ResNetForImageClassification"),
    ("vit", "ViTForImageClassification"),
    ("deit", "DeiTForImageClassification"),
    ("swin", "SwinForImageClassification"),
    ("hiera", "HieraForImageClassification"),  # its input size a (height, width) pair
    ("clip", "CLIPForImageClassification"),  # its image tower a configuration of its own
    ("siglip", "SiglipForImageClassification"),
]


@pytest.mark.parametrize(("model_type", "model_class"), HF_IMAGE_MODELS)
def test_a_transformers_image_classifier_trains_on_the_suites_images(model_type, model_class):
    library("transformers")
    workload = get_workload(f"hf:{model_type}")
    assert workload.domain == "image classification"
    assert type(workload.build("tiny", "meta").model).__name__ == model_class
    config = workload.config("tiny")
    assert config.image_size == 64 and config.num_classes == 10
    assert workload.data("tiny").synthesize(2, seed=0)["image"].shape == (2, 3, 64, 64)
    assert_trains(losses_on_a_fixed_batch(f"hf:{model_type}"))


@pytest.mark.parametrize(("model_type", "model_class"), HF_IMAGE_MODELS)
def test_a_transformers_image_classifiers_parameters_are_the_librarys(model_type, model_class):
    """The record counts on ``meta``; the library's class, built from the same configuration on the
    CPU, counts the same."""
    transformers = library("transformers")
    workload = get_workload(f"hf:{model_type}")
    config = workload.config("small")
    model_config = transformers.AutoConfig.for_model(model_type, **config.settings)
    own = getattr(transformers, model_class)(model_config)
    assert workload_section(workload, "small")["parameters"] == sum(p.numel() for p in own.parameters())
    assert own.config.num_labels == 100


@pytest.mark.parametrize(
    ("model_type", "parameters"),
    [("resnet", 25_557_032), ("vit", 86_567_656), ("mobilenet_v2", 3_504_872)],
)
def test_image_classifiers_full_is_the_published_model(model_type, parameters):
    """``full``: the defaults with 1000 classes, the published ResNet-50, ViT-B/16 and MobileNetV2."""
    library("transformers")
    workload = get_workload(f"hf:{model_type}")
    assert workload_section(workload, "full")["parameters"] == parameters
    assert workload.config("full").image_size == 224


def test_efficientnet_below_full_is_b0():
    """The defaults are B7 (600 pixels); tiny and small are B0 at a quarter and half of its 224 pixels,
    and small with 1000 classes would be B0's published 5,288,548 parameters less its classifier's
    (1280 + 1) x 900."""
    library("transformers")
    workload = get_workload("hf:efficientnet")
    assert workload.config("full").image_size == 600
    assert (workload.config("tiny").image_size, workload.config("small").image_size) == (64, 128)
    assert workload_section(workload, "small")["parameters"] == 5_288_548 - 1281 * 900


@pytest.mark.parametrize("name", ["resnet18", "vit_tiny_patch16_224"])
def test_a_timm_model_trains_and_its_parameters_are_the_librarys(name):
    timm = library("timm")
    workload = get_workload(f"timm:{name}")
    config = workload.config("tiny")
    own = timm.create_model(name, pretrained=False, num_classes=config.num_classes, **config.arguments)
    assert workload_section(workload, "tiny")["parameters"] == sum(p.numel() for p in own.parameters())
    size = config.image_size
    assert workload.data("tiny").synthesize(2, seed=0)["image"].shape == (2, 3, size, size)
    assert_trains(losses_on_a_fixed_batch(f"timm:{name}"))


def test_timm_full_is_the_librarys_default_model():
    """ResNet-18 with 1000 classes at 224x224: the published 11,689,512 parameters."""
    library("timm")
    workload = get_workload("timm:resnet18")
    assert workload_section(workload, "full")["parameters"] == 11_689_512
    assert workload.config("full").image_size == 224


def test_bad_names_get_one_line_with_the_closest_matches():
    argvs = [["bench", "hf:gtp2"], ["bench", "hf:"], ["bench", "zoo:resnet18"], ["bench", "hf:detr"]]
    results = run_cli_batch(argvs)
    named = "timm:NAME or hf:MODEL_TYPE"
    expected = [("hf:gpt2",), (named,), (named,), ("no language", "no image classifier")]
    for result, needles in zip(results, expected, strict=True):
        if "cannot be imported" in result.stderr or "not installed" in result.stderr:
            continue  # the refusal of a library not usable here is tested below
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        for needle in needles:
            assert needle in lines[0], lines[0]


def test_a_misspelt_timm_name_gets_the_closest_matches():
    library("timm")
    with pytest.raises(UsageError, match=r"unknown timm model 'resnt18'; did you mean timm:resnet18"):
        get_workload("timm:resnt18")


@pytest.mark.parametrize(
    ("name", "module", "extra"),
    [("timm:resnet34", "timm", "timm"), ("hf:mistral", "transformers", "zoo")],
)
def test_a_missing_library_is_one_line_saying_how_to_install_it(monkeypatch, name, module, extra):
    # (a name no other test builds: the zoo keeps the workloads it built)
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if the package were not installed
    with pytest.raises(UsageError) as refused:
        get_workload(name)
    message = str(refused.value)
    assert "\n" not in message
    assert f"needs {module}" in message and f"pip install 'dnnperf[{extra}]'" in message


def test_the_suite_imports_neither_library():
    code = (
        "import sys, dnnperf.workloads as w; w.get_workload('resnet18').build('tiny', 'meta');"
        "print('timm' in sys.modules, 'transformers' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_a_classifier_that_returns_no_loss_trains_on_the_cross_entropy_of_its_logits():
    """PP-LCNet's classifier takes no labels and returns its logits as ``last_hidden_state``: its
    loss is the cross-entropy of those logits, by hand here, about ln(10) for 10 classes at random
    weights, and the model trains on it."""
    library("transformers")
    workload = get_workload("hf:pp_lcnet")
    torch.manual_seed(0)
    task = workload.build("tiny", "cpu")
    batch = workload.data("tiny").synthesize(4, seed=0)
    task.model.eval()  # the same forward twice (no dropout, batch norm's running statistics)
    logits = task.model(pixel_values=batch["image"]).last_hidden_state
    expected = -torch.log_softmax(logits, dim=1)[torch.arange(4), batch["label"]].mean()
    assert task.loss_fn(task.model, batch).item() == pytest.approx(expected.item(), rel=1e-5)
    assert abs(expected.item() - math.log(10)) < 0.5
    assert_trains(losses_on_a_fixed_batch("hf:pp_lcnet"))
