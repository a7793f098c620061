"""Image-classification models in plain PyTorch: ResNet, BasicCNN, AlexNet, VGG and Inception-v3.

Every architecture follows its published definition (torchvision's layer shapes are the reference) and
is configured by a frozen dataclass. Each model has presets "tiny" (a CPU training step in well under
0.5 s), "small" (in between) and "full" (the published dimensions). Layers that hold parameters are named
module attributes so that per-layer profilers can hook them.
"""

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ALEXNET_PRESETS",
    "BASIC_CNN_PRESETS",
    "INCEPTION_V3_PRESETS",
    "RESNET18_PRESETS",
    "RESNET34_PRESETS",
    "RESNET50_PRESETS",
    "RESNET101_PRESETS",
    "RESNET152_PRESETS",
    "VGG",
    "VGG11_PRESETS",
    "VGG13_PRESETS",
    "VGG16_PRESETS",
    "VGG19_PRESETS",
    "AlexNet",
    "AlexNetConfig",
    "BasicBlock",
    "BasicCNN",
    "BasicCNNConfig",
    "BasicConv2d",
    "Bottleneck",
    "InceptionA",
    "InceptionAux",
    "InceptionB",
    "InceptionC",
    "InceptionD",
    "InceptionE",
    "InceptionV3",
    "InceptionV3Config",
    "ResNet",
    "ResNetConfig",
    "VGGConfig",
]


def _scaled(channels: int, mult: float) -> int:
    """Channel count ``channels * mult`` rounded to the nearest integer, never below 1."""
    return max(1, round(channels * mult))


# ---------------------------------------------------------------------------------------------------------
# ResNet (He et al. 2015; torchvision's "v1.5": the stride of a Bottleneck sits on its 3x3 conv)
# ---------------------------------------------------------------------------------------------------------

# depth -> (block kind, blocks per stage)
_RESNET_LAYOUTS: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


@dataclass(frozen=True)
class ResNetConfig:
    """ResNet hyper-parameters; ``width`` is the stem / first-stage channel count (64 published)."""

    depth: int = 50
    width: int = 64
    num_classes: int = 1000
    image_size: int = 224
    in_channels: int = 3

    def __post_init__(self) -> None:
        if self.depth not in _RESNET_LAYOUTS:
            raise ValueError(f"ResNet depth must be one of {sorted(_RESNET_LAYOUTS)}, got {self.depth}")
        if self.width < 1 or self.num_classes < 1 or self.in_channels < 1 or self.image_size < 1:
            raise ValueError(f"ResNetConfig fields must be positive: {self}")


def _downsample(in_channels: int, out_channels: int, stride: int) -> nn.Sequential | None:
    """Projection shortcut (1x1 conv + BN) when the residual branch changes shape, else None."""
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(
        OrderedDict(
            conv=nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
            bn=nn.BatchNorm2d(out_channels),
        )
    )


