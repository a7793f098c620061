"""Networks a user brings as their own ``nn.Module``: models of diffusers, x-transformers, torchtune
and fair-esm, built from configurations in code (random weights, nothing downloaded), each with the
training loss its library documents, registered as workloads for the held-out validation
(``heldout_validation.py --fourteenth`` to ``--seventeenth``). None of these libraries is a dependency
of dnnperf: ``pip install -e .[heldout]``.

Every model has one preset, ``small``: a few blocks of width 32-320 at 32-64 pixels, 1,024 samples or
128 tokens, steps of tens to hundreds of milliseconds on one CPU thread, as the suite's ``small``
presets.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dnnperf.data.formats import DataFormat, ImageFormat, LanguageModelFormat, TranslationFormat
from dnnperf.workloads.base import SupervisedTask, Task, Workload
from dnnperf.workloads.registry import REGISTRY, register

Batch = dict[str, torch.Tensor]

#: Image side and classes of the image models' data, tokens of the sequence models'.
IMAGE_SIZE = 32
VAE_IMAGE_SIZE = 64
CLASSES = 100
VOCABULARY = 4096
TOKENS = 128
#: Symbols a CTC tagger emits (blank included).
CTC_SYMBOLS = 64
#: Width of a caption's token embeddings the text-conditioned transformers read (8 tokens).
CAPTION_WIDTH = 64
#: A 1-D signal's samples (an image's rows laid end to end) and a series' features a step.
SIGNAL_LENGTH = IMAGE_SIZE * IMAGE_SIZE
SERIES_FEATURES = IMAGE_SIZE
#: ESM's alphabet: 33 tokens, the mask the last.
PROTEIN_TOKENS = 33
#: Diffusion steps of the noise schedule the denoisers are trained on.
DIFFUSION_STEPS = 1000
#: The prior's embedding width and its caption's tokens.
PRIOR_WIDTH = 256
PRIOR_TOKENS = 77


def _noised(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(noisy images, time steps, the noise): DDPM's forward process at random steps of a linear
    schedule, what a denoiser's training step draws."""
    steps = torch.randint(0, DIFFUSION_STEPS, (images.shape[0],), device=images.device)
    betas = torch.linspace(1e-4, 0.02, DIFFUSION_STEPS, device=images.device)
    kept = torch.cumprod(1 - betas, dim=0)[steps].view(-1, 1, 1, 1)
    noise = torch.randn_like(images)
    return kept.sqrt() * images + (1 - kept).sqrt() * noise, steps, noise


def _denoiser_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    noisy, steps, noise = _noised(batch["image"])
    return nn.functional.mse_loss(model(noisy, steps).sample, noise)


def _conditioned_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    noisy, steps, noise = _noised(batch["image"])
    return nn.functional.mse_loss(model(noisy, steps, encoder_hidden_states=_caption(noisy)).sample, noise)


def _class_conditioned_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    noisy, steps, noise = _noised(batch["image"])
    return nn.functional.mse_loss(model(noisy, timestep=steps, class_labels=batch["label"]).sample, noise)


def _vae_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    posterior = model.encode(batch["image"]).latent_dist
    reconstruction = model.decode(posterior.sample()).sample
    return nn.functional.mse_loss(reconstruction, batch["image"]) + 1e-6 * posterior.kl().mean()


def _vq_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    output = model(batch["image"])
    return nn.functional.mse_loss(output.sample, batch["image"]) + output.commit_loss.mean()


def _next_token_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    logits = model(batch["tokens"])
    return nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())


def _ctc_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Connectionist temporal classification: the model's per-position log-probabilities over the
    vocabulary's first ``CTC_SYMBOLS`` symbols (0 the blank) against label sequences of a quarter of
    the positions, taken from the targets."""
    log_probs = model(batch["tokens"])  # (positions, batch, symbols)
    positions, count, _ = log_probs.shape
    labels = batch["targets"][:, : positions // 4] % (CTC_SYMBOLS - 1) + 1
    return nn.functional.ctc_loss(
        log_probs,
        labels,
        torch.full((count,), positions, dtype=torch.long),
        torch.full((count,), labels.shape[1], dtype=torch.long),
    )


def _sequence_label_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """A label a sequence: the first target token's class among ``CLASSES``."""
    return nn.functional.cross_entropy(model(batch["tokens"]), batch["targets"][:, 0] % CLASSES)


def _classifier_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["image"]), batch["label"])


def _translation_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch["src"], batch["tgt_in"])


def _caption(images: torch.Tensor) -> torch.Tensor:
    """A text encoder's output the cross-attention reads: 8 tokens of ``CAPTION_WIDTH``."""
    return torch.randn(images.shape[0], 8, CAPTION_WIDTH, device=images.device)


def _pixart_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    noisy, steps, noise = _noised(batch["image"])
    conditions = {"resolution": None, "aspect_ratio": None}
    output = model(noisy, encoder_hidden_states=_caption(noisy), timestep=steps, added_cond_kwargs=conditions)
    return nn.functional.mse_loss(output.sample, noise)


def _sd3_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    noisy, steps, noise = _noised(batch["image"])
    pooled = torch.randn(noisy.shape[0], CAPTION_WIDTH, device=noisy.device)
    output = model(noisy, encoder_hidden_states=_caption(noisy), pooled_projections=pooled, timestep=steps)
    return nn.functional.mse_loss(output.sample, noise)


def _autoencoder_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["image"]).sample, batch["image"])


def _signal_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    noisy, steps, noise = _noised(batch["image"])
    signal, target = noisy.flatten(2), noise.flatten(2)  # each channel's rows end to end
    return nn.functional.mse_loss(model(signal, steps).sample, target)


def _masked(tokens: torch.Tensor, mask_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the tokens with 15% of the positions, at least one a sequence, set to ``mask_token``; those
    positions), as a masked language model trains."""
    masked = torch.rand(tokens.shape, device=tokens.device) < 0.15
    masked[:, 0] = True
    return torch.where(masked, torch.full_like(tokens, mask_token), tokens), masked


def _protein_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    tokens = batch["tokens"]
    inputs, masked = _masked(tokens, PROTEIN_TOKENS - 1)
    logits = model(inputs)["logits"]
    return nn.functional.cross_entropy(logits[masked], tokens[masked])


def _series_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    series = batch["image"].flatten(1, 2)  # (batch, channels x rows, columns): a step's features a row
    return nn.functional.mse_loss(model(series[:, :-1]), series[:, 1:])


def _controlled_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    noisy, steps, noise = _noised(batch["image"])
    return nn.functional.mse_loss(model(noisy, steps, _caption(noisy), batch["image"]), noise)


def _prior_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """DALL-E 2's prior: the image embedding (here an image's first ``PRIOR_WIDTH`` values) denoised
    from its noised self, given the caption's tokens and pooled embedding."""
    embedding = batch["image"].flatten(1)[:, :PRIOR_WIDTH]
    steps = torch.randint(0, DIFFUSION_STEPS, (embedding.shape[0],), device=embedding.device)
    noisy = embedding + torch.randn_like(embedding)
    caption = torch.randn(embedding.shape[0], PRIOR_TOKENS, PRIOR_WIDTH, device=embedding.device)
    output = model(noisy, steps, proj_embedding=caption.mean(1), encoder_hidden_states=caption)
    return nn.functional.mse_loss(output.predicted_image_embedding, embedding)


def _masked_token_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    tokens = batch["tokens"]
    inputs, masked = _masked(tokens, 0)
    logits = model(inputs)
    return nn.functional.cross_entropy(logits[masked], tokens[masked])


def _flow_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Rectified flow, as Flux is trained: the velocity from image to noise at a random time, predicted
    from the image's 2x2 patches as tokens, each with its (0, row, column) position."""
    images = batch["image"]
    b, c, h, w = images.shape
    patches = images.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, h * w // 4, c * 4)
    times = torch.rand(b, device=images.device)
    noise = torch.randn_like(patches)
    noisy = (1 - times.view(-1, 1, 1)) * patches + times.view(-1, 1, 1) * noise
    rows, columns = torch.meshgrid(torch.arange(h // 2), torch.arange(w // 2), indexing="ij")
    positions = torch.stack([torch.zeros_like(rows), rows, columns], dim=-1).flatten(0, 1).to(images)
    caption = _caption(images)
    output = model(
        noisy,
        encoder_hidden_states=caption,
        pooled_projections=caption.mean(1),
        timestep=times,
        img_ids=positions,
        txt_ids=torch.zeros(caption.shape[1], 3, device=images.device),
    )
    return nn.functional.mse_loss(output.sample, noise - patches)


def _aura_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    noisy, steps, noise = _noised(batch["image"])
    output = model(noisy, encoder_hidden_states=_caption(noisy), timestep=steps)
    return nn.functional.mse_loss(output.sample, noise)


class MLPClassifier(nn.Sequential):
    """A plain multilayer perceptron over the image's flattened pixels (a tabular model's shape)."""

    def __init__(self, widths: tuple[int, ...] = (1024, 1024, 512)) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        previous = 3 * IMAGE_SIZE * IMAGE_SIZE
        for width in widths:
            layers += [nn.Linear(previous, width), nn.ReLU()]
            previous = width
        super().__init__(*layers, nn.Linear(previous, CLASSES))


class WideAndDeep(nn.Module):
    """A wide linear model beside a deep MLP over the same features, their logits summed."""

    def __init__(self) -> None:
        super().__init__()
        features = 3 * IMAGE_SIZE * IMAGE_SIZE
        self.wide = nn.Linear(features, CLASSES)
        self.deep = nn.Sequential(
            nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 128),
            nn.ReLU(), nn.Linear(128, CLASSES),
        )  # fmt: skip

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = images.flatten(1)
        return self.wide(features) + self.deep(features)


class ActorCritic(nn.Module):
    """A policy and a value head on a shared MLP trunk (a reinforcement-learning agent's network)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Flatten(),
            nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, 256),
            nn.Tanh(),
            nn.Linear(256, 256),
            nn.Tanh(),
        )
        self.policy = nn.Linear(256, CLASSES)
        self.value = nn.Linear(256, 1)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.trunk(images)
        return self.policy(hidden), self.value(hidden).squeeze(-1)


class LatentAttention(nn.Module):
    """A few learned latents cross-attend to an image's patches, then attend among themselves
    (a Perceiver's shape): 8 latents of 256 dimensions over 64 patches."""

    def __init__(self, latents: int = 8, width: int = 256, blocks: int = 3) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, 4, stride=4)
        self.latents = nn.Parameter(torch.randn(latents, width) * 0.02)
        self.cross = nn.MultiheadAttention(width, 4, batch_first=True)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
            for _ in range(blocks)
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        queries = self.latents.expand(images.shape[0], -1, -1)
        latents = queries + self.cross(queries, tokens, tokens, need_weights=False)[0]
        for block in self.blocks:
            latents = block(latents)
        return self.head(latents.mean(1))


class ConvolutionalMLP(nn.Sequential):
    """Three convolution-and-pool stages, then an MLP over the flattened 4x4 maps."""

    def __init__(self) -> None:
        stages: list[nn.Module] = []
        channels = 3
        for width in (32, 64, 128):
            stages += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            channels = width
        super().__init__(
            *stages, nn.Flatten(), nn.Linear(128 * 4 * 4, 512), nn.ReLU(), nn.Linear(512, CLASSES)
        )


class TokenMixer(nn.Module):
    """An MLP-Mixer over 16 patches: each block mixes the 16 tokens (products of 16 rows' inner
    dimension) and then the 256 channels."""

    def __init__(self, width: int = 256, blocks: int = 4, tokens: int = 16) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, 8, stride=8)
        self.token_norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.token_mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(tokens, 64), nn.GELU(), nn.Linear(64, tokens)) for _ in range(blocks)
        )
        self.channel_norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.channel_mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(blocks)
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patches(images).flatten(2).transpose(1, 2)  # (batch, tokens, width)
        for token_norm, token_mlp, channel_norm, channel_mlp in zip(
            self.token_norms, self.token_mlps, self.channel_norms, self.channel_mlps, strict=True
        ):
            x = x + token_mlp(token_norm(x).transpose(1, 2)).transpose(1, 2)
            x = x + channel_mlp(channel_norm(x))
        return self.head(x.mean(1))


class CausalTransformerLM(nn.Module):
    """torch.nn's own transformer encoder layers under a causal mask: a small language model."""

    def __init__(self, width: int = 256, blocks: int = 4) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, width)
        self.positions = nn.Parameter(torch.randn(TOKENS, width) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True, norm_first=True)
            for _ in range(blocks)
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.positions[: tokens.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


class MLPAutoencoder(nn.Module):
    """An autoencoder of dense layers over the flattened image, through a 64-wide code."""

    def __init__(self) -> None:
        super().__init__()
        features = 3 * IMAGE_SIZE * IMAGE_SIZE
        self.encoder = nn.Sequential(nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, 64))
        self.decoder = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, features))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(images.flatten(1))).view_as(images)


class DeepRegressor(nn.Sequential):
    """Six hidden layers of 256 over the flattened image: a regression MLP."""

    def __init__(self) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        previous = 3 * IMAGE_SIZE * IMAGE_SIZE
        for _ in range(6):
            layers += [nn.Linear(previous, 256), nn.SiLU()]
            previous = 256
        super().__init__(*layers, nn.Linear(previous, 1))


class SiameseMLP(nn.Module):
    """One MLP embeds both halves of an image; a head scores the pair from their difference and
    product (a Siamese network's shape)."""

    def __init__(self) -> None:
        super().__init__()
        half = 3 * IMAGE_SIZE * IMAGE_SIZE // 2
        self.embed = nn.Sequential(nn.Linear(half, 512), nn.ReLU(), nn.Linear(512, 128))
        self.head = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        left, right = images.flatten(1).chunk(2, dim=1)
        a, b = self.embed(left), self.embed(right)
        return self.head(torch.cat([(a - b).abs(), a * b], dim=1)).squeeze(-1)


class MLPVariationalAutoencoder(nn.Module):
    """A variational autoencoder of dense layers: a 32-wide Gaussian code, sampled by reparameterising."""

    def __init__(self) -> None:
        super().__init__()
        features = 3 * IMAGE_SIZE * IMAGE_SIZE
        self.encoder = nn.Sequential(nn.Linear(features, 400), nn.ReLU())
        self.mean, self.log_variance = nn.Linear(400, 32), nn.Linear(400, 32)
        self.decoder = nn.Sequential(nn.Linear(32, 400), nn.ReLU(), nn.Linear(400, features))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.encoder(images.flatten(1))
        mean, log_variance = self.mean(hidden), self.log_variance(hidden)
        code = mean + torch.randn_like(mean) * (0.5 * log_variance).exp()
        return self.decoder(code).view_as(images), mean, log_variance


class CellLoop(nn.Module):
    """A recurrent cell (``nn.GRUCell``, ``nn.LSTMCell`` or ``nn.RNNCell``) stepped by hand over the
    image's 32 rows, then a classifier on the last state: a loop a user writes for a custom recurrence."""

    def __init__(self, cell: str, hidden: int = 256) -> None:
        super().__init__()
        features = 3 * IMAGE_SIZE
        self.lstm = cell == "lstm"
        cells = {"gru": nn.GRUCell, "lstm": nn.LSTMCell, "rnn": nn.RNNCell}
        self.cell = cells[cell](features, hidden)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        rows = images.permute(0, 2, 1, 3).flatten(2)  # (batch, image rows, channels x columns)
        state = rows.new_zeros(rows.shape[0], self.cell.hidden_size)
        memory = torch.zeros_like(state)
        for t in range(rows.shape[1]):
            if self.lstm:
                state, memory = self.cell(rows[:, t], (state, memory))
            else:
                state = self.cell(rows[:, t], state)
        return self.head(state)


class DeepSets(nn.Module):
    """A permutation-invariant set model: one MLP on each of the 64 patches of 4x4 pixels, summed, then
    an MLP on the sum."""

    def __init__(self) -> None:
        super().__init__()
        self.element = nn.Sequential(nn.Linear(48, 128), nn.ReLU(), nn.Linear(128, 128))
        self.pooled = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, CLASSES))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        patches = nn.functional.unfold(images, 4, stride=4).transpose(1, 2)  # (batch, 64, 48)
        return self.pooled(self.element(patches).sum(1))


class Convolutional1D(nn.Sequential):
    """1-D convolutions over a signal (the image's pixels laid end to end), pooled, then an MLP."""

    def __init__(self) -> None:
        layers: list[nn.Module] = []
        channels = 3
        for width in (32, 64, 128):
            layers += [nn.Conv1d(channels, width, 5, padding=2), nn.ReLU(), nn.MaxPool1d(4)]
            channels = width
        super().__init__(
            nn.Flatten(2), *layers, nn.Flatten(), nn.Linear(128 * 16, 256), nn.ReLU(), nn.Linear(256, CLASSES)
        )


class TransformerClassifier(nn.Module):
    """torch.nn's transformer encoder over 64 patch tokens and a class token, classified from it."""

    def __init__(self, width: int = 192, blocks: int = 4) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, 4, stride=4)
        self.token = nn.Parameter(torch.zeros(1, 1, width))
        self.positions = nn.Parameter(torch.randn(1, 65, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, 3, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.token.expand(len(images), -1, -1), tokens], dim=1) + self.positions
        return self.head(self.encoder(tokens)[:, 0])


class RecurrentRows(nn.Module):
    """A recurrent layer of torch.nn (``nn.GRU``, ``nn.RNN`` or ``nn.LSTM``) over the image's 32 rows,
    then a classifier on its last output."""

    def __init__(self, kind: str, hidden: int, layers: int, bidirectional: bool = False) -> None:
        super().__init__()
        recurrent = {"gru": nn.GRU, "rnn": nn.RNN, "lstm": nn.LSTM}[kind]
        self.recurrent = recurrent(
            3 * IMAGE_SIZE, hidden, layers, batch_first=True, bidirectional=bidirectional
        )
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        rows = images.permute(0, 2, 1, 3).flatten(2)  # (batch, image rows, channels x columns)
        return self.head(self.recurrent(rows)[0][:, -1])


class RecurrentLM(nn.Module):
    """A recurrent language model: token embeddings, an ``nn.GRU``, a head over the vocabulary."""

    def __init__(self, width: int = 128, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.recurrent = nn.GRU(width, hidden, batch_first=True)
        self.head = nn.Linear(hidden, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.recurrent(self.embed(tokens))[0])


class ConvolutionalRecurrent(nn.Module):
    """Convolutions and pools over the image, then an ``nn.GRU`` along its 8 columns of features,
    classified from the last (a CRNN's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.recurrent = nn.GRU(64 * IMAGE_SIZE // 4, 512, batch_first=True)
        self.head = nn.Linear(512, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        columns = self.features(images).permute(0, 3, 1, 2).flatten(2)  # (batch, columns, features)
        return self.head(self.recurrent(columns)[0][:, -1])


class EmbeddingMLP(nn.Sequential):
    """An MLP embedding an image into 128 dimensions, for a metric-learning loss."""

    def __init__(self) -> None:
        super().__init__(
            nn.Flatten(), nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, 512), nn.ReLU(), nn.Linear(512, 128)
        )


#: Images of the twenty-first set's larger networks (64x64: maps that leave a core's L2 early on).
LARGE_IMAGE_SIZE = 64


def _conv_bn(channels: int, width: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(channels, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]


class BatchNormVGG(nn.Sequential):
    """VGG-style stages of two 3x3 convolutions with batch norm, each ended by a 2x2 max pool."""

    def __init__(self) -> None:
        layers: list[nn.Module] = []
        channels = 3
        for width in (32, 64, 128):
            layers += [*_conv_bn(channels, width), *_conv_bn(width, width), nn.MaxPool2d(2)]
            channels = width
        super().__init__(
            *layers, nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, CLASSES)
        )


class DenseLayer(nn.Module):
    """A dense block's layer: BN-ReLU-1x1 convolution, BN-ReLU-3x3 convolution, concatenated to its input."""

    def __init__(self, channels: int, growth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth),
            nn.ReLU(),
            nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.body(x)], 1)


