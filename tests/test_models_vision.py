"""Tests for the plain-PyTorch image-classification models in dnnperf.models.vision."""

import dataclasses

import pytest
import torch
from torch import nn

from dnnperf.models.vision import (
    ALEXNET_PRESETS,
    BASIC_CNN_PRESETS,
    INCEPTION_V3_PRESETS,
    RESNET18_PRESETS,
    RESNET34_PRESETS,
    RESNET50_PRESETS,
    RESNET101_PRESETS,
    RESNET152_PRESETS,
    VGG,
    VGG11_PRESETS,
    VGG13_PRESETS,
    VGG16_PRESETS,
    VGG19_PRESETS,
    AlexNet,
    AlexNetConfig,
    BasicCNN,
    BasicCNNConfig,
    Bottleneck,
    InceptionV3,
    InceptionV3Config,
    ResNet,
    ResNetConfig,
    VGGConfig,
)

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

# name -> (model class, presets)
MODELS: dict[str, tuple[type[nn.Module], dict]] = {
    "basic_cnn": (BasicCNN, BASIC_CNN_PRESETS),
    "alexnet": (AlexNet, ALEXNET_PRESETS),
    "vgg11": (VGG, VGG11_PRESETS),
    "vgg13": (VGG, VGG13_PRESETS),
    "vgg16": (VGG, VGG16_PRESETS),
    "vgg19": (VGG, VGG19_PRESETS),
    "resnet18": (ResNet, RESNET18_PRESETS),
    "resnet34": (ResNet, RESNET34_PRESETS),
    "resnet50": (ResNet, RESNET50_PRESETS),
    "resnet101": (ResNet, RESNET101_PRESETS),
    "resnet152": (ResNet, RESNET152_PRESETS),
    "inception_v3": (InceptionV3, INCEPTION_V3_PRESETS),
}

# Published parameter counts (torchvision's model cards; BasicCNN from its layer shapes).
PUBLISHED_PARAMS: dict[str, int] = {
    "basic_cnn": 2_156_490,
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg13": 133_047_848,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "inception_v3": 23_834_568,
}


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _meta_model(cls: type[nn.Module], config: object) -> nn.Module:
    # Meta tensors carry shapes only: the full models cost no memory and no compute here.
    with torch.device("meta"):
        return cls(config)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_full_preset_matches_published_parameter_count(name: str) -> None:
    cls, presets = MODELS[name]
    model = _meta_model(cls, presets["full"])
    assert _num_params(model) == pytest.approx(PUBLISHED_PARAMS[name], rel=1e-3)


def test_inception_v3_with_aux_head_matches_published_parameter_count() -> None:
    config = dataclasses.replace(INCEPTION_V3_PRESETS["full"], aux_logits=True)
    model = _meta_model(InceptionV3, config)
    assert _num_params(model) == pytest.approx(27_161_264, rel=1e-3)


def test_vgg16_batch_norm_parameter_count() -> None:
    model = _meta_model(VGG, VGGConfig(depth=16, batch_norm=True))
    assert _num_params(model) == pytest.approx(138_365_992, rel=1e-3)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_presets_have_tiny_small_full(name: str) -> None:
    _, presets = MODELS[name]
    assert set(presets) == {"tiny", "small", "full"}
    full, small, tiny = presets["full"], presets["small"], presets["tiny"]
    expected_size = {"basic_cnn": 32, "inception_v3": 299}.get(name, 224)
    assert full.image_size == expected_size
    assert full.num_classes == (10 if name == "basic_cnn" else 1000)
    assert full.in_channels == 3
    assert tiny.image_size <= small.image_size <= full.image_size
    assert tiny.num_classes == 10


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_tiny_forward_shape(name: str, training: bool) -> None:
    cls, presets = MODELS[name]
    config = presets["tiny"]
    torch.manual_seed(0)
    model = cls(config).train(training)
    x = torch.randn(2, config.in_channels, config.image_size, config.image_size)
    out = model(x)
    assert isinstance(out, torch.Tensor)
    assert out.shape == (2, config.num_classes)
    assert torch.isfinite(out).all()