class BasicBlock(nn.Module):
    """Two 3x3 convs with an identity (or projected) shortcut; used by ResNet-18/34."""

    expansion: int = 1

    def __init__(self, in_channels: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, out_channels, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = _downsample(in_channels, out_channels, stride)
        # A separate module for the post-addition ReLU so per-layer hooks see each activation once.
        self.relu_out = nn.ReLU(inplace=True)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu_out(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (carries the stride, ResNet v1.5) -> 1x1 expand by 4; used by ResNet-50+."""

    expansion: int = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(planes, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.downsample = _downsample(in_channels, out_channels, stride)
        self.relu_out = nn.ReLU(inplace=True)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu_out(out + identity)


class ResNet(nn.Module):
    """ResNet-18/34/50/101/152: stem, four stages of residual blocks, global average pool, fc.

    ``stage_channels`` gives the channel count at the output of ``layer1``..``layer4`` (strides 4, 8, 16,
    32), which is what feature-pyramid consumers such as detection heads need.
    """

    def __init__(self, config: ResNetConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else ResNetConfig()
        kind, blocks_per_stage = _RESNET_LAYOUTS[config.depth]
        block: type[BasicBlock] | type[Bottleneck] = BasicBlock if kind == "basic" else Bottleneck
        width = config.width
        self.stem = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(config.in_channels, width, kernel_size=7, stride=2, padding=3, bias=False),
                bn1=nn.BatchNorm2d(width),
                relu=nn.ReLU(inplace=True),
                maxpool=nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
            )
        )
        in_channels = width
        stages: list[nn.Sequential] = []
        for index, num_blocks in enumerate(blocks_per_stage):
            planes = width * 2**index
            # The first stage keeps the stem's resolution (the max-pool already halved it).
            stride = 1 if index == 0 else 2
            blocks: list[nn.Module] = []
            for block_index in range(num_blocks):
                blocks.append(block(in_channels, planes, stride if block_index == 0 else 1))
                in_channels = planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        first = width * block.expansion
        self.stage_channels: tuple[int, int, int, int] = (first, 2 * first, 4 * first, 8 * first)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, config.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        # torchvision's initialisation: He (fan-out) for convs, unit-scale BN, default Linear.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward_stages(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Outputs of ``layer1``..``layer4`` (strides 4, 8, 16, 32) for a batch of images."""
        x = self.stem(x)
        outputs = []
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = stage(x)
            outputs.append(x)
        return outputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _resnet_presets(depth: int) -> dict[str, ResNetConfig]:
    # tiny/small keep every block and only shrink width, resolution and classes.
    return {
        "tiny": ResNetConfig(depth=depth, width=8, num_classes=10, image_size=32),
        "small": ResNetConfig(depth=depth, width=32, num_classes=100, image_size=112),
        "full": ResNetConfig(depth=depth, width=64, num_classes=1000, image_size=224),
    }


RESNET18_PRESETS: dict[str, ResNetConfig] = _resnet_presets(18)
RESNET34_PRESETS: dict[str, ResNetConfig] = _resnet_presets(34)
RESNET50_PRESETS: dict[str, ResNetConfig] = _resnet_presets(50)
RESNET101_PRESETS: dict[str, ResNetConfig] = _resnet_presets(101)
RESNET152_PRESETS: dict[str, ResNetConfig] = _resnet_presets(152)


# ---------------------------------------------------------------------------------------------------------
# BasicCNN: the two-conv CIFAR network of the TensorFlow tutorial, used in memory-characterisation work
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BasicCNNConfig:
    """BasicCNN hyper-parameters: two 5x5 conv stages of ``channels``, then a ``hidden``-unit MLP."""

    image_size: int = 32
    in_channels: int = 3
    num_classes: int = 10
    channels: tuple[int, int] = (32, 64)
    hidden: int = 512

    def __post_init__(self) -> None:
        if len(self.channels) != 2:
            raise ValueError(f"BasicCNN has exactly two conv stages, got channels={self.channels}")
        if self.image_size < 4:
            raise ValueError(f"BasicCNN needs image_size >= 4 (two 2x pools), got {self.image_size}")


class BasicCNN(nn.Module):
    """conv5x5 -> ReLU -> maxpool2, twice, then flatten -> Linear(hidden) -> ReLU -> Linear(classes)."""

    def __init__(self, config: BasicCNNConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else BasicCNNConfig()
        c1, c2 = config.channels
        self.conv1 = nn.Conv2d(config.in_channels, c1, kernel_size=5, padding=2)
        self.relu1 = nn.ReLU(inplace=True)
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=5, padding=2)
        self.relu2 = nn.ReLU(inplace=True)
        self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
        # "Same" convs keep the size; each pool floors it by 2.
        spatial = config.image_size // 2 // 2
        self.fc1 = nn.Linear(c2 * spatial * spatial, config.hidden)
        self.relu3 = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(config.hidden, config.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = self.relu3(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


BASIC_CNN_PRESETS: dict[str, BasicCNNConfig] = {
    "tiny": BasicCNNConfig(image_size=16, num_classes=10, channels=(8, 16), hidden=64),
    "small": BasicCNNConfig(image_size=32, num_classes=100, channels=(16, 32), hidden=256),
    "full": BasicCNNConfig(image_size=32, in_channels=3, num_classes=10, channels=(32, 64), hidden=512),
}


# ---------------------------------------------------------------------------------------------------------
# AlexNet (Krizhevsky et al. 2012, single-tower variant as in torchvision)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlexNetConfig:
    """AlexNet hyper-parameters; ``width_mult`` scales the conv channels (64, 192, 384, 256, 256)."""

    image_size: int = 224
    in_channels: int = 3
    num_classes: int = 1000
    width_mult: float = 1.0
    classifier_width: int = 4096
    dropout: float = 0.5

    def __post_init__(self) -> None:
        # The three 3x3/2 max-pools need at least a 1x1 map: 63 px is the smallest input that gives one.
        if self.image_size < 63:
            raise ValueError(f"AlexNet needs image_size >= 63, got {self.image_size}")
        if self.width_mult <= 0:
            raise ValueError(f"width_mult must be positive, got {self.width_mult}")


class AlexNet(nn.Module):
    """Five convs with three max-pools, a 6x6 adaptive average pool and a three-layer classifier."""

    def __init__(self, config: AlexNetConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else AlexNetConfig()
        c1, c2, c3, c4, c5 = (_scaled(c, config.width_mult) for c in (64, 192, 384, 256, 256))
        self.features = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(config.in_channels, c1, kernel_size=11, stride=4, padding=2),
                relu1=nn.ReLU(inplace=True),
                pool1=nn.MaxPool2d(kernel_size=3, stride=2),
                conv2=nn.Conv2d(c1, c2, kernel_size=5, padding=2),
                relu2=nn.ReLU(inplace=True),
                pool2=nn.MaxPool2d(kernel_size=3, stride=2),
                conv3=nn.Conv2d(c2, c3, kernel_size=3, padding=1),
                relu3=nn.ReLU(inplace=True),
                conv4=nn.Conv2d(c3, c4, kernel_size=3, padding=1),
                relu4=nn.ReLU(inplace=True),
                conv5=nn.Conv2d(c4, c5, kernel_size=3, padding=1),
                relu5=nn.ReLU(inplace=True),
                pool5=nn.MaxPool2d(kernel_size=3, stride=2),
            )
        )
        # Fixed 6x6 so the classifier's shape does not depend on the input resolution.
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        hidden = config.classifier_width
        self.classifier = nn.Sequential(
            OrderedDict(
                dropout1=nn.Dropout(p=config.dropout),
                fc1=nn.Linear(c5 * 6 * 6, hidden),
                relu1=nn.ReLU(inplace=True),
                dropout2=nn.Dropout(p=config.dropout),
                fc2=nn.Linear(hidden, hidden),
                relu2=nn.ReLU(inplace=True),
                fc3=nn.Linear(hidden, config.num_classes),
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


ALEXNET_PRESETS: dict[str, AlexNetConfig] = {
    "tiny": AlexNetConfig(image_size=64, num_classes=10, width_mult=0.25, classifier_width=256),
    "small": AlexNetConfig(image_size=128, num_classes=100, width_mult=0.5, classifier_width=1024),
    "full": AlexNetConfig(image_size=224, num_classes=1000, width_mult=1.0, classifier_width=4096),
}


# ---------------------------------------------------------------------------------------------------------
# VGG (Simonyan & Zisserman 2014), configurations A/B/D/E = VGG-11/13/16/19
# ---------------------------------------------------------------------------------------------------------

# Conv output channels per block; "M" is a 2x2 max-pool.
_VGG_LAYOUTS: dict[int, tuple[int | str, ...]] = {
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    13: (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (
        *(64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M"),
        *(512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
    ),
}


@dataclass(frozen=True)
class VGGConfig:
    """VGG hyper-parameters; ``width_mult`` scales every conv's channels, ``batch_norm`` adds BN."""

    depth: int = 16
    image_size: int = 224
    in_channels: int = 3
    num_classes: int = 1000
    width_mult: float = 1.0
    classifier_width: int = 4096
    batch_norm: bool = False
    dropout: float = 0.5

    def __post_init__(self) -> None:
        if self.depth not in _VGG_LAYOUTS:
            raise ValueError(f"VGG depth must be one of {sorted(_VGG_LAYOUTS)}, got {self.depth}")
        if self.image_size < 32:
            raise ValueError(f"VGG needs image_size >= 32 (five 2x pools), got {self.image_size}")
        if self.width_mult <= 0:
            raise ValueError(f"width_mult must be positive, got {self.width_mult}")


class VGG(nn.Module):
    """Stacks of 3x3 convs separated by max-pools, a 7x7 adaptive average pool and a 3-layer classifier."""

    def __init__(self, config: VGGConfig | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else VGGConfig()
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        in_channels = config.in_channels
        stage, index = 1, 1
        for item in _VGG_LAYOUTS[config.depth]:
            if item == "M":
                layers[f"pool{stage}"] = nn.MaxPool2d(kernel_size=2, stride=2)
                stage, index = stage + 1, 1
                continue
            out_channels = _scaled(int(item), config.width_mult)
            # Names follow the paper's "conv<stage>_<index>" so profiles read like its tables.
            layers[f"conv{stage}_{index}"] = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
            if config.batch_norm:
                layers[f"bn{stage}_{index}"] = nn.BatchNorm2d(out_channels)
            layers[f"relu{stage}_{index}"] = nn.ReLU(inplace=True)
            in_channels = out_channels
            index += 1
        self.features = nn.Sequential(layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        hidden = config.classifier_width
        self.classifier = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(in_channels * 7 * 7, hidden),
                relu1=nn.ReLU(inplace=True),
                dropout1=nn.Dropout(p=config.dropout),
                fc2=nn.Linear(hidden, hidden),
                relu2=nn.ReLU(inplace=True),
                dropout2=nn.Dropout(p=config.dropout),
                fc3=nn.Linear(hidden, config.num_classes),
            )
        )
        self._init_weights()

    def _init_weights(self) -> None:
        # torchvision's VGG initialisation: He (fan-out) convs with zero bias, N(0, 0.01) linears.
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def _vgg_presets(depth: int) -> dict[str, VGGConfig]:
    return {
        "tiny": VGGConfig(depth, image_size=32, num_classes=10, width_mult=0.125, classifier_width=128),
        "small": VGGConfig(depth, image_size=64, num_classes=100, width_mult=0.5, classifier_width=1024),
        "full": VGGConfig(depth, image_size=224, num_classes=1000, width_mult=1.0, classifier_width=4096),
    }


VGG11_PRESETS: dict[str, VGGConfig] = _vgg_presets(11)
VGG13_PRESETS: dict[str, VGGConfig] = _vgg_presets(13)
VGG16_PRESETS: dict[str, VGGConfig] = _vgg_presets(16)
VGG19_PRESETS: dict[str, VGGConfig] = _vgg_presets(19)


# ---------------------------------------------------------------------------------------------------------
# Inception-v3 (Szegedy et al. 2015), torchvision's Inception3 layout
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InceptionV3Config:
    """Inception-v3 hyper-parameters; ``width_mult`` scales every branch (rounded, at least 1 channel)."""

    image_size: int = 299
    in_channels: int = 3
    num_classes: int = 1000
    width_mult: float = 1.0
    aux_logits: bool = False
    dropout: float = 0.5

    def __post_init__(self) -> None:
        # Smaller inputs shrink to nothing before Mixed_7a's stride-2 convs.
        if self.image_size < 75:
            raise ValueError(f"Inception-v3 needs image_size >= 75, got {self.image_size}")
        if self.width_mult <= 0:
            raise ValueError(f"width_mult must be positive, got {self.width_mult}")


class BasicConv2d(nn.Module):
    """Conv (no bias, BN supplies it) -> BatchNorm(eps=0.001) -> ReLU, Inception's unit layer."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False
        )
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)
        self.relu = nn.ReLU(inplace=True)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    """35x35 block: 1x1, 1x1->5x5, 1x1->3x3->3x3 and avg-pool->1x1 branches (Mixed_5b..5d)."""

    def __init__(self, in_channels: int, pool_features: int, mult: float = 1.0) -> None:
        super().__init__()
        c64, c48, c96 = _scaled(64, mult), _scaled(48, mult), _scaled(96, mult)
        self.branch1x1 = BasicConv2d(in_channels, c64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(in_channels, c48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(c48, c64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, c64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c64, c96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(c96, c96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(in_channels, _scaled(pool_features, mult), kernel_size=1)
        self.out_channels = c64 + c64 + c96 + self.branch_pool.out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch1x1 = self.branch1x1(x)
        branch5x5 = self.branch5x5_2(self.branch5x5_1(x))
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        branch_pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([branch1x1, branch5x5, branch3x3dbl, branch_pool], 1)


class InceptionB(nn.Module):
    """Grid reduction 35->17: stride-2 3x3, 1x1->3x3->3x3/2 and max-pool branches (Mixed_6a)."""

    def __init__(self, in_channels: int, mult: float = 1.0) -> None:
        super().__init__()
        c384, c64, c96 = _scaled(384, mult), _scaled(64, mult), _scaled(96, mult)
        self.branch3x3 = BasicConv2d(in_channels, c384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, c64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c64, c96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(c96, c96, kernel_size=3, stride=2)
        # The pooled branch passes the input channels through unchanged.
        self.out_channels = c384 + c96 + in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch3x3 = self.branch3x3(x)
        branch3x3dbl = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        branch_pool = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([branch3x3, branch3x3dbl, branch_pool], 1)


class InceptionC(nn.Module):
    """17x17 block with factorised 1x7/7x1 convs (Mixed_6b..6e); ``channels_7x7`` is the inner width."""

    def __init__(self, in_channels: int, channels_7x7: int, mult: float = 1.0) -> None:
        super().__init__()
        c192, c7 = _scaled(192, mult), _scaled(channels_7x7, mult)
        self.branch1x1 = BasicConv2d(in_channels, c192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, c192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, c192, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(in_channels, c192, kernel_size=1)
        self.out_channels = 4 * c192

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch1x1 = self.branch1x1(x)
        branch7x7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        branch7x7dbl = self.branch7x7dbl_1(x)
        branch7x7dbl = self.branch7x7dbl_3(self.branch7x7dbl_2(branch7x7dbl))
        branch7x7dbl = self.branch7x7dbl_5(self.branch7x7dbl_4(branch7x7dbl))
        branch_pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([branch1x1, branch7x7, branch7x7dbl, branch_pool], 1)


class InceptionD(nn.Module):
    """Grid reduction 17->8: 1x1->3x3/2, 1x1->1x7->7x1->3x3/2 and max-pool branches (Mixed_7a)."""

    def __init__(self, in_channels: int, mult: float = 1.0) -> None:
        super().__init__()
        c192, c320 = _scaled(192, mult), _scaled(320, mult)
        self.branch3x3_1 = BasicConv2d(in_channels, c192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(c192, c320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(in_channels, c192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(c192, c192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(c192, c192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(c192, c192, kernel_size=3, stride=2)
        self.out_channels = c320 + c192 + in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch3x3 = self.branch3x3_2(self.branch3x3_1(x))
        branch7x7x3 = self.branch7x7x3_2(self.branch7x7x3_1(x))
        branch7x7x3 = self.branch7x7x3_4(self.branch7x7x3_3(branch7x7x3))
        branch_pool = F.max_pool2d(x, kernel_size=3, stride=2)
        return torch.cat([branch3x3, branch7x7x3, branch_pool], 1)


class InceptionE(nn.Module):
    """8x8 block with split 1x3/3x1 outputs for the widest representations (Mixed_7b, 7c)."""

    def __init__(self, in_channels: int, mult: float = 1.0) -> None:
        super().__init__()
        c320, c384, c448, c192 = (_scaled(c, mult) for c in (320, 384, 448, 192))
        self.branch1x1 = BasicConv2d(in_channels, c320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(in_channels, c384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(c384, c384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(c384, c384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_channels, c448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(c448, c384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(c384, c384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(c384, c384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_channels, c192, kernel_size=1)
        self.out_channels = c320 + 4 * c384 + c192

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch1x1 = self.branch1x1(x)
        branch3x3 = self.branch3x3_1(x)
        branch3x3 = torch.cat([self.branch3x3_2a(branch3x3), self.branch3x3_2b(branch3x3)], 1)
        branch3x3dbl = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        branch3x3dbl = torch.cat([self.branch3x3dbl_3a(branch3x3dbl), self.branch3x3dbl_3b(branch3x3dbl)], 1)
        branch_pool = self.branch_pool(F.avg_pool2d(x, kernel_size=3, stride=1, padding=1))
        return torch.cat([branch1x1, branch3x3, branch3x3dbl, branch_pool], 1)


class InceptionAux(nn.Module):
    """Auxiliary classifier on the 17x17 Mixed_6e output, used only while training."""

    def __init__(self, in_channels: int, num_classes: int, mult: float = 1.0) -> None:
        super().__init__()
        c128, c768 = _scaled(128, mult), _scaled(768, mult)
        self.conv0 = BasicConv2d(in_channels, c128, kernel_size=1)
        self.conv1 = BasicConv2d(c128, c768, kernel_size=5)
        self.fc = nn.Linear(c768, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Published: 17x17 -> 5x5 by a 5x5/3 average pool, which the 5x5 conv1 reduces to 1x1. Below 299 px
        # input the map is smaller than 17x17, so pool adaptively to the same 5x5 the layers expect.
        if min(x.shape[-2:]) >= 17:
            x = F.avg_pool2d(x, kernel_size=5, stride=3)
        else:
            x = F.adaptive_avg_pool2d(x, (5, 5))
        x = self.conv1(self.conv0(x))
        x = F.adaptive_avg_pool2d(x, (1, 1))
        return self.fc(torch.flatten(x, 1))


class InceptionV3(nn.Module):
    """Inception-v3: conv stem, Mixed_5b..Mixed_7c, global average pool, dropout, fc.

    With ``aux_logits`` on, the auxiliary head runs only in training mode and ``forward`` then returns
    ``(logits, aux_logits)``; otherwise (and always in eval mode) it returns the logits alone.
    """

    def __init__(self, config: InceptionV3Config | None = None) -> None:
        super().__init__()
        self.config = config = config if config is not None else InceptionV3Config()
        mult = config.width_mult
        c32, c64, c80, c192 = (_scaled(c, mult) for c in (32, 64, 80, 192))
        self.Conv2d_1a_3x3 = BasicConv2d(config.in_channels, c32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(c32, c32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(c32, c64, kernel_size=3, padding=1)
        self.maxpool1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(c64, c80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(c80, c192, kernel_size=3)
        self.maxpool2 = nn.MaxPool2d(kernel_size=3, stride=2)
        # Each block's input width is the previous block's actual concatenated width, so any rounding
        # of scaled branch widths stays consistent.
        self.Mixed_5b = InceptionA(c192, pool_features=32, mult=mult)
        self.Mixed_5c = InceptionA(self.Mixed_5b.out_channels, pool_features=64, mult=mult)
        self.Mixed_5d = InceptionA(self.Mixed_5c.out_channels, pool_features=64, mult=mult)
        self.Mixed_6a = InceptionB(self.Mixed_5d.out_channels, mult=mult)
        self.Mixed_6b = InceptionC(self.Mixed_6a.out_channels, channels_7x7=128, mult=mult)
        self.Mixed_6c = InceptionC(self.Mixed_6b.out_channels, channels_7x7=160, mult=mult)
        self.Mixed_6d = InceptionC(self.Mixed_6c.out_channels, channels_7x7=160, mult=mult)
        self.Mixed_6e = InceptionC(self.Mixed_6d.out_channels, channels_7x7=192, mult=mult)
        self.AuxLogits: InceptionAux | None = None
        if config.aux_logits:
            self.AuxLogits = InceptionAux(self.Mixed_6e.out_channels, config.num_classes, mult=mult)
        self.Mixed_7a = InceptionD(self.Mixed_6e.out_channels, mult=mult)
        self.Mixed_7b = InceptionE(self.Mixed_7a.out_channels, mult=mult)
        self.Mixed_7c = InceptionE(self.Mixed_7b.out_channels, mult=mult)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=config.dropout)
        self.fc = nn.Linear(self.Mixed_7c.out_channels, config.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        # torchvision's Inception3 initialisation: truncated N(0, 0.1) for convs and linears, unit BN.
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(module.weight, mean=0.0, std=0.1, a=-2, b=2)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if self.AuxLogits is not None:
            # The auxiliary classifier starts near zero so it does not dominate early gradients.
            nn.init.trunc_normal_(self.AuxLogits.fc.weight, mean=0.0, std=0.001, a=-2, b=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = self.maxpool1(x)
        x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)))
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6a(x)
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(x))))
        aux = self.AuxLogits(x) if self.AuxLogits is not None and self.training else None
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = self.dropout(torch.flatten(self.avgpool(x), 1))
        logits = self.fc(x)
        return (logits, aux) if aux is not None else logits


INCEPTION_V3_PRESETS: dict[str, InceptionV3Config] = {
    "tiny": InceptionV3Config(image_size=75, num_classes=10, width_mult=0.125),
    "small": InceptionV3Config(image_size=139, num_classes=100, width_mult=0.5),
    "full": InceptionV3Config(image_size=299, num_classes=1000, width_mult=1.0),
}