class DenseNet(nn.Sequential):
    """Three dense blocks of four layers (growth 16), joined by BN-1x1-average-pool transitions."""

    def __init__(self, growth: int = 16) -> None:
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, padding=1, bias=False)]
        channels = 32
        for block in range(3):
            for _ in range(4):
                layers.append(DenseLayer(channels, growth))
                channels += growth
            if block < 2:
                layers += [nn.BatchNorm2d(channels), nn.Conv2d(channels, channels // 2, 1), nn.AvgPool2d(2)]
                channels //= 2
        layers += [nn.BatchNorm2d(channels), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        super().__init__(*layers, nn.Linear(channels, CLASSES))


class GroupNormBlock(nn.Module):
    """A residual block of two 3x3 convolutions with group norm (8 groups)."""

    def __init__(self, channels: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, stride, 1, bias=False),
            nn.GroupNorm(8, width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, 1, 1, bias=False),
            nn.GroupNorm(8, width),
        )
        self.skip = (
            nn.Identity()
            if stride == 1 and channels == width
            else nn.Sequential(nn.Conv2d(channels, width, 1, stride, bias=False), nn.GroupNorm(8, width))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class GroupNormResNet(nn.Sequential):
    """A residual network with group norm in place of batch norm, on 64x64 images."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(3, 32, 3, padding=1, bias=False),
            nn.GroupNorm(8, 32),
            nn.ReLU(),
            GroupNormBlock(32, 32, 1),
            GroupNormBlock(32, 64, 2),
            GroupNormBlock(64, 64, 1),
            GroupNormBlock(64, 128, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, CLASSES),
        )


class InstanceNormAutoencoder(nn.Sequential):
    """A style-transfer-like encoder and decoder with instance norm, reconstructing 64x64 images."""

    def __init__(self) -> None:
        def down(channels: int, width: int) -> list[nn.Module]:
            return [nn.Conv2d(channels, width, 3, 2, 1), nn.InstanceNorm2d(width, affine=True), nn.ReLU()]

        def up(channels: int, width: int) -> list[nn.Module]:
            return [
                nn.Upsample(scale_factor=2),
                nn.Conv2d(channels, width, 3, 1, 1),
                nn.InstanceNorm2d(width, affine=True),
                nn.ReLU(),
            ]

        super().__init__(
            nn.Conv2d(3, 32, 3, 1, 1),
            nn.InstanceNorm2d(32, affine=True),
            nn.ReLU(),
            *down(32, 64),
            *down(64, 128),
            *up(128, 64),
            *up(64, 32),
            nn.Conv2d(32, 3, 3, 1, 1),
        )


class BatchNorm1DNet(nn.Sequential):
    """1-D convolutions with batch norm and max pools over a signal (the image's pixels end to end)."""

    def __init__(self) -> None:
        layers: list[nn.Module] = [nn.Flatten(2)]
        channels = 3
        for width in (32, 64, 128, 128):
            layers += [nn.Conv1d(channels, width, 7, padding=3, bias=False), nn.BatchNorm1d(width), nn.ReLU()]
            layers.append(nn.MaxPool1d(4))
            channels = width
        super().__init__(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(128, CLASSES))


class MixerBlock(nn.Module):
    """An MLP-Mixer block: layer norm, an MLP across tokens, layer norm, an MLP across channels."""

    def __init__(self, tokens: int, width: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.tokens = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channels = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class Mixer(nn.Module):
    """An MLP-Mixer over 64 patches of 4x4, 4 blocks of width 128."""

    def __init__(self, width: int = 128, blocks: int = 4) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, 4, stride=4)
        self.blocks = nn.Sequential(*[MixerBlock((IMAGE_SIZE // 4) ** 2, width) for _ in range(blocks)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.patches(images).flatten(2).transpose(1, 2))
        return self.head(self.norm(x).mean(1))


class PyramidPooling(nn.Module):
    """Average pools of 1, 2, 4 and 8 cells over a map, each through a 1x1 convolution with batch norm,
    brought back to the map's size and concatenated to it."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList(
            nn.Sequential(
                nn.AdaptiveAvgPool2d(cells),
                nn.Conv2d(channels, channels // 4, 1, bias=False),
                nn.BatchNorm2d(channels // 4),
                nn.ReLU(),
            )
            for cells in (1, 2, 4, 8)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        pooled = [nn.functional.interpolate(b(x), size=size, mode="nearest") for b in self.branches]
        return torch.cat([x, *pooled], 1)


class PyramidPoolingNet(nn.Sequential):
    """Two strided convolution stages with batch norm, then pyramid pooling and a classifier."""

    def __init__(self) -> None:
        super().__init__(
            *_conv_bn(3, 64, 2),
            *_conv_bn(64, 64),
            nn.AvgPool2d(3, stride=1, padding=1),
            *_conv_bn(64, 128, 2),
            PyramidPooling(128),
            *_conv_bn(256, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, CLASSES),
        )


class BatchNormMLP(nn.Sequential):
    """A tabular MLP: the image's pixels through four dense layers, each with batch norm."""

    def __init__(self) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        features = 3 * IMAGE_SIZE * IMAGE_SIZE
        for width in (1024, 1024, 512, 256):
            layers += [nn.Linear(features, width), nn.BatchNorm1d(width), nn.ReLU()]
            features = width
        super().__init__(*layers, nn.Linear(features, CLASSES))


class InceptionBlock(nn.Module):
    """Parallel 1x1, 3x3 and 5x5 convolutions and a 3x3 max pool, each with batch norm, concatenated."""

    def __init__(self, channels: int, width: int) -> None:
        super().__init__()

        def branch(*layers: nn.Module) -> nn.Sequential:
            return nn.Sequential(*layers, nn.BatchNorm2d(width), nn.ReLU())

        self.branches = nn.ModuleList(
            [
                branch(nn.Conv2d(channels, width, 1, bias=False)),
                branch(
                    nn.Conv2d(channels, width, 1, bias=False),
                    nn.Conv2d(width, width, 3, padding=1, bias=False),
                ),
                branch(
                    nn.Conv2d(channels, width, 1, bias=False),
                    nn.Conv2d(width, width, 5, padding=2, bias=False),
                ),
                branch(nn.MaxPool2d(3, stride=1, padding=1), nn.Conv2d(channels, width, 1, bias=False)),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([b(x) for b in self.branches], 1)


class InceptionNet(nn.Sequential):
    """A stem, then inception blocks with max pools between them."""

    def __init__(self) -> None:
        super().__init__(
            *_conv_bn(3, 32),
            InceptionBlock(32, 16),
            nn.MaxPool2d(2),
            InceptionBlock(64, 32),
            nn.MaxPool2d(2),
            InceptionBlock(128, 32),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, CLASSES),
        )


class GroupNormUNet(nn.Module):
    """A two-level U-Net with group norm (4 groups), max pools down and upsampling up, 64x64."""

    def __init__(self) -> None:
        super().__init__()

        def block(channels: int, width: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(channels, width, 3, padding=1),
                nn.GroupNorm(4, width),
                nn.SiLU(),
                nn.Conv2d(width, width, 3, padding=1),
                nn.GroupNorm(4, width),
                nn.SiLU(),
            )

        self.down1, self.down2, self.middle = block(3, 32), block(32, 64), block(64, 128)
        self.up2, self.up1 = block(128 + 64, 64), block(64 + 32, 32)
        self.out = nn.Conv2d(32, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.down1(x)
        second = self.down2(nn.functional.max_pool2d(first, 2))
        middle = self.middle(nn.functional.max_pool2d(second, 2))
        up = self.up2(torch.cat([nn.functional.interpolate(middle, scale_factor=2.0), second], 1))
        return self.out(self.up1(torch.cat([nn.functional.interpolate(up, scale_factor=2.0), first], 1)))


class ChannelsLastNorm(nn.LayerNorm):
    """Layer norm over the channels of an (N, C, H, W) map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtLikeBlock(nn.Module):
    """A depthwise 7x7 convolution, a layer norm over channels and an inverted MLP, residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 7, padding=3, groups=width),
            ChannelsLastNorm(width),
            nn.Conv2d(width, 4 * width, 1),
            nn.GELU(),
            nn.Conv2d(4 * width, width, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ConvNeXtLike(nn.Sequential):
    """A patchify stem, two stages of ConvNeXt-like blocks, layer-normed downsampling between."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(3, 48, 2, stride=2),
            ChannelsLastNorm(48),
            ConvNeXtLikeBlock(48),
            ConvNeXtLikeBlock(48),
            ChannelsLastNorm(48),
            nn.Conv2d(48, 96, 2, stride=2),
            ConvNeXtLikeBlock(96),
            ConvNeXtLikeBlock(96),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.LayerNorm(96),
            nn.Linear(96, CLASSES),
        )


class WideBlock(nn.Module):
    """A pre-activation residual block: BN-ReLU-3x3 convolution twice."""

    def __init__(self, channels: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, 1, 1, bias=False),
        )
        self.skip = (
            nn.Identity() if stride == 1 and channels == width else nn.Conv2d(channels, width, 1, stride)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.skip(x)


class WideResNet(nn.Sequential):
    """A wide residual network of three stages (widths 64, 128, 256), one block each."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            WideBlock(16, 64, 1),
            WideBlock(64, 128, 2),
            WideBlock(128, 256, 2),
            nn.BatchNorm2d(256),
            nn.ReLU(),
            nn.AvgPool2d(8),
            nn.Flatten(),
            nn.Linear(256, CLASSES),
        )


class DCGANDiscriminator(nn.Sequential):
    """A DCGAN discriminator: strided 4x4 convolutions with batch norm and leaky ReLUs, 64x64."""

    def __init__(self) -> None:
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 4, 2, 1), nn.LeakyReLU(0.2)]
        for channels in (32, 64, 128):
            layers += [nn.Conv2d(channels, 2 * channels, 4, 2, 1, bias=False), nn.BatchNorm2d(2 * channels)]
            layers.append(nn.LeakyReLU(0.2))
        super().__init__(*layers, nn.Conv2d(256, 1, 4), nn.Flatten(), nn.Flatten(0))


class FireModule(nn.Module):
    """SqueezeNet's fire module: a 1x1 squeeze, then 1x1 and 3x3 expands concatenated, with batch norm."""

    def __init__(self, channels: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(channels, squeeze, 1), nn.BatchNorm2d(squeeze), nn.ReLU())
        self.one = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.BatchNorm2d(expand), nn.ReLU())
        self.three = nn.Sequential(
            nn.Conv2d(squeeze, expand, 3, padding=1), nn.BatchNorm2d(expand), nn.ReLU()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze(x)
        return torch.cat([self.one(x), self.three(x)], 1)


class SqueezeNetLike(nn.Sequential):
    """SqueezeNet-like: a strided stem, fire modules, 3x3 max pools, 64x64."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(3, 64, 3, stride=2),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
            FireModule(64, 16, 64),
            FireModule(128, 16, 64),
            nn.MaxPool2d(3, 2),
            FireModule(128, 32, 128),
            FireModule(256, 32, 128),
            nn.Conv2d(256, CLASSES, 1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )


class ResidualNormMLP(nn.Module):
    """A residual MLP over the image's pixels: four blocks of layer norm and a 4x MLP, width 512."""

    def __init__(self, width: int = 512, blocks: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
            )
            for _ in range(blocks)
        )
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, CLASSES))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images.flatten(1))
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _conv3d_bn(channels: int, width: int) -> list[nn.Module]:
    return [nn.Conv3d(channels, width, 3, padding=1, bias=False), nn.BatchNorm3d(width), nn.ReLU()]


class VolumeNet(nn.Sequential):
    """3-D convolutions with 3-D batch norm and max pools over a volume (each image as 3 frames)."""

    def __init__(self) -> None:
        super().__init__(
            nn.Unflatten(1, (1, 3)),
            *_conv3d_bn(1, 16),
            nn.MaxPool3d((1, 2, 2)),
            *_conv3d_bn(16, 32),
            nn.MaxPool3d((1, 2, 2)),
            nn.AdaptiveAvgPool3d(1),
            nn.Flatten(),
            nn.Linear(32, CLASSES),
        )


class AlexNetLRN(nn.Sequential):
    """AlexNet-like: large strided convolutions, local response norms and 3x3 max pools, 64x64."""

    def __init__(self) -> None:
        super().__init__(
            nn.Conv2d(3, 48, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.LocalResponseNorm(5),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(48, 96, 3, padding=1),
            nn.ReLU(),
            nn.LocalResponseNorm(5),
            nn.MaxPool2d(3, 2),
            nn.Conv2d(96, 128, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(3, 2),
            nn.Flatten(),
            nn.Linear(128 * 3 * 3, 256),
            nn.ReLU(),
            nn.Linear(256, CLASSES),
        )


class RMSNormMLP(ResidualNormMLP):
    """The residual MLP with RMS norms in place of layer norms, width 384."""

    def __init__(self) -> None:
        super().__init__(width=384, blocks=4)
        for block in self.blocks:
            block[0] = nn.RMSNorm(384)
        self.head[0] = nn.RMSNorm(384)


def _shortcut(channels: int, width: int, stride: int) -> nn.Module:
    """A residual block's skip: the identity, or a strided 1x1 projection with batch norm where the shape
    changes."""
    if stride == 1 and channels == width:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(channels, width, 1, stride, bias=False), nn.BatchNorm2d(width))


class _ResidualBlock(nn.Module):
    """ReLU of a block's ``body`` plus its ``skip`` (the subclass makes both, body first)."""

    body: nn.Module
    skip: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class BasicBlock(_ResidualBlock):
    """ResNet's basic block: two 3x3 convolutions with batch norm, residual."""

    def __init__(self, channels: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(channels, width, stride),
            nn.Conv2d(width, width, 3, 1, 1, bias=False),
            nn.BatchNorm2d(width),
        )
        self.skip = _shortcut(channels, width, stride)


class BasicResNet(nn.Sequential):
    """A residual network of basic blocks (widths 32, 64, 128) with batch norm, 32x32."""

    def __init__(self) -> None:
        super().__init__(
            *_conv_bn(3, 32),
            BasicBlock(32, 32, 1),
            BasicBlock(32, 64, 2),
            BasicBlock(64, 128, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, CLASSES),
        )


class AvgPool1DNet(nn.Sequential):
    """1-D convolutions with batch norm and average pools over a signal."""

    def __init__(self) -> None:
        layers: list[nn.Module] = [nn.Flatten(2)]
        channels = 3
        for width in (48, 96, 192):
            layers += [nn.Conv1d(channels, width, 5, padding=2, bias=False), nn.BatchNorm1d(width), nn.GELU()]
            layers.append(nn.AvgPool1d(4))
            channels = width
        super().__init__(*layers, nn.Flatten(), nn.Linear(192 * 16, CLASSES))


class GroupNormConvNet(nn.Sequential):
    """Plain 3x3 convolutions with group norm (16 groups) and max pools, 64x64."""

    def __init__(self) -> None:
        layers: list[nn.Module] = []
        channels = 3
        for width in (32, 64, 128):
            layers += [
                nn.Conv2d(channels, width, 3, padding=1, bias=False),
                nn.GroupNorm(16, width),
                nn.ReLU(),
            ]
            layers.append(nn.MaxPool2d(2))
            channels = width
        super().__init__(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, CLASSES))


class PostNormTransformer(nn.Module):
    """torch.nn's transformer encoder with its layer norms after each block (post-norm), 64 patches."""

    def __init__(self, width: int = 128, blocks: int = 3) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, 4, stride=4)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.patches(images).flatten(2).transpose(1, 2)).mean(1))


class DepthwiseSeparableNet(nn.Sequential):
    """MobileNet-like: depthwise 3x3 and pointwise convolutions, each with batch norm and ReLU6, 64x64."""

    def __init__(self) -> None:
        def separable(channels: int, width: int, stride: int) -> list[nn.Module]:
            return [
                nn.Conv2d(channels, channels, 3, stride, 1, groups=channels, bias=False),
                nn.BatchNorm2d(channels),
                nn.ReLU6(),
                nn.Conv2d(channels, width, 1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU6(),
            ]

        super().__init__(
            nn.Conv2d(3, 32, 3, 2, 1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU6(),
            *separable(32, 64, 1),
            *separable(64, 128, 2),
            *separable(128, 128, 1),
            *separable(128, 256, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(256, CLASSES),
        )


class VolumeAvgNet(nn.Sequential):
    """3-D convolutions with 3-D batch norm and average pools over a volume (each image as 3 frames)."""

    def __init__(self) -> None:
        super().__init__(
            nn.Unflatten(1, (1, 3)),
            *_conv3d_bn(1, 24),
            nn.AvgPool3d((1, 2, 2)),
            *_conv3d_bn(24, 48),
            nn.AvgPool3d((3, 2, 2)),
            nn.Flatten(),
            nn.Linear(48 * 8 * 8, CLASSES),
        )


def _small_init(module: nn.Module, std: float = 0.02) -> None:
    """Every convolution's and linear layer's weights drawn from N(0, std^2), biases zero: the
    initializer_range transformers' models start from."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.normal_(layer.weight, 0.0, std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


class SqueezeExcite(nn.Module):
    """A channel gate from the image's mean: squeeze, excite, sigmoid."""

    def __init__(self, channels: int, reduction: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(channels, channels // reduction, 1)
        self.excite = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.excite(nn.functional.relu(self.squeeze(pooled))))


class InvertedResidualSE(nn.Module):
    """EfficientNet-like: six inverted residual blocks (expand 4x, depthwise 3x3, SiLU, squeeze-excite,
    project) with batch norm, weights from N(0, 0.02^2)."""

    def __init__(self, channels: int = 32, blocks: int = 6) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, 2, 1, bias=False), nn.BatchNorm2d(channels), nn.SiLU()
        )

        def block(hidden: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(channels, hidden, 1, bias=False),
                nn.BatchNorm2d(hidden),
                nn.SiLU(),
                nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=False),
                nn.BatchNorm2d(hidden),
                nn.SiLU(),
                SqueezeExcite(hidden, 8),
                nn.Conv2d(hidden, channels, 1, bias=False),
                nn.BatchNorm2d(channels),
            )

        self.blocks = nn.ModuleList(block(4 * channels) for _ in range(blocks))
        self.head = nn.Linear(channels, CLASSES)
        _small_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x.mean((2, 3)))


def _pre_norm_mlps(width: int, hidden: int, depth: int) -> nn.ModuleList:
    """``depth`` transformer MLPs: layer norm, a linear layer to ``hidden``, GELU, back to ``width``."""
    return nn.ModuleList(
        nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
        for _ in range(depth)
    )


class SharpAttention(nn.Module):
    """A pre-norm transformer encoder over 4x4 patches whose attention logits are scaled by 50 (not
    1/sqrt(head width)): most of a query's weights underflow."""

    def __init__(self, width: int = 128, depth: int = 3, heads: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        self.heads = heads
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(depth))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.mlps = _pre_norm_mlps(width, 4 * width, depth)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        rows, tokens, width = x.shape
        for norm, qkv, out, mlp in zip(self.norms, self.qkv, self.out, self.mlps, strict=True):
            shaped = qkv(norm(x)).view(rows, tokens, 3, self.heads, width // self.heads)
            q, k, v = shaped.permute(2, 0, 3, 1, 4)
            weights = (q @ k.transpose(-1, -2) * 50.0).softmax(-1)
            x = x + out((weights @ v).transpose(1, 2).reshape(rows, tokens, width))
            x = x + mlp(x)
        return self.head(x.mean(1))


class SteepGatedMLP(nn.Module):
    """Residual MLP blocks, each gated by a sigmoid of slope 200."""

    def __init__(self, width: int = 512, depth: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, width)
        self.values = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.gates = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x.flatten(1))
        for value, gate in zip(self.values, self.gates, strict=True):
            x = x + value(x) * torch.sigmoid(200.0 * gate(x))
        return self.head(x)


class DeepTanhMLP(nn.Sequential):
    """41 tanh layers of 256, the hidden ones' weights at a sixth of PyTorch's default scale: signal
    and gradient fade layer by layer."""

    def __init__(self, depth: int = 40) -> None:
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, 256), nn.Tanh()]
        for _ in range(depth):
            linear = nn.Linear(256, 256)
            with torch.no_grad():
                linear.weight.mul_(1 / 6)
            layers += [linear, nn.Tanh()]
        super().__init__(*layers, nn.Linear(256, CLASSES))


def _strided_features(width: int) -> nn.Sequential:
    """Two strided 3x3 convolutions with ReLUs, then a linear layer to ``width`` features."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, 2, 1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * (IMAGE_SIZE // 4) ** 2, width),
    )


class RadialBasisNet(nn.Module):
    """Convolutional features into 512 Gaussian radial basis units whose widths start narrow."""

    def __init__(self, units: int = 512, features: int = 64) -> None:
        super().__init__()
        self.features = _strided_features(features)
        self.centres = nn.Parameter(torch.randn(units, features))
        self.log_widths = nn.Parameter(torch.zeros(units))
        self.head = nn.Linear(units, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        distances = torch.cdist(self.features(x), self.centres).square()
        return self.head(torch.exp(-1.2 * distances / self.log_widths.exp().square()))


class DecayScan(nn.Module):
    """Three blocks over the image's rows as a sequence, each adding its values weighted by the running
    product of learned decays near 0.05 (torch.cumprod: a state-space model's decay, in closed form)."""

    def __init__(self, width: int = 256, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * IMAGE_SIZE, width)
        self.decays = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.values = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x.permute(0, 2, 1, 3).flatten(2))
        for decay, value in zip(self.decays, self.values, strict=True):
            x = x + value(x) * torch.cumprod(torch.sigmoid(decay(x) - 3.0), 1)
        return self.head(x.mean(1))


class SharpRouter(nn.Module):
    """A dense mixture of 16 MLP experts over 4x4 patches, weighted by a router's softmax at a
    temperature of 1/100 (nearly one expert a patch)."""

    def __init__(self, width: int = 96, experts: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        self.router = nn.Linear(width, experts)
        self.up = nn.Parameter(torch.randn(experts, width, 2 * width) * width**-0.5)
        self.down = nn.Parameter(torch.randn(experts, 2 * width, width) * (2 * width) ** -0.5)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        weights = (self.router(x) * 100.0).softmax(-1)
        hidden = nn.functional.gelu(torch.einsum("bnw,ewh->benh", x, self.up))
        experts = torch.einsum("benh,ehw->benw", hidden, self.down)
        return self.head((x + torch.einsum("bne,benw->bnw", weights, experts)).mean(1))


class ForgetfulRNN(nn.Module):
    """A gated recurrence stepped by hand over the image's 32 rows, h = f h + (1 - f) tanh(x), its
    forget gates near 0.05: the gradient that reaches the first rows is a product of many of them."""

    def __init__(self, width: int = 192) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * IMAGE_SIZE, width)
        self.gate = nn.Linear(2 * width, width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.embed(x.permute(0, 2, 1, 3).flatten(2))
        state = torch.zeros_like(rows[:, 0])
        for t in range(rows.shape[1]):
            forget = torch.sigmoid(self.gate(torch.cat([state, rows[:, t]], 1)) - 3.0)
            state = forget * state + (1 - forget) * torch.tanh(rows[:, t])
        return self.head(state)


class DeepSigmoidMLP(nn.Sequential):
    """49 sigmoid layers of 192 at PyTorch's default scale: each layer's gradient is at most a quarter
    of the next one's (the vanishing gradient of deep sigmoid networks)."""

    def __init__(self, depth: int = 48, width: int = 192) -> None:
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, width), nn.Sigmoid()]
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.Sigmoid()]
        super().__init__(*layers, nn.Linear(width, CLASSES))