def test_inception_aux_logits_only_in_training() -> None:
    config = dataclasses.replace(INCEPTION_V3_PRESETS["tiny"], aux_logits=True)
    torch.manual_seed(0)
    model = InceptionV3(config)
    x = torch.randn(2, config.in_channels, config.image_size, config.image_size)
    model.train()
    logits, aux = model(x)
    assert logits.shape == (2, config.num_classes)
    assert aux.shape == (2, config.num_classes)
    model.eval()
    out = model(x)
    assert isinstance(out, torch.Tensor)
    assert out.shape == (2, config.num_classes)


def test_inception_aux_published_pooling_at_full_resolution() -> None:
    # At 299 px Mixed_6e is 17x17 and the aux head takes the published 5x5/3 pooling path.
    model = _meta_model(InceptionV3, InceptionV3Config(aux_logits=True)).train()
    with torch.device("meta"):
        logits, aux = model(torch.empty(2, 3, 299, 299))
    assert logits.shape == aux.shape == (2, 1000)


@pytest.mark.parametrize("width_mult", [0.3, 0.77])
def test_inception_odd_width_mult_keeps_concatenations_consistent(width_mult: float) -> None:
    config = InceptionV3Config(image_size=75, num_classes=7, width_mult=width_mult, aux_logits=True)
    model = _meta_model(InceptionV3, config).train()
    with torch.device("meta"):
        logits, aux = model(torch.empty(2, 3, 75, 75))
    assert logits.shape == aux.shape == (2, 7)
    assert model.fc.in_features == model.Mixed_7c.out_channels


def test_resnet50_bottleneck_strides() -> None:
    torch.manual_seed(0)
    model = ResNet(ResNetConfig(depth=50, width=8, num_classes=10, image_size=64)).eval()
    assert all(isinstance(block, Bottleneck) for block in model.layer1)
    first = model.layer2[0]
    # ResNet v1.5: the stride sits on the 3x3 conv, not the first 1x1.
    assert first.conv1.stride == (1, 1)
    assert first.conv2.stride == (2, 2)
    assert first.downsample is not None
    stages = model.forward_stages(torch.randn(1, 3, 64, 64))
    assert [s.shape[-1] for s in stages] == [16, 8, 4, 2]
    assert stages[-1].shape[-2:] == (2, 2)  # stride 32 at layer4
    assert tuple(s.shape[1] for s in stages) == model.stage_channels == (32, 64, 128, 256)


def test_resnet_attributes_and_stage_channels() -> None:
    model = _meta_model(ResNet, RESNET18_PRESETS["full"])
    assert isinstance(model.stem, nn.Sequential)
    assert [type(m) for m in model.stem] == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d]
    assert model.stem[0].kernel_size == (7, 7) and model.stem[0].stride == (2, 2)
    assert isinstance(model.avgpool, nn.AdaptiveAvgPool2d)
    assert model.stage_channels == (64, 128, 256, 512)
    assert [len(layer) for layer in (model.layer1, model.layer2, model.layer3, model.layer4)] == [2, 2, 2, 2]
    assert _meta_model(ResNet, RESNET50_PRESETS["tiny"]).stage_channels == (32, 64, 128, 256)


@pytest.mark.parametrize("name", ["basic_cnn", "resnet18", "inception_v3"])
def test_tiny_loss_falls_on_fixed_batch(name: str) -> None:
    cls, presets = MODELS[name]
    config = presets["tiny"]
    torch.manual_seed(0)
    model = cls(config).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(8, config.in_channels, config.image_size, config.image_size)
    y = torch.randint(0, config.num_classes, (8,))
    losses = []
    for _ in range(12):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # Batch norm on 8 samples makes single steps jumpy (and the path depends on the CPU's kernels):
    # judge the trend, the last four steps against the first.
    assert sum(losses[-4:]) / 4 < losses[0]


@pytest.mark.parametrize(
    ("factory", "kwargs"),
    [
        (ResNetConfig, {"depth": 42}),
        (VGGConfig, {"depth": 12}),
        (AlexNetConfig, {"image_size": 32}),
        (InceptionV3Config, {"image_size": 64}),
        (BasicCNNConfig, {"channels": (8, 16, 32)}),
    ],
)
def test_invalid_configs_rejected(factory: type, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        factory(**kwargs)


def test_configs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RESNET50_PRESETS["full"].depth = 18  # type: ignore[misc]