class StickBreakingAttention(nn.Module):
    """Attention over 4x4 patches whose weights break a stick: each key takes a sigmoid's share of what
    the keys before it left (a running product of 1 - share), then an MLP."""

    def __init__(self, width: int = 128, depth: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        self.qk = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(depth))
        self.values = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.mlps = _pre_norm_mlps(width, 2 * width, depth)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        for qk, value, mlp in zip(self.qk, self.values, self.mlps, strict=True):
            q, k = qk(x).chunk(2, -1)
            share = torch.sigmoid(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5 + 1.0)
            left = torch.cumprod(1 - share, -1)
            weights = share * torch.cat([torch.ones_like(left[..., :1]), left[..., :-1]], -1)
            x = x + weights @ value(x)
            x = x + mlp(x)
        return self.head(x.mean(1))


class GumbelRouter(nn.Module):
    """A mixture of 8 MLP experts over 4x4 patches, mixed by a Gumbel-softmax at a temperature of 0.02."""

    def __init__(self, width: int = 128, experts: int = 8) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        self.router = nn.Linear(width, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            for _ in range(experts)
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        weights = nn.functional.gumbel_softmax(self.router(x), tau=0.02, dim=-1)
        mixed = (torch.stack([expert(x) for expert in self.experts], -1) * weights.unsqueeze(2)).sum(-1)
        return self.head((x + mixed).mean(1))


class GaussianKernelAttention(nn.Module):
    """Attention over 4x4 patches by a Gaussian kernel of the query-key distance, exp(-1.1 |q - k|^2),
    normalized over the keys."""

    def __init__(self, width: int = 128, depth: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.qk = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(depth))
        self.values = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        for norm, qk, value in zip(self.norms, self.qk, self.values, strict=True):
            q, k = qk(norm(x)).chunk(2, -1)
            kernel = torch.exp(-1.1 * torch.cdist(q, k).square())
            x = x + kernel @ value(x) / (kernel.sum(-1, keepdim=True) + 1e-6)
        return self.head(x.mean(1))


class LeakyIntegrator(nn.Module):
    """A leaky integrator stepped by hand, v = v / 4 + tanh(x), over 96 steps: the image's columns, its
    rows and its columns backwards."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.embed = nn.Linear(3 * IMAGE_SIZE, width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        columns = self.embed(x.permute(0, 3, 1, 2).flatten(2))
        rows = self.embed(x.permute(0, 2, 1, 3).flatten(2))
        steps = torch.cat([columns, rows, columns.flip(1)], 1)
        potential = torch.zeros_like(steps[:, 0])
        for t in range(steps.shape[1]):
            potential = potential / 4 + torch.tanh(steps[:, t])
        return self.head(potential)


class DistilledCNN(nn.Module):
    """A small CNN with a student and a teacher head: trained on the labels and on the teacher's
    distribution at a temperature of 0.005 (``distillation_loss``)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, 1, 1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, 1, 1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.teacher = nn.Linear(64 * (IMAGE_SIZE // 4) ** 2, CLASSES)
        self.student = nn.Linear(64 * (IMAGE_SIZE // 4) ** 2, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.student(self.body(x))


class DiscreteSurvival(nn.Module):
    """A discrete-time survival model: an MLP's hazards over 160 time bins, the survival to each bin
    exp(-cumulative hazard) (``survival_loss``)."""

    def __init__(self, bins: int = 160) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, 512), nn.ReLU(), nn.Linear(512, bins)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(-torch.cumsum(nn.functional.softplus(self.body(x)), 1))


class PreNormEncoder(nn.Module):
    """torch.nn's pre-norm transformer encoder (3 layers of 128) over 4x4 patches."""

    def __init__(self, width: int = 128, depth: int = 3) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        layer = nn.TransformerEncoderLayer(
            width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.patch(x).flatten(2).transpose(1, 2)).mean(1))


class ContrastiveTowers(nn.Module):
    """An image tower and a class tower (an embedding) into 8-dimensional unit vectors, trained by
    InfoNCE against every class at CLIP's largest logit scale, 100 (``_contrastive_loss``)."""

    def __init__(self) -> None:
        super().__init__()
        self.image = _strided_features(8)
        self.classes = nn.Embedding(CLASSES, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.image(x), dim=-1)


class DeepReLUSmallInit(nn.Sequential):
    """61 ReLU layers of 256, weights from N(0, 0.02^2): signal and gradient shrink layer by layer."""

    def __init__(self, depth: int = 60, width: int = 256) -> None:
        layers: list[nn.Module] = [nn.Flatten(), nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, width), nn.ReLU()]
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        super().__init__(*layers, nn.Linear(width, CLASSES))
        _small_init(self)


class _DecoderLayers(nn.Module):
    """A causal decoder's modules: token embedding, then a layer norm, a fused query-key-value
    projection and an output projection per layer, then the head; the subclass mixes the tokens."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(depth))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, VOCABULARY)


def _distances(length: int, device: torch.device) -> torch.Tensor:
    """Each query position's distance past each key position (negative for keys after it)."""
    position = torch.arange(length, device=device)
    return (position.view(-1, 1) - position.view(1, -1)).float()


class SteepALiBiDecoder(_DecoderLayers):
    """A causal decoder (two layers of 128) whose attention is biased by -2 times the distance to the
    key (ALiBi with a steep slope), no position embeddings."""

    def __init__(self, width: int = 128, depth: int = 2, heads: int = 4) -> None:
        super().__init__(width, depth)
        self.heads = heads

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        rows, length, width = x.shape
        distance = _distances(length, x.device)
        bias = torch.where(distance >= 0, -2.0 * distance, float("-inf"))
        for norm, qkv, out in zip(self.norms, self.qkv, self.out, strict=True):
            q, k, v = (
                qkv(norm(x)).view(rows, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
            )
            weights = (q @ k.transpose(-1, -2) / (width // self.heads) ** 0.5 + bias).softmax(-1)
            x = x + out((weights @ v).transpose(1, 2).reshape(rows, length, width))
        return self.head(x)


class SharpGRULanguageModel(nn.Module):
    """A GRU language model (256 wide) whose output softmax runs at a temperature of 0.01."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.rnn = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0]) / 0.01


class SinkhornAttention(nn.Module):
    """Attention over 4x4 patches whose weights, exp(logits / 0.01), are made doubly stochastic by five
    Sinkhorn iterations."""

    def __init__(self, width: int = 128, depth: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        self.qk = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(depth))
        self.values = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        for qk, value in zip(self.qk, self.values, strict=True):
            q, k = qk(x).chunk(2, -1)
            logits = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
            weights = torch.exp((logits - logits.amax((1, 2), keepdim=True)) / 0.01)
            for _ in range(5):
                weights = weights / weights.sum(-1, keepdim=True)
                weights = weights / weights.sum(-2, keepdim=True)
            x = x + weights @ value(x)
        return self.head(x.mean(1))


class MixtureDensity(nn.Module):
    """A mixture density network: a CNN's 32 Gaussian components over a scalar target, their widths
    starting near 0.01, the likelihood summed from the components' densities (``_mixture_loss``)."""

    def __init__(self, components: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(_strided_features(256), nn.ReLU())
        self.logits = nn.Linear(256, components)
        self.means = nn.Linear(256, components)
        self.log_widths = nn.Linear(256, components)
        nn.init.constant_(self.log_widths.bias, -4.6)
        nn.init.uniform_(self.means.bias, 0.0, 1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.body(x)
        return self.logits(features).softmax(-1), self.means(features), self.log_widths(features).exp()


class RowGRU(nn.Module):
    """A GRU (256 wide) over the image's rows, classified from its last state."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.rnn = nn.GRU(3 * IMAGE_SIZE, width, batch_first=True)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x.permute(0, 2, 1, 3).flatten(2))[0][:, -1])


class NoisyOrPatches(nn.Module):
    """Multiple-instance learning: each 4x2 patch's class probabilities (sigmoids), a class present where
    any patch says so, by noisy-OR over the 128 patches (1 minus the product of 1 - p)."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.patch = nn.Sequential(
            nn.Conv2d(3, width, (4, 2), (4, 2)), nn.ReLU(), nn.Conv2d(width, width, 1), nn.ReLU()
        )
        self.scores = nn.Conv2d(width, CLASSES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        absent = 1 - torch.sigmoid(self.scores(self.patch(x)).flatten(2))
        present = 1 - torch.prod(absent, 2)
        return torch.logit(present.clamp(1e-6, 1 - 1e-6))


class DecayedRetention(_DecoderLayers):
    """A retention decoder (two layers of 128, RetNet's form): causal attention without softmax, each
    head's scores weighted by gamma^(n - m), its decays 0.1, 0.2, 0.4 and 0.8."""

    def __init__(self, width: int = 128, depth: int = 2) -> None:
        super().__init__(width, depth)
        self.decays = (0.1, 0.2, 0.4, 0.8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        rows, length, width = x.shape
        heads = len(self.decays)
        distance = _distances(length, x.device)
        gamma = torch.tensor(self.decays, device=x.device).view(-1, 1, 1)
        decay = torch.where(distance >= 0, gamma ** distance.clamp(min=0), 0.0)
        for norm, qkv, out in zip(self.norms, self.qkv, self.out, strict=True):
            q, k, v = qkv(norm(x)).view(rows, length, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2) / (width // heads) ** 0.5 * decay
            x = x + out((scores @ v).transpose(1, 2).reshape(rows, length, width))
        return self.head(x)


def _conv_bn_relu(width: int, out: int, first_stride: int) -> nn.Sequential:
    """Two 3x3 convolutions from the image (the first of stride ``first_stride``, the second 2), each
    with batch norm and ReLU."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, first_stride, 1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, out, 3, 2, 1),
        nn.BatchNorm2d(out),
        nn.ReLU(),
    )


class LogSumExpPooling(nn.Module):
    """A CNN whose class maps are pooled over the image by log-sum-exp at a sharpness of 100 (nearly the
    maximum, as weakly supervised localisation pools)."""

    def __init__(self, sharpness: float = 100.0) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn_relu(64, 128, first_stride=1), nn.Conv2d(128, CLASSES, 1))
        self.sharpness = sharpness

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maps = self.body(x).flatten(2)
        return torch.logsumexp(self.sharpness * maps, 2) / self.sharpness


class GeneralizedMeanPooling(nn.Module):
    """A CNN (batch norm, ReLU) whose features are pooled by their generalized mean of power 30 (GeM,
    image retrieval's pooling, steeper than its usual 3), then a cosine classifier at a scale of 30."""

    def __init__(self, power: float = 30.0) -> None:
        super().__init__()
        self.body = _conv_bn_relu(64, 256, first_stride=2)
        self.power = power
        self.classes = nn.Parameter(torch.randn(CLASSES, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.body(x).clamp(min=1e-6).pow(self.power).mean((2, 3)).pow(1 / self.power)
        return 30.0 * nn.functional.normalize(pooled, dim=1) @ nn.functional.normalize(self.classes, dim=1).T


class SharpMultiLabel(nn.Module):
    """A CNN tagging each image with 100 independent labels (sigmoid cross-entropy), its logits
    scaled by 1000, a temperature of 0.001 (``multi_label_loss``)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = _strided_features(256)
        self.head = nn.Linear(256, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1000.0 * self.head(torch.relu(self.features(x)))


class SpikingMLP(nn.Module):
    """A spiking MLP (two layers of 256 leaky neurons, membrane decay 0.5) over 16 time steps of the
    same image, spikes through a surrogate gradient exp(-80 |v - 1|) (``_SpikeFunction``)."""

    def __init__(self, width: int = 256, steps: int = 16) -> None:
        super().__init__()
        self.first = nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, width)
        self.second = nn.Linear(width, width)
        self.head = nn.Linear(width, CLASSES)
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        current = self.first(x.flatten(1))
        first = torch.zeros_like(current)
        second = torch.zeros_like(current)
        counts = torch.zeros_like(current)
        for _ in range(self.steps):
            first = 0.5 * first + current
            spikes = _SpikeFunction.apply(first)
            first = first - spikes
            second = 0.5 * second + self.second(spikes)
            out = _SpikeFunction.apply(second)
            second = second - out
            counts = counts + out
        return self.head(counts / self.steps)


class _SpikeFunction(torch.autograd.Function):
    """A spike where the membrane passes 1; its gradient the surrogate exp(-80 |v - 1|)."""

    @staticmethod
    def forward(ctx: Any, membrane: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(membrane)
        return (membrane >= 1.0).to(membrane.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (membrane,) = ctx.saved_tensors
        return grad * torch.exp(-80.0 * (membrane - 1.0).abs())


class LayerScaleConvNet(nn.Module):
    """ConvNeXt-like blocks (depthwise 7x7, layer norm, MLP of 4x) over 4x4 patches, each branch scaled
    by a layer scale initialised at 1e-6."""

    def __init__(self, width: int = 96, depth: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        self.mixers = nn.ModuleList(nn.Conv2d(width, width, 7, 1, 3, groups=width) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.scales = nn.ParameterList(nn.Parameter(torch.full((width,), 1e-6)) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x)
        for mixer, norm, mlp, scale in zip(self.mixers, self.norms, self.mlps, self.scales, strict=True):
            branch = mlp(norm(mixer(x).permute(0, 2, 3, 1)))
            x = x + (scale * branch).permute(0, 3, 1, 2)
        return self.head(x.mean((2, 3)))


class ConvMixer(nn.Module):
    """ConvMixer: 2x2 patches, then depthwise 5x5 and pointwise convolutions, each with GELU and batch
    norm, the depthwise one residual."""

    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()

        def block(conv: nn.Module) -> nn.Sequential:
            return nn.Sequential(conv, nn.GELU(), nn.BatchNorm2d(width))

        self.patch = block(nn.Conv2d(3, width, 2, 2))
        self.depthwise = nn.ModuleList(
            block(nn.Conv2d(width, width, 5, 1, 2, groups=width)) for _ in range(depth)
        )
        self.pointwise = nn.ModuleList(block(nn.Conv2d(width, width, 1)) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x)
        for depthwise, pointwise in zip(self.depthwise, self.pointwise, strict=True):
            x = pointwise(x + depthwise(x))
        return self.head(x.mean((2, 3)))


class Bottleneck(_ResidualBlock):
    """ResNet's bottleneck: 1x1 down to a quarter, 3x3 (strided), 1x1 back up, batch norm after each,
    residual (projected where the shape changes)."""

    def __init__(self, channels: int, width: int, stride: int) -> None:
        super().__init__()
        inner = width // 4
        self.body = nn.Sequential(
            nn.Conv2d(channels, inner, 1, bias=False),
            nn.BatchNorm2d(inner),
            nn.ReLU(inplace=True),
            nn.Conv2d(inner, inner, 3, stride, 1, bias=False),
            nn.BatchNorm2d(inner),
            nn.ReLU(inplace=True),
            nn.Conv2d(inner, width, 1, bias=False),
            nn.BatchNorm2d(width),
        )
        self.skip = _shortcut(channels, width, stride)


class BottleneckResNet(nn.Sequential):
    """A stem (3x3, batch norm, ReLU, 3x3 max pool of stride 2), then three stages of two bottlenecks
    (widths 128, 256, 512), global average pool, linear: ResNet-50's shape, shallower."""

    def __init__(self) -> None:
        layers: list[nn.Module] = [*_conv_bn(3, 64), nn.MaxPool2d(3, 2, 1)]
        channels = 64
        for width, stride in ((128, 1), (256, 2), (512, 2)):
            layers += [Bottleneck(channels, width, stride), Bottleneck(width, width, 1)]
            channels = width
        super().__init__(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, CLASSES))


class HardSwishInverted(nn.Module):
    """MobileNetV3's block: 1x1 expansion, depthwise 3x3 or 5x5, squeeze-excite with a hard sigmoid,
    1x1 projection; hard-swish activations, batch norm, residual where the shape allows."""

    def __init__(self, channels: int, width: int, kernel: int, stride: int) -> None:
        super().__init__()
        hidden = 4 * channels
        self.expand = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish()
        )
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.Hardswish(),
        )
        self.excite = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Conv2d(hidden, hidden // 4, 1),
            nn.ReLU(),
            nn.Conv2d(hidden // 4, hidden, 1),
            nn.Hardsigmoid(),
        )
        self.project = nn.Sequential(nn.Conv2d(hidden, width, 1, bias=False), nn.BatchNorm2d(width))
        self.residual = stride == 1 and channels == width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.depthwise(self.expand(x))
        out = self.project(hidden * self.excite(hidden))
        return x + out if self.residual else out


class HardSwishMobileNet(nn.Sequential):
    """A MobileNetV3-like network: a strided 3x3 stem and six hard-swish inverted residuals."""

    def __init__(self) -> None:
        blocks = (
            (16, 24, 3, 2),
            (24, 24, 3, 1),
            (24, 40, 5, 2),
            (40, 40, 5, 1),
            (40, 80, 3, 2),
            (80, 80, 3, 1),
        )
        super().__init__(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False),
            nn.BatchNorm2d(16),
            nn.Hardswish(),
            *(HardSwishInverted(*block) for block in blocks),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(80, CLASSES),
        )


class ClassTokenViT(nn.Module):
    """A ViT: 4x4 patches, a class token and learned positions, six of torch.nn's pre-norm encoder
    layers (192 wide, GELU), classified from the class token."""

    def __init__(self, width: int = 192, depth: int = 6) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 4, 4)
        self.token = nn.Parameter(torch.zeros(1, 1, width))
        self.positions = nn.Parameter(torch.randn(1, (IMAGE_SIZE // 4) ** 2 + 1, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, 3, 4 * width, 0.0, "gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.token.expand(x.shape[0], -1, -1), x], 1) + self.positions
        return self.head(self.norm(self.encoder(x))[:, 0])


class TiedGPT(nn.Module):
    """A GPT: token and position embeddings, four blocks of nn.MultiheadAttention under a causal mask
    and a GELU MLP, pre-norm, dropout 0.1, the head tied to the token embedding."""

    def __init__(self, width: int = 256, depth: int = 4) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCABULARY, width)
        self.positions = nn.Embedding(TOKENS, width)
        self.attention_norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.attentions = nn.ModuleList(
            nn.MultiheadAttention(width, 4, dropout=0.1, batch_first=True) for _ in range(depth)
        )
        self.mlp_norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(
                nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(0.1)
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(width)
        self.dropout = nn.Dropout(0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.dropout(self.tokens(tokens) + self.positions(torch.arange(length, device=tokens.device)))
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        for attention_norm, attention, mlp_norm, mlp in zip(
            self.attention_norms, self.attentions, self.mlp_norms, self.mlps, strict=True
        ):
            h = attention_norm(x)
            x = x + attention(h, h, h, attn_mask=mask, need_weights=False)[0]
            x = x + mlp(mlp_norm(x))
        return self.norm(x) @ self.tokens.weight.T


class BiLSTMTagger(nn.Module):
    """A tagger: embeddings, a two-layer bidirectional LSTM (128 a direction), a linear layer a token."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.rnn = nn.LSTM(width, width, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(tokens))[0])


class PyramidClassifier(nn.Module):
    """A feature pyramid: three strided stages (batch norm, ReLU), lateral 1x1 convolutions, each level
    upsampled (nearest) and added to the one below, the finest smoothed by a 3x3 and pooled."""

    def __init__(self, width: int = 96) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(*_conv_bn(channels, out, 2)) for channels, out in ((3, 48), (48, 96), (96, 192))
        )
        self.laterals = nn.ModuleList(nn.Conv2d(out, width, 1) for out in (48, 96, 192))
        self.smooth = nn.Conv2d(width, width, 3, 1, 1)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        levels = []
        for stage in self.stages:
            x = stage(x)
            levels.append(x)
        top = self.laterals[-1](levels[-1])
        for lateral, level in zip(self.laterals[-2::-1], levels[-2::-1], strict=True):
            top = lateral(level) + nn.functional.interpolate(top, size=level.shape[-2:], mode="nearest")
        return self.head(self.smooth(top).mean((2, 3)))


def _discriminator_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # Real or not: whether the image is of an even class, a stand-in for a GAN's labels.
    return nn.functional.binary_cross_entropy_with_logits(model(batch["image"]), (batch["label"] % 2).float())


def _triplet_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # Anchor, a mirrored view of it (positive) and another image of the batch (negative).
    images = batch["image"]
    anchor, positive, negative = model(images), model(images.flip(3)), model(images.roll(1, 0))
    return nn.TripletMarginLoss(margin=1.0)(anchor, positive, negative)


def _regression_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["image"]).squeeze(-1), batch["label"].float() / CLASSES)


def _pair_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # Whether the two halves come from an image of an even class: a stand-in for "same or not".
    return nn.functional.binary_cross_entropy_with_logits(model(batch["image"]), (batch["label"] % 2).float())


def _variational_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    reconstruction, mean, log_variance = model(batch["image"])
    divergence = -0.5 * (1 + log_variance - mean.pow(2) - log_variance.exp()).sum(1).mean()
    return nn.functional.mse_loss(reconstruction, batch["image"]) + 1e-3 * divergence


def _actor_critic_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # Behaviour cloning of the labelled action, and the value regressed on a return made of the label.
    logits, value = model(batch["image"])
    target = batch["label"].float() / CLASSES
    return nn.functional.cross_entropy(logits, batch["label"]) + nn.functional.mse_loss(value, target)


def _reconstruction_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["image"]), batch["image"])


def _distillation_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # The labels' cross-entropy, and the student's distribution against the teacher's, both at 0.005.
    features = model.body(batch["image"])
    student, teacher = model.student(features), model.teacher(features).detach()
    soft = nn.functional.kl_div(
        nn.functional.log_softmax(student / 0.005, -1),
        nn.functional.softmax(teacher / 0.005, -1),
        reduction="batchmean",
    )
    return nn.functional.cross_entropy(student, batch["label"]) + 1e-3 * soft


def _survival_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # The event falls in the label's bin: survival to that bin, then the hazard within it.
    survival = model(batch["image"])
    event = batch["label"].view(-1, 1)
    reached = survival.gather(1, event).clamp_min(1e-30)
    hazard = 1 - survival.gather(1, event + 1) / reached
    return -(reached.log() + hazard.clamp_min(1e-6).log()).mean()


def _contrastive_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # Each image against every class's embedding, at a logit scale of 100.
    classes = nn.functional.normalize(model.classes.weight, dim=-1)
    return nn.functional.cross_entropy(100.0 * model(batch["image"]) @ classes.T, batch["label"])


def _multi_label_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Sigmoid cross-entropy against the image's label and the next one as its two tags."""
    labels = batch["label"]
    tags = torch.zeros(labels.shape[0], CLASSES, device=labels.device)
    tags[torch.arange(labels.shape[0]), labels] = 1.0
    tags[torch.arange(labels.shape[0]), (labels + 1) % CLASSES] = 1.0
    return nn.functional.binary_cross_entropy_with_logits(model(batch["image"]), tags)


def _bucket_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """A ranker's loss: each sequence's last target token's bucket (of CLASSES) as its label."""
    return nn.functional.cross_entropy(model(batch["tokens"]), batch["targets"][:, -1] % CLASSES)


def _coordinate_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """A coordinate network's loss: each pixel's predicted colour against the image's."""
    return nn.functional.mse_loss(model(batch["image"]), batch["image"].flatten(2).transpose(1, 2))


def _flow_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """A normalizing flow's loss: the model returns the batch's negative log-likelihood itself."""
    return model(batch["image"])


def _autoencoder_mse_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """An image-to-image network's loss: its output against the image."""
    return nn.functional.mse_loss(model(batch["image"]), batch["image"])


def _mixture_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    # The label as a scalar in [0, 1): its likelihood under the mixture.
    weights, means, widths = model(batch["image"])
    target = (batch["label"].float() / CLASSES).view(-1, 1)
    density = weights * torch.exp(-0.5 * ((target - means) / widths).square()) / widths
    return -(density.sum(-1) + 1e-30).log().mean()


@dataclass(frozen=True)
class OwnModel:
    """One model: how to build it, its loss, its data and its optimizer's recipe."""

    name: str
    summary: str
    build: Callable[[], nn.Module]
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    data: DataFormat
    adam: bool


def _unet() -> nn.Module:
    from diffusers import UNet2DModel

    return UNet2DModel(
        sample_size=IMAGE_SIZE,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64, 64),
        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
        layers_per_block=1,
        norm_num_groups=8,
    )


def _conditioned_unet() -> nn.Module:
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=IMAGE_SIZE,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        layers_per_block=1,
        norm_num_groups=8,
        cross_attention_dim=CAPTION_WIDTH,
        attention_head_dim=8,
    )


def _dit() -> nn.Module:
    from diffusers import DiTTransformer2DModel

    return DiTTransformer2DModel(
        num_attention_heads=4,
        attention_head_dim=32,
        in_channels=3,
        out_channels=3,
        num_layers=4,
        sample_size=IMAGE_SIZE,
        patch_size=2,
        num_embeds_ada_norm=CLASSES,
    )


#: The two convolutional autoencoders' shared shape: two stages of 32 and 64 channels, 4 latent channels.
AUTOENCODER = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
    "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"),
    "block_out_channels": (32, 64),
    "layers_per_block": 1,
    "latent_channels": 4,
    "norm_num_groups": 8,
    "sample_size": VAE_IMAGE_SIZE,
}


def _vae() -> nn.Module:
    from diffusers import AutoencoderKL

    return AutoencoderKL(**AUTOENCODER)


def _vq() -> nn.Module:
    from diffusers import VQModel

    return VQModel(**AUTOENCODER, num_vq_embeddings=256)


def _decoder() -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=VOCABULARY,
        max_seq_len=TOKENS,
        attn_layers=Decoder(dim=256, depth=4, heads=4, rotary_pos_emb=True, ff_glu=True),
    )


def _vit() -> nn.Module:
    from x_transformers import Encoder, ViTransformerWrapper

    return ViTransformerWrapper(
        image_size=VAE_IMAGE_SIZE,
        patch_size=8,
        num_classes=CLASSES,
        attn_layers=Encoder(dim=256, depth=4, heads=4),
    )


def _encoder_decoder() -> nn.Module:
    from x_transformers import XTransformer

    return XTransformer(
        dim=256,
        enc_num_tokens=VOCABULARY,
        enc_depth=2,
        enc_heads=4,
        enc_max_seq_len=TOKENS,
        dec_num_tokens=VOCABULARY,
        dec_depth=2,
        dec_heads=4,
        dec_max_seq_len=TOKENS,
    )


def _pixart() -> nn.Module:
    from diffusers import PixArtTransformer2DModel

    return PixArtTransformer2DModel(
        num_attention_heads=4,
        attention_head_dim=32,
        in_channels=3,
        out_channels=3,
        num_layers=4,
        cross_attention_dim=128,
        caption_channels=CAPTION_WIDTH,
        sample_size=IMAGE_SIZE,
        patch_size=2,
    )


def _sd3() -> nn.Module:
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=IMAGE_SIZE,
        patch_size=2,
        in_channels=3,
        out_channels=3,
        num_layers=4,
        attention_head_dim=32,
        num_attention_heads=4,
        joint_attention_dim=CAPTION_WIDTH,
        caption_projection_dim=128,
        pooled_projection_dim=CAPTION_WIDTH,
        pos_embed_max_size=IMAGE_SIZE,
    )


def _tiny_autoencoder() -> nn.Module:
    from diffusers import AutoencoderTiny

    return AutoencoderTiny(
        encoder_block_out_channels=(32, 32, 32, 32),
        decoder_block_out_channels=(32, 32, 32, 32),
        num_encoder_blocks=(1, 2, 2, 2),
        num_decoder_blocks=(2, 2, 2, 1),
    )


def _unet_1d() -> nn.Module:
    from diffusers import UNet1DModel

    # The time step's Fourier features (twice the first block's width) join the signal's channels.
    return UNet1DModel(
        sample_size=SIGNAL_LENGTH,
        in_channels=3,
        out_channels=3,
        extra_in_channels=64,
        block_out_channels=(32, 32, 64),
    )


def _llama3() -> nn.Module:
    from torchtune.models.llama3 import llama3

    return llama3(
        vocab_size=VOCABULARY, num_layers=4, num_heads=4, num_kv_heads=2, embed_dim=256, max_seq_len=TOKENS
    )


def _qwen2() -> nn.Module:
    from torchtune.models.qwen2 import qwen2

    return qwen2(
        vocab_size=VOCABULARY,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        embed_dim=256,
        intermediate_dim=704,
        max_seq_len=TOKENS,
    )


def _esm2() -> nn.Module:
    from esm.model.esm2 import ESM2

    return ESM2(num_layers=6, embed_dim=320, attention_heads=20, alphabet="ESM-1b")


class ControlledUNet(nn.Module):
    """A ControlNet trained beside a frozen denoising U-Net, as ControlNet is trained: the control
    network reads the clean image as its condition and adds its features to the U-Net's skips."""

    def __init__(self) -> None:
        super().__init__()
        from diffusers import ControlNetModel

        self.unet = _conditioned_unet().requires_grad_(False)
        self.controlnet = ControlNetModel.from_unet(self.unet, conditioning_embedding_out_channels=(16,))

    def forward(
        self, noisy: torch.Tensor, steps: torch.Tensor, caption: torch.Tensor, condition: torch.Tensor
    ) -> torch.Tensor:
        skips, middle = self.controlnet(
            noisy, steps, encoder_hidden_states=caption, controlnet_cond=condition, return_dict=False
        )
        return self.unet(
            noisy,
            steps,
            encoder_hidden_states=caption,
            down_block_additional_residuals=skips,
            mid_block_additional_residual=middle,
        ).sample


def _prior() -> nn.Module:
    from diffusers import PriorTransformer

    return PriorTransformer(
        num_attention_heads=8,
        attention_head_dim=32,
        num_layers=4,
        embedding_dim=PRIOR_WIDTH,
        num_embeddings=PRIOR_TOKENS,
    )


def _gemma() -> nn.Module:
    from torchtune.models.gemma import gemma

    return gemma(
        vocab_size=VOCABULARY,
        num_layers=4,
        num_heads=8,
        head_dim=16,
        num_kv_heads=1,
        embed_dim=256,
        intermediate_dim=1024,
        max_seq_len=TOKENS,
    )


def _narrow_encoder() -> nn.Module:
    from x_transformers import Encoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=VOCABULARY,
        max_seq_len=TOKENS,
        attn_layers=Encoder(dim=128, depth=4, heads=16, attn_dim_head=8, attn_flash=True),
    )


def _flux() -> nn.Module:
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(
        in_channels=12,
        num_layers=2,
        num_single_layers=4,
        attention_head_dim=16,
        num_attention_heads=8,
        joint_attention_dim=CAPTION_WIDTH,
        pooled_projection_dim=CAPTION_WIDTH,
        axes_dims_rope=(4, 6, 6),
    )


def _aura_flow() -> nn.Module:
    from diffusers import AuraFlowTransformer2DModel

    return AuraFlowTransformer2DModel(
        sample_size=IMAGE_SIZE,
        in_channels=3,
        out_channels=3,
        num_mmdit_layers=2,
        num_single_dit_layers=4,
        attention_head_dim=8,
        num_attention_heads=16,
        joint_attention_dim=CAPTION_WIDTH,
        caption_projection_dim=128,
        pos_embed_max_size=256,
    )


def _narrow_decoder() -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=VOCABULARY,
        max_seq_len=TOKENS,
        attn_layers=Decoder(dim=256, depth=4, heads=16, attn_dim_head=16, attn_flash=True, ff_glu=True),
    )


def _continuous() -> nn.Module:
    from x_transformers import ContinuousTransformerWrapper, Encoder

    return ContinuousTransformerWrapper(
        dim_in=SERIES_FEATURES,
        dim_out=SERIES_FEATURES,
        max_seq_len=TOKENS,
        attn_layers=Encoder(dim=256, depth=4, heads=8, attn_flash=True),
    )


class TemporalConvNet(nn.Module):
    """A temporal convolutional network over an image's rows laid end to end: residual blocks of two
    dilated causal 1-D convolutions (kernel 3, dilations 1 to 16, weight norm off), ReLU, the last
    step classified."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.inlet = nn.Conv1d(3, width, 1)
        self.dilations = (1, 2, 4, 8, 16)
        self.convs = nn.ModuleList(
            nn.ModuleList(nn.Conv1d(width, width, 3, dilation=d) for _ in range(2)) for d in self.dilations
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.inlet(image.flatten(2))
        for dilation, (first, second) in zip(self.dilations, self.convs, strict=True):
            pad = (2 * dilation, 0)  # causal: only the past
            y = torch.relu(first(nn.functional.pad(x, pad)))
            x = torch.relu(x + second(nn.functional.pad(y, pad)))
        return self.head(x[:, :, -1])


class PointNetClassifier(nn.Module):
    """PointNet: an image's pixels as 1,024 points of 3 coordinates, a shared MLP of 1x1 1-D
    convolutions with batch norm (64, 128, 512), a max over the points, an MLP head."""

    def __init__(self) -> None:
        super().__init__()
        widths = (3, 64, 128, 512)
        self.shared = nn.Sequential(
            *[
                layer
                for a, b in itertools.pairwise(widths)
                for layer in (nn.Conv1d(a, b, 1), nn.BatchNorm1d(b), nn.ReLU())
            ]
        )
        self.head = nn.Sequential(
            nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, CLASSES)
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.shared(image.flatten(2)).amax(2))


class SparseFeatureRanker(nn.Module):
    """A recommender in DLRM's shape: each sequence's tokens as ids of 8 sparse features pooled by
    EmbeddingBag (sum), a dense MLP over the first 16 ids scaled, the features' pairwise dot products,
    a top MLP scoring each of the sequence's next tokens' bucket."""

    def __init__(self, width: int = 32, features: int = 8) -> None:
        super().__init__()
        self.features = features
        self.bags = nn.ModuleList(nn.EmbeddingBag(VOCABULARY, width, mode="sum") for _ in range(features))
        self.bottom = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, width), nn.ReLU())
        pairs = (features + 1) * features // 2
        self.top = nn.Sequential(nn.Linear(width + pairs, 128), nn.ReLU(), nn.Linear(128, CLASSES))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        dense = self.bottom(tokens[:, :16].float() / VOCABULARY)
        chunks = tokens.chunk(self.features, dim=1)
        vectors = torch.stack([dense, *[bag(c) for bag, c in zip(self.bags, chunks, strict=True)]], 1)
        dots = vectors @ vectors.transpose(1, 2)
        upper = torch.triu_indices(vectors.shape[1], vectors.shape[1], 1, device=tokens.device)
        return self.top(torch.cat([dense, dots[:, upper[0], upper[1]]], 1))


class DenseGraphConv(nn.Module):
    """A graph network on an image's 32x32 pixels as 1,024 nodes of 3 features: a fixed 4-neighbour
    adjacency normalized as GCN does, three graph convolutions (aggregate by a sparse-free dense
    product, then a linear layer, ReLU) of width 64, mean-pooled."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        side = IMAGE_SIZE
        index = torch.arange(side * side).view(side, side)
        adjacency = torch.eye(side * side)
        for a, b in ((index[:, :-1], index[:, 1:]), (index[:-1], index[1:])):
            adjacency[a.flatten(), b.flatten()] = 1.0
            adjacency[b.flatten(), a.flatten()] = 1.0
        degree = adjacency.sum(1).rsqrt()
        self.register_buffer("adjacency", degree[:, None] * adjacency * degree[None, :])
        self.layers = nn.ModuleList(nn.Linear(a, width) for a in (3, width, width))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.flatten(2).transpose(1, 2)
        for layer in self.layers:
            x = torch.relu(layer(self.adjacency @ x))
        return self.head(x.mean(1))


class HighwayMLP(nn.Module):
    """Highway layers (a sigmoid transform gate mixing a ReLU layer with its input, gate bias -2) of
    width 256 over the flattened image, eight of them."""

    def __init__(self, width: int = 256, depth: int = 8) -> None:
        super().__init__()
        self.inlet = nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.gates = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        for gate in self.gates:
            nn.init.constant_(gate.bias, -2.0)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.inlet(image.flatten(1)))
        for layer, gate in zip(self.layers, self.gates, strict=True):
            t = torch.sigmoid(gate(x))
            x = t * torch.relu(layer(x)) + (1 - t) * x
        return self.head(x)


class GatedConvLM(nn.Module):
    """A gated convolutional language model (Dauphin et al.): embeddings, six causal 1-D convolutions of
    kernel 4 each gated by a GLU, residual, a linear head a token."""

    def __init__(self, width: int = 128, depth: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.convs = nn.ModuleList(nn.Conv1d(width, 2 * width, 4) for _ in range(depth))
        self.head = nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens).transpose(1, 2)
        for conv in self.convs:
            x = x + nn.functional.glu(conv(nn.functional.pad(x, (3, 0))), dim=1)
        return self.head(x.transpose(1, 2))


class InducedSetTransformer(nn.Module):
    """A Set Transformer over an image's pixels as a set of 1,024 points: two induced set attention
    blocks (16 inducing points, nn.MultiheadAttention, 4 heads of 32) and attention pooling by a seed."""

    def __init__(self, width: int = 128, inducing: int = 16) -> None:
        super().__init__()
        self.inlet = nn.Linear(3, width)
        self.inducing = nn.ParameterList(nn.Parameter(torch.randn(inducing, width) * 0.1) for _ in range(2))
        self.gather = nn.ModuleList(nn.MultiheadAttention(width, 4, batch_first=True) for _ in range(2))
        self.scatter = nn.ModuleList(nn.MultiheadAttention(width, 4, batch_first=True) for _ in range(2))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2))
        self.seed = nn.Parameter(torch.randn(1, 1, width) * 0.1)
        self.pool = nn.MultiheadAttention(width, 4, batch_first=True)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.inlet(image.flatten(2).transpose(1, 2))
        for points, gather, scatter, norm in zip(
            self.inducing, self.gather, self.scatter, self.norms, strict=True
        ):
            queries = points.expand(x.shape[0], -1, -1)
            summary = gather(queries, x, x, need_weights=False)[0]
            x = norm(x + scatter(x, summary, summary, need_weights=False)[0])
        pooled = self.pool(self.seed.expand(x.shape[0], -1, -1), x, x, need_weights=False)[0]
        return self.head(pooled[:, 0])


class CoordinateMLP(nn.Module):
    """A NeRF-like coordinate network: each pixel's (row, column) in sin/cos positional encodings of 8
    frequencies, an MLP of eight ReLU layers of 128 with a skip at the fifth, regressing its colour."""

    def __init__(self, width: int = 128, frequencies: int = 8) -> None:
        super().__init__()
        side = torch.linspace(-1, 1, IMAGE_SIZE)
        grid = torch.stack(torch.meshgrid(side, side, indexing="ij"), -1).view(-1, 2)
        scales = 2.0 ** torch.arange(frequencies) * torch.pi
        angles = grid[:, :, None] * scales
        self.register_buffer("encoded", torch.cat([angles.sin(), angles.cos()], -1).flatten(1))
        features = self.encoded.shape[1]
        self.first = nn.ModuleList([nn.Linear(features, width), *[nn.Linear(width, width) for _ in range(3)]])
        self.second = nn.ModuleList(
            [nn.Linear(width + features, width), *[nn.Linear(width, width) for _ in range(3)]]
        )
        self.colour = nn.Linear(width, 3)
        self.condition = nn.Linear(3, width)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        # Each image conditions the field by its mean colour: a batch of fields, one per image.
        code = self.condition(image.mean((2, 3)))[:, None, :]
        x = self.encoded.expand(image.shape[0], -1, -1)
        h = x
        for layer in self.first:
            h = torch.relu(layer(h) + code)
        h = torch.cat([h, x], -1)
        for layer in self.second:
            h = torch.relu(layer(h))
        return self.colour(h)


class AtrousPyramidNet(nn.Module):
    """A DeepLab-like network: a strided stem, batch-normed 3x3 convolutions, then atrous spatial
    pyramid pooling (a 1x1 and 3x3 convolutions at dilations 2, 4 and 6, and the image's mean), fused
    by a 1x1 convolution, pooled and classified."""

    def __init__(self, width: int = 96) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, width, 2), *_conv_bn(width, width, 1))
        self.branches = nn.ModuleList(
            [nn.Conv2d(width, width, 1)]
            + [nn.Conv2d(width, width, 3, padding=d, dilation=d) for d in (2, 4, 6)]
        )
        self.image_pool = nn.Conv2d(width, width, 1)
        self.fuse = nn.Sequential(nn.Conv2d(5 * width, width, 1), nn.BatchNorm2d(width), nn.ReLU())
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        pooled = self.image_pool(x.mean((2, 3), keepdim=True)).expand_as(x)
        x = self.fuse(torch.cat([*[torch.relu(b(x)) for b in self.branches], pooled], 1))
        return self.head(x.mean((2, 3)))


def _grouped_bn(width: int, kernel: int, groups: int) -> list[nn.Module]:
    """A grouped convolution keeping ``width`` channels and the map's size, then a batch norm."""
    return [nn.Conv2d(width, width, kernel, padding=kernel // 2, groups=groups), nn.BatchNorm2d(width)]


class ShuffleUnitNet(nn.Module):
    """A ShuffleNet-like network: units of a grouped 1x1 convolution (4 groups), a channel shuffle, a
    depthwise 3x3 and another grouped 1x1, batch norms, residual; three stages of two units."""

    def __init__(self, widths: tuple[int, ...] = (64, 128, 256), groups: int = 4) -> None:
        super().__init__()
        self.groups = groups
        self.stem = nn.Sequential(*_conv_bn(3, widths[0], 1))
        self.units = nn.ModuleList()
        self.downs = nn.ModuleList()
        previous = widths[0]
        for width in widths:
            self.downs.append(nn.Sequential(*_conv_bn(previous, width, 2)))
            for _ in range(2):
                self.units.append(
                    nn.ModuleList(
                        [
                            nn.Sequential(
                                nn.Conv2d(width, width, 1, groups=groups), nn.BatchNorm2d(width), nn.ReLU()
                            ),
                            nn.Sequential(
                                nn.Conv2d(width, width, 3, padding=1, groups=width), nn.BatchNorm2d(width)
                            ),
                            nn.Sequential(nn.Conv2d(width, width, 1, groups=groups), nn.BatchNorm2d(width)),
                        ]
                    )
                )
            previous = width
        self.head = nn.Linear(widths[-1], CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        units = iter(self.units)
        for down in self.downs:
            x = down(x)
            for first, depthwise, last in (next(units), next(units)):
                y = first(x)
                n, c, h, w = y.shape
                y = y.view(n, self.groups, c // self.groups, h, w).transpose(1, 2).reshape(n, c, h, w)
                x = torch.relu(x + last(depthwise(y)))
        return self.head(x.mean((2, 3)))


class FiLMConditionedCNN(nn.Module):
    """A CNN whose blocks are modulated by FiLM: a per-channel scale and shift computed from the
    image's own global features by a small MLP (batch norm without its own affine), three blocks."""

    def __init__(self, widths: tuple[int, ...] = (48, 96, 192)) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        previous = 3
        for width in widths:
            self.convs.append(nn.Conv2d(previous, width, 3, stride=2, padding=1))
            self.norms.append(nn.BatchNorm2d(width, affine=False))
            previous = width
        self.context = nn.Sequential(nn.Linear(3, 64), nn.ReLU())
        self.films = nn.ModuleList(nn.Linear(64, 2 * w) for w in widths)
        self.head = nn.Linear(widths[-1], CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        context = self.context(image.mean((2, 3)))
        x = image
        for conv, norm, film in zip(self.convs, self.norms, self.films, strict=True):
            scale, shift = film(context)[:, :, None, None].chunk(2, 1)
            x = torch.relu(norm(conv(x)) * (1 + scale) + shift)
        return self.head(x.mean((2, 3)))


class TokenShiftLM(nn.Module):
    """An RWKV-like language model without its recurrence: each of four blocks mixes every token with
    the one before it (a learned per-channel interpolation), a sigmoid receptance gating a
    squared-ReLU channel MLP, layer norms, residual; a linear head a token."""

    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.mix = nn.ParameterList(nn.Parameter(torch.rand(width)) for _ in range(depth))
        self.receptance = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(depth))
        self.key = nn.ModuleList(nn.Linear(width, 4 * width, bias=False) for _ in range(depth))
        self.value = nn.ModuleList(nn.Linear(4 * width, width, bias=False) for _ in range(depth))
        self.head = nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        blocks = zip(self.norms, self.mix, self.receptance, self.key, self.value, strict=True)
        for norm, mix, receptance, key, value in blocks:
            h = norm(x)
            shifted = nn.functional.pad(h, (0, 0, 1, -1))
            h = h * mix + shifted * (1 - mix)
            x = x + torch.sigmoid(receptance(h)) * value(torch.relu(key(h)) ** 2)
        return self.head(x)


class HyperMLP(nn.Module):
    """A hypernetwork: from each image's pooled colours a small MLP writes the weights of a per-example
    two-layer network (64 -> 64 -> classes) applied to the image's 8x8-pooled features by batched
    matrix products."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.width = width
        self.encoder = nn.Sequential(nn.Linear(3, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.first = nn.Linear(128, (3 * 64) * width)
        self.second = nn.Linear(128, width * CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        n = image.shape[0]
        code = self.encoder(image.mean((2, 3)))
        features = nn.functional.avg_pool2d(image, 4).flatten(1)[:, None, :]  # (n, 1, 3 * 64)
        hidden = torch.relu(features @ self.first(code).view(n, 3 * 64, self.width))
        return (hidden @ self.second(code).view(n, self.width, CLASSES))[:, 0]


class CapsuleNet(nn.Module):
    """A capsule network: convolutional primary capsules (32 maps of 8-D), squashed, routed by
    agreement to one 16-D capsule a class over three iterations (softmax over classes), the class
    capsules' lengths the logits."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.classes = classes
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 5, stride=2, padding=2), nn.ReLU())
        self.primary = nn.Conv2d(64, 32 * 8, 3, stride=2, padding=1)
        self.transform = nn.Parameter(torch.randn(1, 32 * 64, classes, 16, 8) * 0.05)
        self.head = nn.Linear(classes, CLASSES)

    @staticmethod
    def squash(x: torch.Tensor) -> torch.Tensor:
        norm2 = (x * x).sum(-1, keepdim=True)
        return norm2 / (1 + norm2) * x / torch.sqrt(norm2 + 1e-8)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        n = image.shape[0]
        u = self.primary(self.stem(image)).view(n, 32, 8, -1).permute(0, 1, 3, 2).reshape(n, -1, 8)
        u = self.squash(u)
        predictions = (self.transform @ u[:, :, None, :, None]).squeeze(-1)  # (n, capsules, classes, 16)
        logits = torch.zeros(predictions.shape[:3], device=image.device)
        for _ in range(3):
            weights = logits.softmax(2)
            v = self.squash((weights[..., None] * predictions).sum(1))
            logits = logits + (predictions * v[:, None]).sum(-1)
        return self.head(v.norm(dim=-1))


class WaveNetClassifier(nn.Module):
    """WaveNet over an image's rows laid end to end: ten dilated causal 1-D convolutions (dilations 1
    to 512), each a tanh-sigmoid gated activation with residual and skip 1x1 convolutions, the skips
    summed, pooled and classified."""

    def __init__(self, width: int = 48, depth: int = 10) -> None:
        super().__init__()
        self.inlet = nn.Conv1d(3, width, 1)
        self.dilations = [2**i for i in range(depth)]
        self.filters = nn.ModuleList(nn.Conv1d(width, 2 * width, 2, dilation=d) for d in self.dilations)
        self.residuals = nn.ModuleList(nn.Conv1d(width, width, 1) for _ in self.dilations)
        self.skips = nn.ModuleList(nn.Conv1d(width, width, 1) for _ in self.dilations)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.inlet(image.flatten(2))
        skipped = 0.0
        for dilation, conv, residual, skip in zip(
            self.dilations, self.filters, self.residuals, self.skips, strict=True
        ):
            filtered, gate = conv(nn.functional.pad(x, (dilation, 0))).chunk(2, 1)
            h = torch.tanh(filtered) * torch.sigmoid(gate)
            x = x + residual(h)
            skipped = skipped + skip(h)
        return self.head(torch.relu(skipped).mean(2))


def _add_attention_blocks(module: nn.Module, width: int, depth: int) -> None:
    """``depth`` pre-norm blocks' layers on ``module``: two layer norms a block, a QKV and an output
    projection, a GELU MLP of 4x width."""
    module.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2 * depth))
    module.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(depth))
    module.proj = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
    module.mlps = nn.ModuleList(
        nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        for _ in range(depth)
    )


class WindowAttentionNet(nn.Module):
    """Swin-like blocks written by hand: a 4x4 patch embedding, attention within 4x4 windows (the map
    cut into windows by view and permute, scaled dot-product attention, 4 heads), the windows shifted
    by half a window every other block (torch.roll), a GELU MLP, layer norms; four blocks."""

    def __init__(self, width: int = 96, depth: int = 4, window: int = 4) -> None:
        super().__init__()
        self.window, self.heads = window, 4
        self.embed = nn.Conv2d(3, width, 4, stride=4)
        _add_attention_blocks(self, width, depth)
        self.head = nn.Linear(width, CLASSES)

    def attend(self, x: torch.Tensor, index: int) -> torch.Tensor:
        n, h, w, c = x.shape
        s = self.window
        windows = x.view(n, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
        heads = self.qkv[index](windows).view(-1, s * s, 3, self.heads, c // self.heads)
        q, k, v = heads.permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, s * s, c)
        out = self.proj[index](out).view(n, h // s, w // s, s, s, c).permute(0, 1, 3, 2, 4, 5)
        return out.reshape(n, h, w, c)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(image).permute(0, 2, 3, 1)
        for index, mlp in enumerate(self.mlps):
            shift = self.window // 2 if index % 2 else 0
            h = torch.roll(self.norms[2 * index](x), (-shift, -shift), (1, 2))
            x = x + torch.roll(self.attend(h, index), (shift, shift), (1, 2))
            x = x + mlp(self.norms[2 * index + 1](x))
        return self.head(x.mean((1, 2)))


class UNet1d(nn.Module):
    """A 1-D U-Net over an image's rows laid end to end: three levels down (two 1-D convolutions of
    kernel 3 with batch norm, a stride-2 pool), back up by transposed convolutions, each level's
    features joined to the upsampled ones by concatenation, pooled and classified."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()

        def block(a: int, b: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv1d(a, b, 3, padding=1),
                nn.BatchNorm1d(b),
                nn.ReLU(),
                nn.Conv1d(b, b, 3, padding=1),
                nn.ReLU(),
            )

        self.down = nn.ModuleList(block(a, b) for a, b in zip((3, *widths[:-1]), widths, strict=True))
        self.up = nn.ModuleList(nn.ConvTranspose1d(b, a, 2, stride=2) for a, b in itertools.pairwise(widths))
        self.merge = nn.ModuleList(block(2 * a, a) for a in widths[:-1])
        self.head = nn.Linear(widths[0], CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.flatten(2)
        skips = []
        for index, block in enumerate(self.down):
            x = block(x)
            if index < len(self.down) - 1:
                skips.append(x)
                x = nn.functional.max_pool1d(x, 2)
        for up, merge in zip(reversed(self.up), reversed(self.merge), strict=True):
            x = merge(torch.cat([skips.pop(), up(x)], 1))
        return self.head(x.mean(2))


class PixelShuffleUpscaler(nn.Module):
    """A super-resolution network (ESPCN-like): from the image pooled to half its side, five 3x3
    convolutions, then a convolution to 3 x 2 x 2 channels rearranged by pixel shuffle to the full
    side; trained on the mean squared error against the image."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, width, 5, padding=2), nn.Tanh()]
        for _ in range(4):
            layers += [nn.Conv2d(width, width, 3, padding=1), nn.Tanh()]
        self.body = nn.Sequential(*layers, nn.Conv2d(width, 3 * 4, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.body(nn.functional.avg_pool2d(image, 2))


class GatedConvNet(nn.Module):
    """A 2-D CNN of gated convolutions: each 3x3 convolution makes twice the channels, split in halves,
    one gating the other through a sigmoid (GLU), four stages of stride 2."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 256)) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv2d(a, 2 * b, 3, stride=2, padding=1)
            for a, b in zip((3, *widths[:-1]), widths, strict=True)
        )
        self.head = nn.Linear(widths[-1], CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image
        for conv in self.convs:
            x = nn.functional.glu(conv(x), dim=1)
        return self.head(x.mean((2, 3)))


class PatchMergingNet(nn.Module):
    """Patch merging as Swin's stages do it: the map's 2x2 neighbours gathered by strided slices and
    concatenated along the channels, a layer norm and a linear reduction, then an MLP on each token,
    three stages."""

    def __init__(self, widths: tuple[int, ...] = (48, 96, 192)) -> None:
        super().__init__()
        self.embed = nn.Linear(3, widths[0])
        self.norms = nn.ModuleList(nn.LayerNorm(4 * w) for w in widths)
        self.reduce = nn.ModuleList(
            nn.Linear(4 * a, b) for a, b in zip(widths, (*widths[1:], widths[-1]), strict=True)
        )
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(b, 2 * b), nn.GELU(), nn.Linear(2 * b, b))
            for b in (*widths[1:], widths[-1])
        )
        self.head = nn.Linear(widths[-1], CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(image.permute(0, 2, 3, 1))
        for norm, reduce, mlp in zip(self.norms, self.reduce, self.mlps, strict=True):
            merged = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
            x = reduce(norm(merged))
            x = x + mlp(x)
        return self.head(x.mean((1, 2)))


class ChannelShiftNet(nn.Module):
    """A temporal shift network over an image's 32 rows as frames: before each 1-D convolution over a
    frame's pixels, an eighth of the channels shifted one frame back and an eighth one forward (zero
    padded, by concatenation), residual, four blocks."""

    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.inlet = nn.Conv1d(3, width, 1)
        self.convs = nn.ModuleList(nn.Conv1d(width, width, 3, padding=1) for _ in range(depth))
        self.norms = nn.ModuleList(nn.BatchNorm1d(width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    @staticmethod
    def shift(x: torch.Tensor, frames: int) -> torch.Tensor:
        n, c, length = x.shape
        x = x.view(n // frames, frames, c, length)
        part = c // 8
        zeros = torch.zeros_like(x[:, :1, :part])
        back = torch.cat([x[:, 1:, :part], zeros], 1)
        forth = torch.cat([zeros, x[:, :-1, part : 2 * part]], 1)
        return torch.cat([back, forth, x[:, :, 2 * part :]], 2).view(n, c, length)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        n, c, rows, columns = image.shape
        x = self.inlet(image.permute(0, 2, 1, 3).reshape(n * rows, c, columns))
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = x + torch.relu(norm(conv(self.shift(x, rows))))
        return self.head(x.mean(2).view(n, rows, -1).mean(1))


class DenseMLP(nn.Module):
    """A densely connected MLP: each of six layers reads the concatenation of the input and every
    earlier layer's output (growth 128), on the flattened image."""

    def __init__(self, growth: int = 128, depth: int = 6) -> None:
        super().__init__()
        start = 3 * IMAGE_SIZE * IMAGE_SIZE // 4
        self.layers = nn.ModuleList(nn.Linear(start + i * growth, growth) for i in range(depth))
        self.head = nn.Linear(start + depth * growth, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = nn.functional.avg_pool2d(image, 2).flatten(1)
        for layer in self.layers:
            features = torch.cat([features, torch.relu(layer(features))], 1)
        return self.head(features)


class ConvRecurrentReader(nn.Module):
    """A CRNN (text recognition's shape): a small CNN down to one row of features per image column,
    a bidirectional GRU over the 16 columns, each column's state pooled and classified."""

    def __init__(self, width: int = 64, hidden: int = 96) -> None:
        super().__init__()
        self.cnn = nn.Sequential(
            *_conv_bn(3, width, 1), nn.MaxPool2d(2), *_conv_bn(width, 2 * width, 1), nn.MaxPool2d((2, 1))
        )
        self.rnn = nn.GRU(2 * width * (IMAGE_SIZE // 4), hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.cnn(image)  # (n, c, h, w): the columns are the sequence
        columns = features.permute(0, 3, 1, 2).flatten(2)
        return self.head(self.rnn(columns)[0].mean(1))


class SineMLP(nn.Module):
    """SIREN: an MLP of sine activations (frequency 30 at the first layer) over each pixel's
    coordinates, conditioned by the image's mean colour, regressing its colour."""

    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()
        side = torch.linspace(-1, 1, IMAGE_SIZE)
        self.register_buffer("grid", torch.stack(torch.meshgrid(side, side, indexing="ij"), -1).view(-1, 2))
        self.first = nn.Linear(2, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.condition = nn.Linear(3, width)
        self.colour = nn.Linear(width, 3)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        code = self.condition(image.mean((2, 3)))[:, None, :]
        h = torch.sin(30.0 * self.first(self.grid)) + code
        for layer in self.layers:
            h = torch.sin(layer(h))
        return self.colour(h)


class InvolutionNet(nn.Module):
    """Involution layers: from each pixel's features a 3x3 kernel per group of 16 channels, applied to
    its neighbourhood gathered by unfold, multiplied and summed; batch norm, ReLU, three stages."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128), group: int = 16) -> None:
        super().__init__()
        self.group = group
        self.steps = nn.ModuleList(
            nn.Sequential(*_conv_bn(a, b, 2)) for a, b in zip((3, *widths[:-1]), widths, strict=True)
        )
        self.kernels = nn.ModuleList(nn.Conv2d(w, 9 * (w // group), 1) for w in widths)
        self.norms = nn.ModuleList(nn.BatchNorm2d(w) for w in widths)
        self.head = nn.Linear(widths[-1], CLASSES)

    def involve(self, x: torch.Tensor, index: int) -> torch.Tensor:
        n, c, h, w = x.shape
        groups = c // self.group
        kernel = self.kernels[index](x).view(n, groups, 1, 9, h, w)
        patches = nn.functional.unfold(x, 3, padding=1).view(n, groups, self.group, 9, h, w)
        return (kernel * patches).sum(3).view(n, c, h, w)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image
        for index, (step, norm) in enumerate(zip(self.steps, self.norms, strict=True)):
            x = step(x)
            x = x + torch.relu(norm(self.involve(x, index)))
        return self.head(x.mean((2, 3)))


class SpatialTransformerNet(nn.Module):
    """A spatial transformer: a localisation CNN predicts an affine transform (started at the
    identity), the image resampled through it (affine_grid, bilinear grid_sample), then a small CNN
    classifies it."""

    def __init__(self) -> None:
        super().__init__()
        self.locate = nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.Conv2d(16, 32, 5, stride=2, padding=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(32 * 16, 6),
        )
        nn.init.zeros_(self.locate[-1].weight)
        with torch.no_grad():
            self.locate[-1].bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
        self.classify = nn.Sequential(
            *_conv_bn(3, 64, 1),
            nn.MaxPool2d(2),
            *_conv_bn(64, 128, 1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, CLASSES),
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        theta = self.locate(image).view(-1, 2, 3)
        grid = nn.functional.affine_grid(theta, list(image.shape), align_corners=False)
        return self.classify(nn.functional.grid_sample(image, grid, align_corners=False))


class MaskedConvNet(nn.Module):
    """PixelCNN-like masked convolutions (each 5x5 kernel multiplied by a causal mask every call),
    gated, residual, predicting each pixel's colour from those above and left of it."""

    def __init__(self, width: int = 64, depth: int = 5) -> None:
        super().__init__()
        mask = torch.ones(5, 5)
        mask[2, 2:] = 0
        mask[3:] = 0
        self.register_buffer("mask", mask)
        self.inlet = nn.Conv2d(3, width, 1)
        self.convs = nn.ModuleList(nn.Conv2d(width, 2 * width, 5, padding=2) for _ in range(depth))
        self.outlet = nn.Conv2d(width, 3, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.inlet(image)
        for conv in self.convs:
            gated = nn.functional.conv2d(x, conv.weight * self.mask, conv.bias, padding=2)
            a, b = gated.chunk(2, 1)
            x = x + torch.tanh(a) * torch.sigmoid(b)
        return self.outlet(x)


class ResNeXtNet(nn.Module):
    """ResNeXt-like bottlenecks: a 1x1 reduction, a 3x3 convolution of 8 groups, a 1x1 expansion, batch
    norms, identity or projected shortcuts; three stages of two blocks, the first of each strided."""

    def __init__(self, widths: tuple[int, ...] = (64, 128, 256), groups: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, widths[0], 1))
        blocks: list[nn.Module] = []
        channels = widths[0]
        for stage, width in enumerate(widths):
            for index in range(2):
                stride = 2 if index == 0 and stage > 0 else 1
                blocks.append(_ResNeXtBlock(channels, width, stride, groups))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(image)).mean((2, 3)))


class _ResNeXtBlock(nn.Module):
    def __init__(self, channels: int, width: int, stride: int, groups: int) -> None:
        super().__init__()
        inner = width // 2
        self.body = nn.Sequential(
            nn.Conv2d(channels, inner, 1, bias=False),
            nn.BatchNorm2d(inner),
            nn.ReLU(),
            nn.Conv2d(inner, inner, 3, stride, 1, groups=groups, bias=False),
            nn.BatchNorm2d(inner),
            nn.ReLU(),
            nn.Conv2d(inner, width, 1, bias=False),
            nn.BatchNorm2d(width),
        )
        same = stride == 1 and channels == width
        self.shortcut = (
            nn.Identity()
            if same
            else nn.Sequential(nn.Conv2d(channels, width, 1, stride, bias=False), nn.BatchNorm2d(width))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class LinearAttentionLM(nn.Module):
    """A causal linear-attention language model (Katharopoulos et al.): queries and keys through
    elu + 1, the causal sums of keys times values by cumulative sums over the sequence, 4 heads,
    layer norms, a GELU MLP; four blocks."""

    def __init__(self, width: int = 128, depth: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(VOCABULARY, width)
        _add_attention_blocks(self, width, depth)
        self.head = nn.Linear(width, VOCABULARY)

    def attend(self, x: torch.Tensor, index: int) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv[index](x).view(n, t, 3, self.heads, c // self.heads).unbind(2)
        q, k = nn.functional.elu(q) + 1, nn.functional.elu(k) + 1
        state = torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), 1)  # (n, t, heads, d, d)
        norm = torch.cumsum(k, 1)
        out = (q.unsqueeze(-2) @ state).squeeze(-2) / (q * norm).sum(-1, keepdim=True)
        return self.proj[index](out.reshape(n, t, c))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for index, mlp in enumerate(self.mlps):
            x = x + self.attend(self.norms[2 * index](x), index)
            x = x + mlp(self.norms[2 * index + 1](x))
        return self.head(x)


class CouplingFlow(nn.Module):
    """A RealNVP-like normalizing flow on flattened 16x16 images: affine coupling layers (a checkerboard
    half conditions the scale and shift of the other through an MLP, tanh-bounded log-scales), the
    halves swapped between layers; trained on the negative log-likelihood under a standard normal."""

    def __init__(self, width: int = 512, depth: int = 6) -> None:
        super().__init__()
        features = 3 * (IMAGE_SIZE // 2) ** 2
        self.half = features // 2
        self.nets = nn.ModuleList(
            nn.Sequential(
                nn.Linear(self.half, width),
                nn.ReLU(),
                nn.Linear(width, width),
                nn.ReLU(),
                nn.Linear(width, 2 * self.half),
            )
            for _ in range(depth)
        )

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = nn.functional.avg_pool2d(image, 2).flatten(1)
        a, b = x[:, : self.half], x[:, self.half :]
        log_det = torch.zeros(x.shape[0], device=x.device)
        for net in self.nets:
            scale, shift = net(a).chunk(2, 1)
            scale = torch.tanh(scale)
            b = b * torch.exp(scale) + shift
            log_det = log_det + scale.sum(1)
            a, b = b, a
        z = torch.cat([a, b], 1)
        return (0.5 * (z**2).sum(1) - log_det).mean()


class NeuralODE(nn.Module):
    """A neural ODE classifier: the image's 4x4-pooled features lifted to 256, integrated over [0, 1]
    by eight fixed steps of the classic Runge-Kutta method through a time-conditioned tanh MLP
    (backpropagated through the solver), then classified."""

    def __init__(self, width: int = 256, steps: int = 8) -> None:
        super().__init__()
        self.steps = steps
        self.lift = nn.Linear(3 * (IMAGE_SIZE // 4) ** 2, width)
        self.field = nn.Sequential(nn.Linear(width + 1, width), nn.Tanh(), nn.Linear(width, width))
        self.head = nn.Linear(width, CLASSES)

    def velocity(self, t: float, h: torch.Tensor) -> torch.Tensor:
        return self.field(torch.cat([h, torch.full_like(h[:, :1], t)], 1))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        h = self.lift(nn.functional.avg_pool2d(image, 4).flatten(1))
        dt = 1.0 / self.steps
        for index in range(self.steps):
            t = index * dt
            k1 = self.velocity(t, h)
            k2 = self.velocity(t + dt / 2, h + dt / 2 * k1)
            k3 = self.velocity(t + dt / 2, h + dt / 2 * k2)
            k4 = self.velocity(t + dt, h + dt * k3)
            h = h + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return self.head(h)


class FourierOperator(nn.Module):
    """A Fourier neural operator (Li et al.): each of four layers multiplies the image's lowest 8x8
    Fourier modes by learned complex weights per channel pair (rfft2, irfft2), adds a 1x1
    convolution, GELU; an image-to-image regression."""

    def __init__(self, width: int = 32, depth: int = 4, modes: int = 8) -> None:
        super().__init__()
        self.modes = modes
        self.lift = nn.Conv2d(3, width, 1)
        scale = 1.0 / (width * width)
        self.weights = nn.ParameterList(
            nn.Parameter(scale * torch.randn(width, width, modes, modes, dtype=torch.cfloat))
            for _ in range(depth)
        )
        self.mixes = nn.ModuleList(nn.Conv2d(width, width, 1) for _ in range(depth))
        self.project = nn.Conv2d(width, 3, 1)

    def spectral(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        m = self.modes
        spectrum = torch.fft.rfft2(x)
        out = torch.zeros(n, c, h, w // 2 + 1, dtype=spectrum.dtype, device=x.device)
        out[:, :, :m, :m] = torch.einsum("nixy,ioxy->noxy", spectrum[:, :, :m, :m], weight)
        return torch.fft.irfft2(out, s=(h, w))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.lift(image)
        for weight, mix in zip(self.weights, self.mixes, strict=True):
            x = nn.functional.gelu(self.spectral(x, weight) + mix(x))
        return self.project(x)


class MessagePassingNet(nn.Module):
    """A message-passing graph network on an image's pixels as nodes joined to their 8 neighbours:
    each of three layers computes a message per edge from its two ends' features (gathered by index),
    sums them into the receiving node with index_add, and updates the node by an MLP; mean-pooled."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        side = IMAGE_SIZE
        index = torch.arange(side * side).view(side, side)
        sources, targets = [], []
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                if dy or dx:
                    a = index[max(dy, 0) : side + min(dy, 0), max(dx, 0) : side + min(dx, 0)]
                    b = index[max(-dy, 0) : side + min(-dy, 0), max(-dx, 0) : side + min(-dx, 0)]
                    sources.append(a.flatten())
                    targets.append(b.flatten())
        self.register_buffer("sources", torch.cat(sources))
        self.register_buffer("targets", torch.cat(targets))
        self.embed = nn.Linear(3, width)
        self.messages = nn.ModuleList(nn.Linear(2 * width, width) for _ in range(3))
        self.updates = nn.ModuleList(
            nn.Sequential(nn.Linear(2 * width, width), nn.ReLU(), nn.Linear(width, width)) for _ in range(3)
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(image.flatten(2).transpose(1, 2))  # (n, nodes, width)
        for message, update in zip(self.messages, self.updates, strict=True):
            edges = torch.cat([x[:, self.sources], x[:, self.targets]], -1)
            summed = torch.zeros_like(x).index_add_(1, self.targets, torch.relu(message(edges)))
            x = x + update(torch.cat([x, summed], -1))
        return self.head(x.mean(1))


class ProductKeyMemory(nn.Module):
    """A product-key memory layer (Lample et al.) in a small token classifier: each token's query split
    in halves, each half scored against 64 sub-keys, the top 8 of each combined, the best 8 of those
    64 pairs' values (an embedding bag of 4,096 rows) summed by their softmax weights; two layers."""

    def __init__(self, width: int = 128, keys: int = 64, top: int = 8) -> None:
        super().__init__()
        self.keys, self.top = keys, top
        self.embed = nn.Embedding(VOCABULARY, width)
        self.queries = nn.ModuleList(nn.Linear(width, width) for _ in range(2))
        self.sub_keys = nn.ParameterList(nn.Parameter(torch.randn(2, keys, width // 2)) for _ in range(2))
        self.values = nn.ModuleList(nn.EmbeddingBag(keys * keys, width, mode="sum") for _ in range(2))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2))
        self.head = nn.Linear(width, VOCABULARY)

    def lookup(self, x: torch.Tensor, index: int) -> torch.Tensor:
        n, t, c = x.shape
        q = self.queries[index](x).view(n * t, 2, c // 2)
        scores = torch.einsum("bhd,hkd->bhk", q, self.sub_keys[index])
        best, which = scores.topk(self.top, -1)  # (b, 2, top)
        pair_scores = (best[:, 0, :, None] + best[:, 1, None, :]).flatten(1)
        pair_index = (which[:, 0, :, None] * self.keys + which[:, 1, None, :]).flatten(1)
        chosen, slot = pair_scores.topk(self.top, -1)
        rows = pair_index.gather(1, slot)
        weights = torch.softmax(chosen, -1)
        out = self.values[index](rows, per_sample_weights=weights)
        return out.view(n, t, c)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for index, norm in enumerate(self.norms):
            x = x + self.lookup(norm(x), index)
        return self.head(x)


class DiagonalStateSpace(nn.Module):
    """An S4D-like state space model: each of four layers convolves every channel with a long kernel
    made from a diagonal complex state matrix (exp of its discretized eigenvalues times the step
    index), by FFT over twice the sequence; a GLU mix, layer norms, residual; a token LM."""

    def __init__(self, width: int = 128, state: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.log_dt = nn.ParameterList(nn.Parameter(torch.rand(width) * 3 - 6) for _ in range(depth))
        self.real = nn.ParameterList(nn.Parameter(torch.full((width, state), -0.5)) for _ in range(depth))
        self.imag = nn.ParameterList(
            nn.Parameter(torch.pi * torch.arange(state).float().repeat(width, 1)) for _ in range(depth)
        )
        self.c = nn.ParameterList(nn.Parameter(torch.randn(width, state, 2) * 0.5) for _ in range(depth))
        self.mix = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.head = nn.Linear(width, VOCABULARY)

    def kernel(self, index: int, length: int) -> torch.Tensor:
        dt = torch.exp(self.log_dt[index])[:, None]
        a = torch.complex(-torch.exp(self.real[index]), self.imag[index]) * dt  # (width, state)
        c = torch.view_as_complex(self.c[index]) * (torch.exp(a) - 1) / a
        steps = torch.arange(length, device=dt.device)
        return 2 * torch.einsum("hn,hnl->hl", c, torch.exp(a[..., None] * steps)).real

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        length = x.shape[1]
        for index, (mix, norm) in enumerate(zip(self.mix, self.norms, strict=True)):
            h = norm(x).transpose(1, 2)  # (n, width, length)
            k = self.kernel(index, length)
            y = torch.fft.irfft(torch.fft.rfft(h, 2 * length) * torch.fft.rfft(k, 2 * length), 2 * length)
            y = nn.functional.gelu(y[..., :length]).transpose(1, 2)
            x = x + nn.functional.glu(mix(y), -1)
        return self.head(x)


class RotaryLM(nn.Module):
    """A decoder written by hand with rotary position embeddings: queries and keys rotated pairwise by
    cos/sin tables (stacked and flattened halves), causal scaled dot-product attention, RMS norms by
    hand, a SiLU-gated MLP; four blocks."""

    def __init__(self, width: int = 128, depth: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        head = width // heads
        frequencies = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
        angles = torch.arange(TOKENS).float()[:, None] * frequencies[None, :]
        self.register_buffer("cos", angles.cos())
        self.register_buffer("sin", angles.sin())
        self.embed = nn.Embedding(VOCABULARY, width)
        self.scales = nn.ParameterList(nn.Parameter(torch.ones(width)) for _ in range(2 * depth))
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width, bias=False) for _ in range(depth))
        self.proj = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(depth))
        self.gates = nn.ModuleList(nn.Linear(width, 6 * width, bias=False) for _ in range(depth))
        self.downs = nn.ModuleList(nn.Linear(3 * width, width, bias=False) for _ in range(depth))
        self.head = nn.Linear(width, VOCABULARY)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[2]
        even, odd = x[..., 0::2], x[..., 1::2]
        cos, sin = self.cos[:t], self.sin[:t]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)

    def norm(self, x: torch.Tensor, index: int) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.scales[index]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        n, t, c = x.shape
        for index, (qkv, proj, gate, down) in enumerate(
            zip(self.qkv, self.proj, self.gates, self.downs, strict=True)
        ):
            q, k, v = qkv(self.norm(x, 2 * index)).view(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            out = nn.functional.scaled_dot_product_attention(
                self.rotate(q), self.rotate(k), v, is_causal=True
            )
            x = x + proj(out.transpose(1, 2).reshape(n, t, c))
            a, b = gate(self.norm(x, 2 * index + 1)).chunk(2, -1)
            x = x + down(nn.functional.silu(a) * b)
        return self.head(x)


class UpsamplingDecoder(nn.Module):
    """A convolutional autoencoder whose decoder upsamples bilinearly (then a 3x3 convolution) and by
    transposed convolutions in turn, batch norms, a sigmoid output; trained on the squared error."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()
        down: list[nn.Module] = []
        for a, b in zip((3, *widths[:-1]), widths, strict=True):
            down += _conv_bn(a, b, 2)
        self.encoder = nn.Sequential(*down)
        up: list[nn.Module] = []
        for index, (a, b) in enumerate(zip(widths[::-1], (*widths[::-1][1:], 16), strict=True)):
            if index % 2 == 0:
                up += [nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False), *_conv_bn(a, b)]
            else:
                up += [nn.ConvTranspose2d(a, b, 4, 2, 1, bias=False), nn.BatchNorm2d(b), nn.ReLU()]
        self.decoder = nn.Sequential(*up, nn.Conv2d(16, 3, 3, padding=1), nn.Sigmoid())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(image))


class ComplexConvNet(nn.Module):
    """A complex-valued CNN (deep complex networks): the image as a complex tensor, 3x3 complex
    convolutions (two of stride 2), a split ReLU on the real and imaginary parts, a complex linear
    layer whose outputs' magnitudes are the logits."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 64)) -> None:
        super().__init__()
        convs = []
        for index, (a, b) in enumerate(zip((3, *widths[:-1]), widths, strict=True)):
            convs.append(nn.Conv2d(a, b, 3, 2 if index else 1, 1, dtype=torch.cfloat))
        self.convs = nn.ModuleList(convs)
        self.head = nn.Linear(widths[-1], CLASSES, dtype=torch.cfloat)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = torch.complex(image, torch.zeros_like(image))
        for conv in self.convs:
            y = conv(x)
            x = torch.complex(nn.functional.relu(y.real), nn.functional.relu(y.imag))
        return self.head(x.mean((2, 3))).abs()


class DoublePrecisionMLP(nn.Module):
    """A scientific-computing regressor-style MLP kept in float64 throughout: six tanh layers of 512
    on the flattened image, a linear head."""

    def __init__(self, width: int = 512, depth: int = 6) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for index in range(depth):
            layers += [nn.Linear(3 * IMAGE_SIZE**2 if index == 0 else width, width), nn.Tanh()]
        self.body = nn.Sequential(*layers, nn.Linear(width, CLASSES)).double()

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.body(image.flatten(1).double())


class Perceiver(nn.Module):
    """A Perceiver-like classifier: 32 learned latents cross-attend to the image's 1,024 pixels
    (Fourier-free, a linear embedding of each pixel plus a learned position), then four latent
    self-attention blocks (nn.TransformerEncoderLayer, pre-norm), a mean over the latents."""

    def __init__(self, width: int = 128, latents: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.pixels = nn.Linear(3, width)
        self.position = nn.Parameter(torch.randn(IMAGE_SIZE**2, width) * 0.02)
        self.latents = nn.Parameter(torch.randn(latents, width) * 0.02)
        self.cross_norm = nn.LayerNorm(width)
        self.cross = nn.MultiheadAttention(width, 1, batch_first=True)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 4, 2 * width, 0.0, batch_first=True, norm_first=True)
            for _ in range(depth)
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        tokens = self.pixels(image.flatten(2).transpose(1, 2)) + self.position
        keys = self.cross_norm(tokens)
        queries = self.latents.expand(image.shape[0], -1, -1)
        x = queries + self.cross(queries, keys, keys, need_weights=False)[0]
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


class ConformerBlock(nn.Module):
    """A Conformer block: half feed-forward, self-attention, a convolution module (pointwise, GLU,
    depthwise 15-tap, batch norm, SiLU, pointwise), half feed-forward, a layer norm."""

    def __init__(self, width: int, heads: int = 4) -> None:
        super().__init__()

        def feed_forward() -> nn.Sequential:
            return nn.Sequential(
                nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.SiLU(), nn.Linear(4 * width, width)
            )

        self.ff1, self.ff2 = feed_forward(), feed_forward()
        self.attention_norm = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.conv_norm = nn.LayerNorm(width)
        self.pointwise_in = nn.Conv1d(width, 2 * width, 1)
        self.depthwise = nn.Conv1d(width, width, 15, padding=7, groups=width)
        self.conv_batch_norm = nn.BatchNorm1d(width)
        self.pointwise_out = nn.Conv1d(width, width, 1)
        self.out_norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        h = self.attention_norm(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        h = nn.functional.glu(self.pointwise_in(self.conv_norm(x).transpose(1, 2)), 1)
        h = nn.functional.silu(self.conv_batch_norm(self.depthwise(h)))
        x = x + self.pointwise_out(h).transpose(1, 2)
        return self.out_norm(x + 0.5 * self.ff2(x))


class Conformer(nn.Module):
    """A Conformer encoder over the image's rows as a sequence (32 steps of 96 features, as a
    spectrogram's frames): a linear projection, four Conformer blocks, a mean over time."""

    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()
        self.project = nn.Linear(3 * IMAGE_SIZE, width)
        self.blocks = nn.Sequential(*(ConformerBlock(width) for _ in range(depth)))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        frames = image.permute(0, 2, 1, 3).flatten(2)  # (n, rows, channels x columns)
        return self.head(self.blocks(self.project(frames)).mean(1))


class SegmentMemoryLM(nn.Module):
    """A Transformer-XL-like LM: the 128 tokens in four segments of 32, each layer's attention over
    its segment and the previous segment's hidden states at that layer (detached, concatenated onto
    the keys), causal within the segment; pre-norm blocks of 128 dimensions, four heads."""

    def __init__(self, width: int = 128, depth: int = 4, segment: int = 32) -> None:
        super().__init__()
        self.segment, self.heads = segment, 4
        self.embed = nn.Embedding(VOCABULARY, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2 * depth))
        self.query = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.key_value = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(depth))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, VOCABULARY)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        return x.view(n, t, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = self.segment
        memories: list[torch.Tensor | None] = [None] * len(self.mlps)
        outputs = []
        for start in range(0, tokens.shape[1], s):
            x = self.embed(tokens[:, start : start + s])
            t = x.shape[1]
            for index, mlp in enumerate(self.mlps):
                h = self.norms[2 * index](x)
                memory = memories[index]
                context = h if memory is None else torch.cat([memory, h], 1)
                memories[index] = h.detach()
                k, v = self.key_value[index](context).chunk(2, -1)
                past = context.shape[1] - t
                mask = torch.ones(t, context.shape[1], dtype=torch.bool, device=x.device).tril(past)
                a = nn.functional.scaled_dot_product_attention(
                    self._heads(self.query[index](h)), self._heads(k), self._heads(v), attn_mask=mask
                )
                x = x + self.out[index](a.transpose(1, 2).flatten(2))
                x = x + mlp(self.norms[2 * index + 1](x))
            outputs.append(x)
        return self.head(torch.cat(outputs, 1))


class SlotAttention(nn.Module):
    """Slot attention over a small CNN's features: two 5x5 convolutions give 1,024 positions of 64
    features (plus a learned position each); 6 slots compete for them (softmax over the slots) for
    three iterations, each a weighted mean, a GRUCell update and a residual MLP; a mean over the
    slots classifies."""

    def __init__(self, width: int = 64, slots: int = 6, iterations: int = 3) -> None:
        super().__init__()
        self.iterations = iterations
        self.encoder = nn.Sequential(
            nn.Conv2d(3, width, 5, padding=2), nn.ReLU(), nn.Conv2d(width, width, 5, padding=2), nn.ReLU()
        )
        self.position = nn.Parameter(torch.randn(IMAGE_SIZE**2, width) * 0.02)
        self.input_norm = nn.LayerNorm(width)
        self.slots = nn.Parameter(torch.randn(slots, width) * 0.02)
        self.slot_norm = nn.LayerNorm(width)
        self.query = nn.Linear(width, width, bias=False)
        self.key = nn.Linear(width, width, bias=False)
        self.value = nn.Linear(width, width, bias=False)
        self.update = nn.GRUCell(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.input_norm(self.encoder(image).flatten(2).transpose(1, 2) + self.position)
        k, v = self.key(features), self.value(features)
        n, c = features.shape[0], features.shape[2]
        slots = self.slots.expand(n, -1, -1)
        for _ in range(self.iterations):
            q = self.query(self.slot_norm(slots))
            attention = torch.softmax(q @ k.transpose(1, 2) * c**-0.5, dim=1) + 1e-8
            attention = attention / attention.sum(-1, keepdim=True)
            updates = attention @ v
            slots = self.update(updates.reshape(-1, c), slots.reshape(-1, c)).view(n, -1, c)
            slots = slots + self.mlp(self.mlp_norm(slots))
        return self.head(slots.mean(1))


class HourglassLM(nn.Module):
    """An hourglass decoder LM: two causal blocks at the 128 tokens, the tokens shortened fourfold
    (shifted right by three so no token sees ahead, groups of four concatenated and projected), two
    blocks at the 32, back up by repeating each four times (repeat_interleave) onto the residual, one
    block more; torch.nn's encoder layers under causal masks, 128 dimensions."""

    def __init__(self, width: int = 128, factor: int = 4) -> None:
        super().__init__()
        self.factor = factor

        def blocks(count: int) -> nn.ModuleList:
            return nn.ModuleList(
                nn.TransformerEncoderLayer(width, 4, 4 * width, 0.0, batch_first=True, norm_first=True)
                for _ in range(count)
            )

        self.embed = nn.Embedding(VOCABULARY, width)
        self.positions = nn.Parameter(torch.randn(TOKENS, width) * 0.02)
        self.pre, self.short, self.post = blocks(2), blocks(2), blocks(1)
        self.shorten = nn.Linear(factor * width, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCABULARY)

    @staticmethod
    def _run(blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        for block in blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return x

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        f = self.factor
        x = self._run(self.pre, self.embed(tokens) + self.positions[: tokens.shape[1]])
        shifted = nn.functional.pad(x, (0, 0, f - 1, 0))[:, : x.shape[1]]
        short = self.shorten(shifted.reshape(x.shape[0], x.shape[1] // f, -1))
        up = self._run(self.short, short).repeat_interleave(f, dim=1)
        return self.head(self.norm(self._run(self.post, x + up)))


class ObjectQueryDecoder(nn.Module):
    """A DETR-like classifier: a strided CNN backbone's 8x8 map (64 positions of 128 features plus
    learned positions) read by 16 learned object queries through torch.nn's transformer decoder
    (three layers of self-attention, cross-attention and MLP); the queries' mean classifies."""

    def __init__(self, width: int = 128, queries: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 64, 3, stride=2, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.Conv2d(64, width, 3, stride=2, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )
        self.position = nn.Parameter(torch.randn((IMAGE_SIZE // 4) ** 2, width) * 0.02)
        self.queries = nn.Parameter(torch.randn(queries, width) * 0.02)
        layer = nn.TransformerDecoderLayer(width, 4, 2 * width, 0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, depth)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        memory = self.backbone(image).flatten(2).transpose(1, 2) + self.position
        queries = self.queries.expand(image.shape[0], -1, -1)
        return self.head(self.decoder(queries, memory).mean(1))


class SpatialGatingMLP(nn.Module):
    """gMLP: patches of 4x4 (64 tokens of 128), four blocks each a layer norm, a channel projection
    to 512 with GELU, split in halves, one half normalized and mixed across tokens by a learned
    64x64 projection (the spatial gating unit) and multiplied into the other, projected back."""

    def __init__(self, width: int = 128, depth: int = 4) -> None:
        super().__init__()
        tokens = (IMAGE_SIZE // 4) ** 2
        self.embed = nn.Conv2d(3, width, 4, stride=4)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.expand = nn.ModuleList(nn.Linear(width, 4 * width) for _ in range(depth))
        self.gate_norms = nn.ModuleList(nn.LayerNorm(2 * width) for _ in range(depth))
        self.spatial = nn.ModuleList(nn.Linear(tokens, tokens) for _ in range(depth))
        self.contract = nn.ModuleList(nn.Linear(2 * width, width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(image).flatten(2).transpose(1, 2)
        for index, norm in enumerate(self.norms):
            u, v = nn.functional.gelu(self.expand[index](norm(x))).chunk(2, -1)
            v = self.spatial[index](self.gate_norms[index](v).transpose(1, 2)).transpose(1, 2)
            x = x + self.contract[index](u * v)
        return self.head(x.mean(1))


class SharedLayerEncoder(nn.Module):
    """An ALBERT-like encoder: a factorized embedding (64 then 256 dimensions) and one
    nn.TransformerEncoderLayer applied six times (its weights shared), a masked-token-free
    next-token head over the last layer."""

    def __init__(self, width: int = 256, repeats: int = 6) -> None:
        super().__init__()
        self.repeats = repeats
        self.embed = nn.Embedding(VOCABULARY, 64)
        self.project = nn.Linear(64, width)
        self.positions = nn.Parameter(torch.randn(TOKENS, width) * 0.02)
        self.layer = nn.TransformerEncoderLayer(width, 4, 4 * width, 0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.project(self.embed(tokens)) + self.positions[: tokens.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        for _ in range(self.repeats):
            x = self.layer(x, src_mask=mask, is_causal=True)
        return self.head(x)


class NeuralCellularAutomaton(nn.Module):
    """A neural cellular automaton: 16 channels of state on the 32x32 grid (the image in the first
    three), each of eight steps perceiving by fixed Sobel and identity filters (a depthwise 3x3
    convolution), updating by a two-layer 1x1 network on a random half of the cells; a pooled
    linear head classifies the last state."""

    def __init__(self, channels: int = 16, steps: int = 8) -> None:
        super().__init__()
        self.channels, self.steps = channels, steps
        sobel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 8
        identity = torch.zeros(3, 3)
        identity[1, 1] = 1.0
        filters = torch.stack([identity, sobel, sobel.t()]).repeat(channels, 1, 1).unsqueeze(1)
        self.register_buffer("filters", filters)
        self.update = nn.Sequential(nn.Conv2d(3 * channels, 96, 1), nn.ReLU(), nn.Conv2d(96, channels, 1))
        self.head = nn.Linear(channels, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        n, _, h, w = image.shape
        state = torch.cat([image, image.new_zeros(n, self.channels - 3, h, w)], 1)
        for _ in range(self.steps):
            perceived = nn.functional.conv2d(state, self.filters, padding=1, groups=self.channels)
            alive = (torch.rand(n, 1, h, w, device=image.device) < 0.5).to(image.dtype)
            state = state + self.update(perceived) * alive
        return self.head(state.mean((2, 3)))


class RandomFeatureAttentionLM(nn.Module):
    """A Performer-like causal LM: attention through 64 positive random features a head (softmax
    kernel estimated by exp of projected queries and keys), causal by running sums over the tokens
    (cumsum), four pre-norm blocks of 128 dimensions and four heads, GELU MLPs."""

    def __init__(self, width: int = 128, depth: int = 4, features: int = 64) -> None:
        super().__init__()
        self.heads = 4
        head = width // self.heads
        self.embed = nn.Embedding(VOCABULARY, width)
        self.positions = nn.Parameter(torch.randn(TOKENS, width) * 0.02)
        self.register_buffer("projection", torch.randn(head, features) / head**0.5)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2 * depth))
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(depth))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, VOCABULARY)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        projected = x @ self.projection
        return torch.exp(
            projected - (x * x).sum(-1, keepdim=True) / 2 - projected.amax(-1, keepdim=True).detach()
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n, t = tokens.shape
        x = self.embed(tokens) + self.positions[:t]
        for index, mlp in enumerate(self.mlps):
            q, k, v = self.qkv[index](self.norms[2 * index](x)).view(n, t, 3, self.heads, -1).unbind(2)
            q, k = self._features(q * 0.5), self._features(k * 0.5)
            context = torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), 1)  # (n, t, heads, features, head)
            normalizer = torch.cumsum(k, 1)
            attended = (q.unsqueeze(-2) @ context).squeeze(-2) / (
                (q * normalizer).sum(-1, keepdim=True) + 1e-6
            )
            x = x + self.out[index](attended.flatten(2))
            x = x + mlp(self.norms[2 * index + 1](x))
        return self.head(x)


class AdditiveAttentionDecoder(nn.Module):
    """A Bahdanau-style sequence model: a bidirectional GRU encodes the tokens (128 a direction), and a
    GRUCell decoder of 256 steps through the first 32 positions by hand, each step scoring every
    encoder state with additive attention (tanh of two projections, a learned vector) and reading
    their weighted sum; next-token logits at those positions, the rest from the encoder."""

    def __init__(self, width: int = 128, steps: int = 32) -> None:
        super().__init__()
        self.steps = steps
        self.embed = nn.Embedding(VOCABULARY, width)
        self.encoder = nn.GRU(width, width, batch_first=True, bidirectional=True)
        self.keys = nn.Linear(2 * width, width, bias=False)
        self.query = nn.Linear(2 * width, width)
        self.score = nn.Linear(width, 1, bias=False)
        self.cell = nn.GRUCell(width + 2 * width, 2 * width)
        self.head = nn.Linear(2 * width, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = self.embed(tokens)
        memory, _ = self.encoder(embedded)
        keys = self.keys(memory)
        state = memory[:, -1]
        decoded = []
        for step in range(self.steps):
            weights = self.score(torch.tanh(keys + self.query(state).unsqueeze(1))).softmax(1)
            context = (weights * memory).sum(1)
            state = self.cell(torch.cat([embedded[:, step], context], -1), state)
            decoded.append(state)
        states = torch.cat([torch.stack(decoded, 1), memory[:, self.steps :]], 1)
        return self.head(states)


class NystromEncoder(nn.Module):
    """A Nystromformer-like encoder: attention approximated through 16 landmarks (means of 8-token
    segments), the landmark kernel's pseudo-inverse by six Newton iterations of matrix products,
    four blocks of 128 dimensions and four heads, next-token head."""

    def __init__(self, width: int = 128, depth: int = 4, landmarks: int = 16) -> None:
        super().__init__()
        self.heads, self.landmarks = 4, landmarks
        self.embed = nn.Embedding(VOCABULARY, width)
        self.positions = nn.Parameter(torch.randn(TOKENS, width) * 0.02)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2 * depth))
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(depth))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, VOCABULARY)

    @staticmethod
    def _pseudo_inverse(kernel: torch.Tensor, iterations: int = 6) -> torch.Tensor:
        identity = torch.eye(kernel.shape[-1], dtype=kernel.dtype, device=kernel.device)
        scale = kernel.abs().sum(-1).amax(-1, keepdim=True) * kernel.abs().sum(-2).amax(-1, keepdim=True)
        inverse = kernel.transpose(-1, -2) / scale.unsqueeze(-1)
        for _ in range(iterations):
            product = kernel @ inverse
            inverse = (
                0.25
                * inverse
                @ (13 * identity - product @ (15 * identity - product @ (7 * identity - product)))
            )
        return inverse

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n, t = tokens.shape
        x = self.embed(tokens) + self.positions[:t]
        for index, mlp in enumerate(self.mlps):
            q, k, v = (
                self.qkv[index](self.norms[2 * index](x)).view(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            )
            scale = q.shape[-1] ** -0.5
            q_land = q.reshape(n, self.heads, self.landmarks, -1, q.shape[-1]).mean(3)
            k_land = k.reshape(n, self.heads, self.landmarks, -1, k.shape[-1]).mean(3)
            left = (q @ k_land.transpose(-1, -2) * scale).softmax(-1)
            middle = self._pseudo_inverse((q_land @ k_land.transpose(-1, -2) * scale).softmax(-1))
            right = (q_land @ k.transpose(-1, -2) * scale).softmax(-1) @ v
            attended = (left @ middle @ right).transpose(1, 2).reshape(n, t, -1)
            x = x + self.out[index](attended)
            x = x + mlp(self.norms[2 * index + 1](x))
        return self.head(x)


class EquilibriumMLP(nn.Module):
    """A deep-equilibrium classifier: one residual MLP cell (512 wide, layer norm, ReLU) iterated to a
    fixed point of the image's features, twelve iterations without gradients and two with them (the
    phantom gradient of implicit models), then a linear head."""

    def __init__(self, width: int = 512, settle: int = 12, trained: int = 2) -> None:
        super().__init__()
        self.settle, self.trained = settle, trained
        self.inject = nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, width)
        self.cell = nn.Sequential(
            nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU(), nn.Linear(width, width)
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        injected = self.inject(image.flatten(1))
        state = torch.zeros_like(injected)
        with torch.no_grad():
            for _ in range(self.settle):
                state = self.norm(self.cell(state) + injected)
        for _ in range(self.trained):
            state = self.norm(self.cell(state) + injected)
        return self.head(state)


class AttentionGatedUNet(nn.Module):
    """An Attention U-Net classifier: three levels of two 3x3 convolutions with batch norm (32, 64 and
    128 channels, max-pooled down, transposed convolutions up), each skip connection gated by an
    additive attention map (1x1 convolutions of the skip and the coarser signal, ReLU, a sigmoid
    map), the decoder's output pooled into a linear head."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128)) -> None:
        super().__init__()

        def block(inputs: int, outputs: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(inputs, outputs, 3, padding=1),
                nn.BatchNorm2d(outputs),
                nn.ReLU(),
                nn.Conv2d(outputs, outputs, 3, padding=1),
                nn.BatchNorm2d(outputs),
                nn.ReLU(),
            )

        self.down = nn.ModuleList(block(a, b) for a, b in zip((3, *widths[:-1]), widths, strict=True))
        self.up = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in itertools.pairwise(widths))
        self.gate_skip = nn.ModuleList(nn.Conv2d(a, a // 2, 1) for a in widths[:-1])
        self.gate_signal = nn.ModuleList(nn.Conv2d(a, a // 2, 1) for a in widths[:-1])
        self.gate_map = nn.ModuleList(nn.Conv2d(a // 2, 1, 1) for a in widths[:-1])
        self.merge = nn.ModuleList(block(2 * a, a) for a in widths[:-1])
        self.head = nn.Linear(widths[0], CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        skips, x = [], image
        for index, block in enumerate(self.down):
            x = block(x)
            if index < len(self.down) - 1:
                skips.append(x)
                x = nn.functional.max_pool2d(x, 2)
        for index in reversed(range(len(skips))):
            x = self.up[index](x)
            skip = skips[index]
            gate = torch.relu(self.gate_skip[index](skip) + self.gate_signal[index](x))
            skip = skip * torch.sigmoid(self.gate_map[index](gate))
            x = self.merge[index](torch.cat([skip, x], 1))
        return self.head(x.mean((2, 3)))


class CrossCovarianceViT(nn.Module):
    """An XCiT-like classifier: 4x4 patches (64 tokens of 128), four blocks each mixing channels by
    cross-covariance attention (per head, the 32x32 matrix of L2-normalized keys against queries
    over the tokens, a learned temperature, softmax, applied to the values) and a GELU MLP."""

    def __init__(self, width: int = 128, depth: int = 4, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Conv2d(3, width, 4, stride=4)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2 * depth))
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(depth))
        self.temperature = nn.Parameter(torch.ones(depth, heads, 1, 1))
        self.out = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(image).flatten(2).transpose(1, 2)
        n, t, _ = x.shape
        for index, mlp in enumerate(self.mlps):
            q, k, v = (
                self.qkv[index](self.norms[2 * index](x)).view(n, t, 3, self.heads, -1).permute(2, 0, 3, 4, 1)
            )
            q, k = nn.functional.normalize(q, dim=-1), nn.functional.normalize(k, dim=-1)
            weights = (q @ k.transpose(-1, -2) * self.temperature[index]).softmax(-1)
            attended = (weights @ v).permute(0, 3, 1, 2).reshape(n, t, -1)
            x = x + self.out[index](attended)
            x = x + mlp(self.norms[2 * index + 1](x))
        return self.head(x.mean(1))


class GhostModule(nn.Module):
    """Half the output channels from a 1x1 convolution, the other half from a cheap depthwise 3x3 of
    those, concatenated (GhostNet)."""

    def __init__(self, inputs: int, outputs: int, relu: bool = True) -> None:
        super().__init__()
        half = outputs // 2
        self.primary = nn.Sequential(nn.Conv2d(inputs, half, 1, bias=False), nn.BatchNorm2d(half))
        self.cheap = nn.Sequential(
            nn.Conv2d(half, half, 3, padding=1, groups=half, bias=False), nn.BatchNorm2d(half)
        )
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        primary = self.primary(x)
        primary = torch.relu(primary) if self.relu else primary
        cheap = self.cheap(primary)
        return torch.cat([primary, torch.relu(cheap) if self.relu else cheap], 1)


class GhostNetLike(nn.Module):
    """A GhostNet-like classifier: a 3x3 stem, six ghost bottlenecks (ghost module, a strided
    depthwise 3x3 where the map halves, a second ghost module without ReLU, residual where shapes
    allow) from 16 to 96 channels, pooled into a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        plan = (
            (16, 32, 16, 1),
            (16, 48, 24, 2),
            (24, 72, 24, 1),
            (24, 96, 40, 2),
            (40, 120, 40, 1),
            (40, 192, 96, 2),
        )
        self.expand = nn.ModuleList(GhostModule(a, hidden) for a, hidden, _, _ in plan)
        self.downs = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(hidden, hidden, 3, stride=2, padding=1, groups=hidden, bias=False),
                nn.BatchNorm2d(hidden),
            )
            if stride == 2
            else nn.Identity()
            for _, hidden, _, stride in plan
        )
        self.project = nn.ModuleList(GhostModule(hidden, b, relu=False) for _, hidden, b, _ in plan)
        self.residual = [a == b and stride == 1 for a, _, b, stride in plan]
        self.head = nn.Linear(96, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        for expand, down, project, residual in zip(
            self.expand, self.downs, self.project, self.residual, strict=True
        ):
            y = project(down(expand(x)))
            x = x + y if residual else y
        return self.head(x.mean((2, 3)))


class PoolFormer(nn.Module):
    """A PoolFormer-like classifier: a strided 4x4 stem to 64 channels on an 8x8 map, six blocks
    whose token mixer is a 3x3 average pool less its input, with group norms (one group) and 1x1
    convolution MLPs (4x, GELU), a strided 2x2 convolution to 128 channels halfway."""

    def __init__(self, depth: int = 6) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 4, stride=4)
        widths = [64] * (depth // 2) + [128] * (depth - depth // 2)
        self.norms = nn.ModuleList(nn.GroupNorm(1, w) for w in widths for _ in range(2))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Conv2d(w, 4 * w, 1), nn.GELU(), nn.Conv2d(4 * w, w, 1)) for w in widths
        )
        self.widen = nn.Conv2d(64, 128, 2, stride=2)
        self.switch = depth // 2
        self.head = nn.Linear(128, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        for index, mlp in enumerate(self.mlps):
            if index == self.switch:
                x = self.widen(x)
            y = self.norms[2 * index](x)
            x = x + nn.functional.avg_pool2d(y, 3, stride=1, padding=1, count_include_pad=False) - y
            x = x + mlp(self.norms[2 * index + 1](x))
        return self.head(x.mean((2, 3)))


class ConvRecurrentCTC(nn.Module):
    """A speech-recognizer-like tagger over token embeddings: two 1-D convolutions (kernel 5, the
    second strided by 2) with batch norm, a two-layer bidirectional LSTM of 128 a direction, and
    log-probabilities over ``CTC_SYMBOLS`` symbols per position, trained with CTC."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.convolutions = nn.Sequential(
            nn.Conv1d(width, width, 5, padding=2),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Conv1d(width, width, 5, stride=2, padding=2),
            nn.BatchNorm1d(width),
            nn.ReLU(),
        )
        self.recurrent = nn.LSTM(width, width, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * width, CTC_SYMBOLS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.convolutions(self.embed(tokens).transpose(1, 2)).transpose(1, 2)
        x, _ = self.recurrent(x)
        return self.head(x).log_softmax(-1).transpose(0, 1)


class MobileViTLike(nn.Module):
    """A MobileViT-like classifier: a strided convolution stem to a 16x16 map of 64 channels, then two
    MobileViT blocks (a 3x3 and a 1x1 convolution, the map cut
    into 2x2 patches whose pixels attend across patches in a two-layer transformer of 96, folded back,
    projected and fused with the input by a 3x3 convolution), pooled into a linear head."""

    def __init__(self, channels: int = 64, width: int = 96) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, stride=2, padding=1), nn.BatchNorm2d(channels), nn.SiLU()
        )
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "local": nn.Sequential(
                        nn.Conv2d(channels, channels, 3, padding=1), nn.SiLU(), nn.Conv2d(channels, width, 1)
                    ),
                    "global": nn.TransformerEncoder(
                        nn.TransformerEncoderLayer(
                            width, 4, 2 * width, 0.0, batch_first=True, norm_first=True
                        ),
                        2,
                        enable_nested_tensor=False,
                    ),
                    "project": nn.Conv2d(width, channels, 1),
                    "fuse": nn.Conv2d(2 * channels, channels, 3, padding=1),
                }
            )
            for _ in range(2)
        )
        self.head = nn.Linear(channels, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        for block in self.blocks:
            y = block["local"](x)
            n, c, h, w = y.shape
            patches = (
                y.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 3, 5, 2, 4, 1).reshape(n * 4, h * w // 4, c)
            )
            y = block["global"](patches)
            y = y.reshape(n, 2, 2, h // 2, w // 2, c).permute(0, 5, 3, 1, 4, 2).reshape(n, c, h, w)
            x = block["fuse"](torch.cat([x, block["project"](y)], 1))
        return self.head(x.mean((2, 3)))


class DualPathBlock(nn.Module):
    """A dual path block: a grouped bottleneck whose output is split into a residual part added to
    the residual path and a dense part concatenated to the dense path."""

    def __init__(self, inputs: int, residual: int, growth: int, groups: int = 8) -> None:
        super().__init__()
        self.residual = residual
        middle = 64
        self.body = nn.Sequential(
            nn.BatchNorm2d(inputs),
            nn.ReLU(),
            nn.Conv2d(inputs, middle, 1, bias=False),
            nn.BatchNorm2d(middle),
            nn.ReLU(),
            nn.Conv2d(middle, middle, 3, padding=1, groups=groups, bias=False),
            nn.BatchNorm2d(middle),
            nn.ReLU(),
            nn.Conv2d(middle, residual + growth, 1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return torch.cat(
            [x[:, : self.residual] + out[:, : self.residual], x[:, self.residual :], out[:, self.residual :]],
            1,
        )


class DualPathNet(nn.Module):
    """A DPN-like classifier: a 3x3 stem to 64 channels, two stages of three dual path blocks (a
    residual path of 64 channels, a dense path growing 16 a block), a strided average pool between
    them, pooled into a linear head."""

    def __init__(self, residual: int = 64, growth: int = 16, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, residual, 3, padding=1, bias=False), nn.BatchNorm2d(residual), nn.ReLU()
        )
        widths = [residual + growth * i for i in range(2 * blocks + 1)]
        self.blocks = nn.ModuleList(DualPathBlock(widths[i], residual, growth) for i in range(2 * blocks))
        self.down_after = blocks - 1
        self.head = nn.Linear(widths[-1], CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.stem(image)
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index == self.down_after:
                x = nn.functional.avg_pool2d(x, 2)
        return self.head(x.mean((2, 3)))


class HierarchicalAttention(nn.Module):
    """A hierarchical attention network: the tokens cut into 8 sentences of 16, each sentence's words
    through a bidirectional GRU (64 a direction) pooled by additive attention, the sentence vectors
    through another bidirectional GRU pooled the same way, and a linear head."""

    def __init__(self, width: int = 64, sentences: int = 8) -> None:
        super().__init__()
        self.sentences = sentences
        self.embed = nn.Embedding(VOCABULARY, width)
        self.words = nn.GRU(width, width, batch_first=True, bidirectional=True)
        self.sentence_rnn = nn.GRU(2 * width, width, batch_first=True, bidirectional=True)
        self.word_score = nn.Sequential(
            nn.Linear(2 * width, 2 * width), nn.Tanh(), nn.Linear(2 * width, 1, bias=False)
        )
        self.sentence_score = nn.Sequential(
            nn.Linear(2 * width, 2 * width), nn.Tanh(), nn.Linear(2 * width, 1, bias=False)
        )
        self.head = nn.Linear(2 * width, CLASSES)

    @staticmethod
    def _pool(states: torch.Tensor, score: nn.Module) -> torch.Tensor:
        return (score(states).softmax(1) * states).sum(1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n, t = tokens.shape
        words, _ = self.words(self.embed(tokens).reshape(n * self.sentences, t // self.sentences, -1))
        sentences = self._pool(words, self.word_score).reshape(n, self.sentences, -1)
        states, _ = self.sentence_rnn(sentences)
        return self.head(self._pool(states, self.sentence_score))


class AxialAttentionNet(nn.Module):
    """An axial-attention classifier: a strided 2x2 convolution to a 16x16 map of 64 channels, four
    blocks each attending along the rows and then along the columns (multi-head attention of four
    heads, pre-norm, residual) and a GELU MLP, pooled into a linear head."""

    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, width, 2, stride=2)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(3 * depth))
        self.rows = nn.ModuleList(nn.MultiheadAttention(width, 4, batch_first=True) for _ in range(depth))
        self.columns = nn.ModuleList(nn.MultiheadAttention(width, 4, batch_first=True) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(image).permute(0, 2, 3, 1)  # (n, h, w, c)
        n, h, w, c = x.shape
        for index, mlp in enumerate(self.mlps):
            y = self.norms[3 * index](x).reshape(n * h, w, c)
            x = x + self.rows[index](y, y, y, need_weights=False)[0].reshape(n, h, w, c)
            y = self.norms[3 * index + 1](x).transpose(1, 2).reshape(n * w, h, c)
            x = x + self.columns[index](y, y, y, need_weights=False)[0].reshape(n, w, h, c).transpose(1, 2)
            x = x + mlp(self.norms[3 * index + 2](x))
        return self.head(x.mean((1, 2)))


MODELS = (
    OwnModel(
        "diffusers-unet",
        "diffusers UNet2DModel (DDPM denoiser)",
        _unet,
        _denoiser_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-unet-cond",
        "diffusers UNet2DConditionModel (cross-attention denoiser)",
        _conditioned_unet,
        _conditioned_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-dit",
        "diffusers DiTTransformer2DModel (class-conditioned diffusion transformer)",
        _dit,
        _class_conditioned_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-vae",
        "diffusers AutoencoderKL (variational autoencoder)",
        _vae,
        _vae_loss,
        ImageFormat(VAE_IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-vq",
        "diffusers VQModel (vector-quantised autoencoder)",
        _vq,
        _vq_loss,
        ImageFormat(VAE_IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "xt-decoder",
        "x-transformers decoder (rotary positions, GLU feed-forward)",
        _decoder,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "xt-vit",
        "x-transformers ViTransformerWrapper (vision transformer)",
        _vit,
        _classifier_loss,
        ImageFormat(VAE_IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "xt-encoder-decoder",
        "x-transformers XTransformer (encoder-decoder)",
        _encoder_decoder,
        _translation_loss,
        TranslationFormat(VOCABULARY, TOKENS, TOKENS),
        adam=True,
    ),
    OwnModel(
        "diffusers-pixart",
        "diffusers PixArtTransformer2DModel (text-conditioned diffusion transformer)",
        _pixart,
        _pixart_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-sd3",
        "diffusers SD3Transformer2DModel (joint text-image attention)",
        _sd3,
        _sd3_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-tiny-autoencoder",
        "diffusers AutoencoderTiny (convolutional)",
        _tiny_autoencoder,
        _autoencoder_loss,
        ImageFormat(VAE_IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-unet-1d",
        "diffusers UNet1DModel (1-D denoiser)",
        _unet_1d,
        _signal_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torchtune-llama3",
        "torchtune llama3 builder (grouped-query attention, rotary)",
        _llama3,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torchtune-qwen2",
        "torchtune qwen2 builder (grouped-query attention, biased projections)",
        _qwen2,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "esm2",
        "fair-esm ESM-2 (protein masked LM)",
        _esm2,
        _protein_loss,
        LanguageModelFormat(PROTEIN_TOKENS - 1, TOKENS),
        adam=True,
    ),
    OwnModel(
        "xt-continuous",
        "x-transformers ContinuousTransformerWrapper (series regression, fused attention)",
        _continuous,
        _series_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-controlnet",
        "diffusers ControlNetModel beside a frozen UNet2DConditionModel",
        ControlledUNet,
        _controlled_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-prior",
        "diffusers PriorTransformer (image-embedding prior, causal attention over the caption)",
        _prior,
        _prior_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torchtune-gemma",
        "torchtune gemma builder (multi-query attention, 16 dimensions a head)",
        _gemma,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "xt-narrow-encoder",
        "x-transformers encoder, masked LM, 16 heads of 8 dimensions, fused attention",
        _narrow_encoder,
        _masked_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "diffusers-flux",
        "diffusers FluxTransformer2DModel (rectified flow, joint and single-stream blocks)",
        _flux,
        _flow_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "diffusers-auraflow",
        "diffusers AuraFlowTransformer2DModel (joint and single-stream blocks, 8 dimensions a head)",
        _aura_flow,
        _aura_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-mlp",
        "torch.nn MLP classifier, 3 hidden layers",
        MLPClassifier,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-wide-deep",
        "torch.nn wide linear model beside a deep MLP",
        WideAndDeep,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-actor-critic",
        "torch.nn policy and value heads on an MLP trunk",
        ActorCritic,
        _actor_critic_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-latent-attention",
        "torch.nn latents cross-attending to patches (Perceiver-like)",
        LatentAttention,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-cnn-mlp",
        "torch.nn convolutions and pools, then an MLP",
        ConvolutionalMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-token-mixer",
        "torch.nn MLP-Mixer over 16 patches",
        TokenMixer,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-causal-lm",
        "torch.nn transformer encoder layers under a causal mask",
        CausalTransformerLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-mlp-autoencoder",
        "torch.nn dense autoencoder through a 64-wide code",
        MLPAutoencoder,
        _reconstruction_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-deep-regressor",
        "torch.nn regression MLP, 6 hidden layers of 256",
        DeepRegressor,
        _regression_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-siamese",
        "torch.nn Siamese MLP scoring an image's two halves",
        SiameseMLP,
        _pair_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-vae",
        "torch.nn variational autoencoder of dense layers",
        MLPVariationalAutoencoder,
        _variational_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-gru-loop",
        "torch.nn GRUCell stepped by hand over 32 rows",
        lambda: CellLoop("gru"),
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-lstm-loop",
        "torch.nn LSTMCell stepped by hand over 32 rows",
        lambda: CellLoop("lstm"),
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-deep-sets",
        "torch.nn DeepSets over 64 patches",
        DeepSets,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-conv1d",
        "torch.nn 1-D convolutions over a signal, then an MLP",
        Convolutional1D,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-vit-classifier",
        "torch.nn transformer encoder over patches and a class token",
        TransformerClassifier,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-gru-rows",
        "torch.nn GRU, 2 layers of 384, over 32 rows",
        lambda: RecurrentRows("gru", 384, 2),
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-rnn-rows",
        "torch.nn RNN (tanh), 2 layers of 512, over 32 rows",
        lambda: RecurrentRows("rnn", 512, 2),
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-lstm-rows",
        "torch.nn LSTM, 2 layers of 384, over 32 rows",
        lambda: RecurrentRows("lstm", 384, 2),
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-bigru-rows",
        "torch.nn bidirectional GRU of 256 over 32 rows",
        lambda: RecurrentRows("gru", 256, 1, bidirectional=True),
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-gru-lm",
        "torch.nn GRU language model over 128 tokens",
        RecurrentLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-conv-gru",
        "torch.nn convolutions, then a GRU along the columns",
        ConvolutionalRecurrent,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-rnncell-loop",
        "torch.nn RNNCell stepped by hand over 32 rows",
        lambda: CellLoop("rnn", hidden=1024),
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-triplet-mlp",
        "torch.nn MLP embedding trained with a triplet margin loss",
        EmbeddingMLP,
        _triplet_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-bn-vgg",
        "torch.nn VGG-style stages: 3x3 convolutions with batch norm and max pools",
        BatchNormVGG,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-densenet",
        "torch.nn dense blocks (BN-ReLU-convolution, concatenated) with average-pool transitions",
        DenseNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-gn-resnet",
        "torch.nn residual blocks with group norm, 64x64 images",
        GroupNormResNet,
        _classifier_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-instnorm-autoencoder",
        "torch.nn encoder and decoder with instance norm, reconstructing 64x64 images",
        InstanceNormAutoencoder,
        _reconstruction_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-bn1d-signal",
        "torch.nn 1-D convolutions with batch norm and max pools over a signal",
        BatchNorm1DNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-mixer",
        "torch.nn MLP-Mixer over 64 patches (layer norms, token and channel MLPs)",
        Mixer,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-pyramid-pooling",
        "torch.nn strided convolutions with batch norm, then pyramid pooling of four average pools",
        PyramidPoolingNet,
        _classifier_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-bn-mlp",
        "torch.nn tabular MLP of four dense layers with batch norm",
        BatchNormMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-inception",
        "torch.nn inception blocks (1x1, 3x3, 5x5 convolutions and a max pool, batch norm)",
        InceptionNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-gn-unet",
        "torch.nn U-Net with group norm, reconstructing 64x64 images",
        GroupNormUNet,
        _reconstruction_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-convnext-like",
        "torch.nn ConvNeXt-like blocks: depthwise 7x7, layer norm over channels, inverted MLP",
        ConvNeXtLike,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-wide-resnet",
        "torch.nn wide residual network, pre-activation blocks with batch norm, an average pool",
        WideResNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-dcgan-discriminator",
        "torch.nn DCGAN discriminator: strided convolutions, batch norm, leaky ReLUs, 64x64",
        DCGANDiscriminator,
        _discriminator_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-squeezenet-like",
        "torch.nn fire modules with batch norm and 3x3 max pools, 64x64",
        SqueezeNetLike,
        _classifier_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-residual-ln-mlp",
        "torch.nn residual MLP with layer norms",
        ResidualNormMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-volume",
        "torch.nn 3-D convolutions with 3-D batch norm and max pools",
        VolumeNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-alexnet-lrn",
        "torch.nn AlexNet-like convolutions with local response norms and max pools, 64x64",
        AlexNetLRN,
        _classifier_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-rmsnorm-mlp",
        "torch.nn residual MLP with RMS norms",
        RMSNormMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-basic-resnet",
        "torch.nn residual network of basic blocks with batch norm",
        BasicResNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-avgpool1d",
        "torch.nn 1-D convolutions with batch norm and average pools over a signal",
        AvgPool1DNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-gn-convnet",
        "torch.nn 3x3 convolutions with group norm and max pools, 64x64",
        GroupNormConvNet,
        _classifier_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-postnorm-transformer",
        "torch.nn post-norm transformer encoder over 64 patches",
        PostNormTransformer,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-separable",
        "torch.nn depthwise separable convolutions with batch norm, 64x64",
        DepthwiseSeparableNet,
        _classifier_loss,
        ImageFormat(LARGE_IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-volume-avg",
        "torch.nn 3-D convolutions with 3-D batch norm and average pools",
        VolumeAvgNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-mbconv-se",
        "torch.nn EfficientNet-like inverted residuals with squeeze-excite, weights from N(0, 0.02^2)",
        InvertedResidualSE,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-sharp-attention",
        "torch.nn transformer encoder with attention logits scaled by 50",
        SharpAttention,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-steep-gated-mlp",
        "torch.nn residual MLP gated by sigmoids of slope 200",
        SteepGatedMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-deep-tanh-mlp",
        "torch.nn 41 tanh layers with weights at a sixth of the default scale",
        DeepTanhMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-radial-basis",
        "torch.nn convolutional features into narrow Gaussian radial basis units",
        RadialBasisNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-decay-scan",
        "torch.nn blocks weighted by running products of decays (cumprod) over the rows",
        DecayScan,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-sharp-router",
        "torch.nn dense mixture of 16 experts routed by a softmax at temperature 1/100",
        SharpRouter,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-forgetful-rnn",
        "torch.nn gated recurrence stepped by hand over 32 rows, forget gates near 0.05",
        ForgetfulRNN,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-deep-sigmoid-mlp",
        "torch.nn 49 sigmoid layers (vanishing gradients)",
        DeepSigmoidMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-stick-breaking",
        "torch.nn stick-breaking attention over patches (running products of 1 - share)",
        StickBreakingAttention,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-gumbel-router",
        "torch.nn mixture of 8 experts mixed by a Gumbel-softmax at temperature 0.02",
        GumbelRouter,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-gaussian-kernel",
        "torch.nn attention by a Gaussian kernel of the query-key distance",
        GaussianKernelAttention,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-leaky-integrator",
        "torch.nn leaky integrator stepped by hand over 96 steps",
        LeakyIntegrator,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-distilled-cnn",
        "torch.nn CNN distilled from its own teacher head at temperature 0.005",
        DistilledCNN,
        _distillation_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-survival",
        "torch.nn discrete-time survival model over 160 bins",
        DiscreteSurvival,
        _survival_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-prenorm-encoder",
        "torch.nn pre-norm transformer encoder over patches",
        PreNormEncoder,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-contrastive-towers",
        "torch.nn image and class towers trained by InfoNCE at a logit scale of 100",
        ContrastiveTowers,
        _contrastive_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-deep-relu-small-init",
        "torch.nn 61 ReLU layers with weights from N(0, 0.02^2)",
        DeepReLUSmallInit,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-steep-alibi",
        "torch.nn causal decoder with ALiBi biases of slope 2",
        SteepALiBiDecoder,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-sharp-gru-lm",
        "torch.nn GRU language model, output softmax at temperature 0.01",
        SharpGRULanguageModel,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-sinkhorn-attention",
        "torch.nn attention made doubly stochastic by Sinkhorn iterations at 0.01",
        SinkhornAttention,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-mixture-density",
        "torch.nn mixture density network of 32 narrow Gaussians",
        MixtureDensity,
        _mixture_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-row-gru",
        "torch.nn GRU over the image's rows",
        RowGRU,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-noisy-or",
        "torch.nn multiple-instance classifier, noisy-OR over 128 patches",
        NoisyOrPatches,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-decayed-retention",
        "torch.nn retention decoder, decays 0.1 to 0.8 a token",
        DecayedRetention,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-lse-pooling",
        "torch.nn CNN, class maps pooled by log-sum-exp at a sharpness of 100",
        LogSumExpPooling,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-gem-pooling",
        "torch.nn CNN, generalized-mean pooling of power 30, cosine classifier",
        GeneralizedMeanPooling,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-sharp-multilabel",
        "torch.nn CNN tagger, 100 sigmoid labels, logits x1000",
        SharpMultiLabel,
        _multi_label_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-spiking-mlp",
        "torch.nn spiking MLP over 16 time steps, exponential surrogate gradient",
        SpikingMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-layer-scale",
        "torch.nn ConvNeXt-like blocks, layer scale from 1e-6",
        LayerScaleConvNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-convmixer",
        "torch.nn ConvMixer, depthwise 5x5 and pointwise, GELU, batch norm",
        ConvMixer,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-bottleneck-resnet",
        "torch.nn ResNet of bottlenecks, 3x3 max-pooled stem",
        BottleneckResNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-hardswish-mobilenet",
        "torch.nn MobileNetV3-like network, hard-swish, squeeze-excite",
        HardSwishMobileNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-class-token-vit",
        "torch.nn ViT of nn.TransformerEncoder, class token",
        ClassTokenViT,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-tied-gpt",
        "torch.nn GPT of nn.MultiheadAttention, tied head, dropout",
        TiedGPT,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-bilstm-tagger",
        "torch.nn two-layer bidirectional LSTM tagger",
        BiLSTMTagger,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-pyramid",
        "torch.nn feature pyramid classifier, nearest upsampling",
        PyramidClassifier,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-tcn",
        "torch.nn temporal convolutional network, dilated causal 1-D convolutions",
        TemporalConvNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-pointnet",
        "torch.nn PointNet, shared 1x1 MLP with batch norm, max over points",
        PointNetClassifier,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-sparse-ranker",
        "torch.nn DLRM-like ranker, EmbeddingBag features, pairwise dot products",
        SparseFeatureRanker,
        _bucket_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-graph-conv",
        "torch.nn graph convolutions over a pixel grid, dense normalized adjacency",
        DenseGraphConv,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-highway-mlp",
        "torch.nn highway MLP, sigmoid transform gates",
        HighwayMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-gated-conv-lm",
        "torch.nn gated convolutional LM, causal 1-D convolutions, GLU",
        GatedConvLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-set-transformer",
        "torch.nn Set Transformer, induced set attention over pixels",
        InducedSetTransformer,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-coordinate-mlp",
        "torch.nn NeRF-like coordinate MLP, positional encodings, regressing colours",
        CoordinateMLP,
        _coordinate_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-atrous-pyramid",
        "torch.nn DeepLab-like atrous spatial pyramid pooling",
        AtrousPyramidNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-shuffle-units",
        "torch.nn ShuffleNet-like units, grouped 1x1, channel shuffle, depthwise",
        ShuffleUnitNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-film-cnn",
        "torch.nn CNN modulated by FiLM from its own global features",
        FiLMConditionedCNN,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-token-shift-lm",
        "torch.nn RWKV-like LM without recurrence, token shift, squared ReLU",
        TokenShiftLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-hypernetwork",
        "torch.nn hypernetwork writing a per-example MLP, batched products",
        HyperMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-capsules",
        "torch.nn capsule network, routing by agreement",
        CapsuleNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-wavenet",
        "torch.nn WaveNet, gated dilated causal 1-D convolutions",
        WaveNetClassifier,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-window-attention",
        "torch.nn Swin-like shifted window attention by hand",
        WindowAttentionNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-unet1d",
        "torch.nn 1-D U-Net, concatenated skips",
        UNet1d,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-pixel-shuffle",
        "torch.nn ESPCN-like super-resolution, pixel shuffle",
        PixelShuffleUpscaler,
        _autoencoder_mse_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-gated-conv2d",
        "torch.nn CNN of gated (GLU) convolutions",
        GatedConvNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-patch-merging",
        "torch.nn Swin-like patch merging by strided slices and concatenation",
        PatchMergingNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-channel-shift",
        "torch.nn temporal shift of channels between frames",
        ChannelShiftNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-dense-mlp",
        "torch.nn densely connected MLP, concatenated features",
        DenseMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-crnn",
        "torch.nn CRNN, CNN columns read by a bidirectional GRU",
        ConvRecurrentReader,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-siren",
        "torch.nn SIREN, sine activations over pixel coordinates",
        SineMLP,
        _coordinate_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-involution",
        "torch.nn involution layers, per-pixel kernels over unfolded patches",
        InvolutionNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-spatial-transformer",
        "torch.nn spatial transformer, affine grid sampling",
        SpatialTransformerNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-masked-conv",
        "torch.nn PixelCNN-like masked, gated convolutions",
        MaskedConvNet,
        _autoencoder_mse_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-resnext",
        "torch.nn ResNeXt-like bottlenecks, grouped 3x3 convolutions",
        ResNeXtNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-linear-attention-lm",
        "torch.nn causal linear-attention LM, cumulative sums",
        LinearAttentionLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-coupling-flow",
        "torch.nn RealNVP-like affine coupling flow, negative log-likelihood",
        CouplingFlow,
        _flow_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-neural-ode",
        "torch.nn neural ODE, fixed-step Runge-Kutta solver",
        NeuralODE,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-fourier-operator",
        "torch.nn Fourier neural operator, spectral convolutions by FFT",
        FourierOperator,
        _autoencoder_mse_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-message-passing",
        "torch.nn message-passing graph network, gathers and index_add",
        MessagePassingNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-product-keys",
        "torch.nn product-key memory, top-k and embedding bags",
        ProductKeyMemory,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-state-space",
        "torch.nn S4D-like diagonal state space LM, FFT convolutions",
        DiagonalStateSpace,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-rotary-lm",
        "torch.nn decoder with rotary embeddings and RMS norms by hand",
        RotaryLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-upsampling-decoder",
        "torch.nn autoencoder, bilinear and transposed-convolution upsampling",
        UpsamplingDecoder,
        _autoencoder_mse_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-complex-cnn",
        "torch.nn complex-valued CNN, complex convolutions and a split ReLU",
        ComplexConvNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-double-mlp",
        "torch.nn tanh MLP in float64",
        DoublePrecisionMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-perceiver",
        "torch.nn Perceiver-like latent cross-attention classifier",
        Perceiver,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-conformer",
        "torch.nn Conformer encoder, attention and depthwise convolution modules",
        Conformer,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-segment-memory-lm",
        "torch.nn Transformer-XL-like LM, each segment attending to the last one's states",
        SegmentMemoryLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-slot-attention",
        "torch.nn slot attention over CNN features, GRUCell updates",
        SlotAttention,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-hourglass-lm",
        "torch.nn hourglass decoder LM, tokens shortened and repeated back",
        HourglassLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-object-queries",
        "torch.nn DETR-like object queries decoding CNN features (TransformerDecoder)",
        ObjectQueryDecoder,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-gmlp",
        "torch.nn gMLP, spatial gating units across patches",
        SpatialGatingMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-shared-layer-lm",
        "torch.nn ALBERT-like LM, one encoder layer applied six times",
        SharedLayerEncoder,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-cellular-automaton",
        "torch.nn neural cellular automaton, eight stochastic update steps",
        NeuralCellularAutomaton,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-random-feature-lm",
        "torch.nn Performer-like LM, causal attention by random features and running sums",
        RandomFeatureAttentionLM,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-additive-attention",
        "torch.nn Bahdanau-style decoder, a GRUCell stepped by hand with additive attention",
        AdditiveAttentionDecoder,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-nystrom-encoder",
        "torch.nn Nystromformer-like encoder, landmark attention and an iterative pseudo-inverse",
        NystromEncoder,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-equilibrium-mlp",
        "torch.nn deep-equilibrium MLP, fixed-point iterations with and without gradients",
        EquilibriumMLP,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-attention-unet",
        "torch.nn Attention U-Net, skip connections gated by additive attention maps",
        AttentionGatedUNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-xcit",
        "torch.nn XCiT-like classifier, cross-covariance attention over channels",
        CrossCovarianceViT,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-ghostnet",
        "torch.nn GhostNet-like classifier, ghost modules and strided depthwise convolutions",
        GhostNetLike,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-poolformer",
        "torch.nn PoolFormer-like classifier, average pooling as the token mixer, group norms",
        PoolFormer,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-conv-lstm-ctc",
        "torch.nn speech-recognizer-like tagger, 1-D convolutions, a BiLSTM and CTC loss",
        ConvRecurrentCTC,
        _ctc_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-mobilevit",
        "torch.nn MobileViT-like classifier, convolutions and transformers over unfolded patches",
        MobileViTLike,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "torch-dual-path",
        "torch.nn DPN-like classifier, residual and densely connected paths in one block",
        DualPathNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=False,
    ),
    OwnModel(
        "torch-hierarchical-attention",
        "torch.nn hierarchical attention network, word and sentence GRUs pooled by attention",
        HierarchicalAttention,
        _sequence_label_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
    OwnModel(
        "torch-axial-attention",
        "torch.nn axial-attention classifier, attention along rows and then columns",
        AxialAttentionNet,
        _classifier_loss,
        ImageFormat(IMAGE_SIZE, CLASSES),
        adam=True,
    ),
    OwnModel(
        "xt-narrow-decoder",
        "x-transformers decoder, 16 heads of 16 dimensions, fused attention, GLU feed-forward",
        _narrow_decoder,
        _next_token_loss,
        LanguageModelFormat(VOCABULARY, TOKENS),
        adam=True,
    ),
)


def _task(model: OwnModel) -> Callable[[Any, torch.device], Task]:
    def make(_: Any, device: torch.device) -> Task:
        network = model.build().to(device).train()
        if model.adam:
            optimizer: torch.optim.Optimizer = torch.optim.AdamW(network.parameters(), lr=1e-4)
        else:
            optimizer = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)
        return SupervisedTask(network, model.loss, optimizer)

    return make


def register_all() -> None:
    """Register every model of :data:`MODELS` as a workload (once)."""
    for model in MODELS:
        if model.name in REGISTRY:
            continue
        register(
            Workload(
                name=model.name,
                domain="user model",
                summary=model.summary,
                presets={"small": {"model": model.name}},
                default_batch_size={"small": 4},
                make_task=_task(model),
                make_data=lambda _, data=model.data: data,
            )
        )
