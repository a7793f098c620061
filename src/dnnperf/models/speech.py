"""Speech-recognition models in plain PyTorch: DeepSpeech2 (Amodei et al. 2016) as in deepspeech.pytorch.

Spectrogram [B, T, F] -> two Conv2d blocks (BatchNorm, Hardtanh(0, 20)) with strides (2, 2) and (2, 1) over
(frequency, time) -> a stack of bidirectional GRUs whose two directions are summed, with sequence-wise
BatchNorm on the input of every layer but the first -> BatchNorm + Linear to the characters -> CTC
log-probabilities [T', B, V] (blank at index 0), T' = ceil(T / 2).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "DEEPSPEECH2_PRESETS",
    "BatchRNN",
    "DeepSpeech2",
    "DeepSpeech2Config",
    "Lookahead",
    "conv_output_features",
    "output_lengths",
]

# (kernel, stride, padding) of the two convolutions as (frequency, time), from deepspeech.pytorch.
_CONV_GEOMETRY: tuple[tuple[tuple[int, int], tuple[int, int], tuple[int, int]], ...] = (
    ((41, 11), (2, 2), (20, 5)),
    ((21, 11), (2, 1), (10, 5)),
)
# Future context of the lookahead convolution that replaces the backward direction when unidirectional.
_LOOKAHEAD_CONTEXT = 20


@dataclass(frozen=True)
class DeepSpeech2Config:
    """DeepSpeech2 hyper-parameters. ``num_frames``/``transcript_len`` are the synthetic utterance length
    (10 ms frames) and target length of the workload; ``vocab_size`` includes the CTC blank at index 0."""

    num_features: int = 161
    num_frames: int = 1000
    hidden: int = 800
    num_rnn_layers: int = 5
    vocab_size: int = 29
    conv_channels: int = 32
    transcript_len: int = 150
    bidirectional: bool = True

    def __post_init__(self) -> None:
        frames_out = (self.num_frames + 1) // 2
        if self.transcript_len > frames_out:
            raise ValueError(f"transcript_len {self.transcript_len} exceeds the {frames_out} CTC frames")


def _conv_out(length: int | Tensor, axis: int) -> int | Tensor:
    """Size along ``axis`` (0 frequency, 1 time) after both convolutions (dilation 1)."""
    for kernel, stride, padding in _CONV_GEOMETRY:
        length = (length + 2 * padding[axis] - kernel[axis]) // stride[axis] + 1
    return length


def conv_output_features(num_features: int) -> int:
    """Frequency bins left after the convolutions (161 -> 41)."""
    return int(_conv_out(num_features, 0))


def output_lengths(config: DeepSpeech2Config, input_lengths: Tensor) -> Tensor:
    """Number of CTC frames (int64) produced for utterances of ``input_lengths`` frames.

    The geometry is fixed by the architecture; ``config`` is taken so callers need not know that.
    """
    del config  # kernels, strides and padding do not depend on the configuration
    return _conv_out(input_lengths.long(), 1)


class BatchRNN(nn.Module):
    """Optional sequence-wise BatchNorm on the input, then a (bi)directional GRU with summed directions."""

    def __init__(self, input_size: int, hidden: int, bidirectional: bool, batch_norm: bool) -> None:
        super().__init__()
        self.batch_norm = nn.BatchNorm1d(input_size) if batch_norm else None
        self.rnn = nn.GRU(input_size, hidden, bidirectional=bidirectional)
        self.bidirectional = bidirectional

    def forward(self, x: Tensor, lengths: Tensor | None) -> Tensor:
        """Map [T, B, I] to [T, B, H]; ``lengths`` (CPU int64) packs the batch when it has padding."""
        t, b, _ = x.shape
        if self.batch_norm is not None:
            # Normalise over all (time, batch) positions, as deepspeech.pytorch's SequenceWise wrapper.
            x = self.batch_norm(x.reshape(t * b, -1)).view(t, b, -1)
        if lengths is None:
            x, _ = self.rnn(x)
        else:
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
            x, _ = nn.utils.rnn.pad_packed_sequence(self.rnn(packed)[0], total_length=t)
        if self.bidirectional:
            x = x.view(t, b, 2, -1).sum(dim=2)
        return x


class Lookahead(nn.Module):
    """Depth-wise convolution over future frames (Wang et al. 2016) for the unidirectional variant."""

    def __init__(self, features: int, context: int) -> None:
        super().__init__()
        self.context = context
        self.conv = nn.Conv1d(features, features, kernel_size=context, groups=features, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Map [T, B, H] to [T, B, H] using frames t..t+context-1."""
        y = F.pad(x.permute(1, 2, 0), (0, self.context - 1))
        return self.conv(y).permute(2, 0, 1)


class DeepSpeech2(nn.Module):
    """DeepSpeech2 acoustic model producing CTC log-probabilities."""

    def __init__(self, config: DeepSpeech2Config) -> None:
        super().__init__()
        self.config = config
        c = config.conv_channels
        (k1, s1, p1), (k2, s2, p2) = _CONV_GEOMETRY
        self.conv1 = nn.Conv2d(1, c, kernel_size=k1, stride=s1, padding=p1)
        self.bn1 = nn.BatchNorm2d(c)
        # Separate activation modules (not one shared instance) so per-layer hooks see each call site.
        self.act1 = nn.Hardtanh(0.0, 20.0, inplace=True)
        self.conv2 = nn.Conv2d(c, c, kernel_size=k2, stride=s2, padding=p2)
        self.bn2 = nn.BatchNorm2d(c)
        self.act2 = nn.Hardtanh(0.0, 20.0, inplace=True)
        rnn_input = c * conv_output_features(config.num_features)
        self.rnns = nn.ModuleList(
            [
                BatchRNN(
                    rnn_input if i == 0 else config.hidden,
                    config.hidden,
                    config.bidirectional,
                    batch_norm=i > 0,
                )
                for i in range(config.num_rnn_layers)
            ]
        )
        self.lookahead = None if config.bidirectional else Lookahead(config.hidden, _LOOKAHEAD_CONTEXT)
        self.lookahead_act = None if config.bidirectional else nn.Hardtanh(0.0, 20.0, inplace=True)
        self.fc_norm = nn.BatchNorm1d(config.hidden)
        self.fc = nn.Linear(config.hidden, config.vocab_size, bias=False)

    def forward(self, features: Tensor, feature_lengths: Tensor) -> tuple[Tensor, Tensor]:
        """CTC inputs for spectrograms [B, T, F] (float) with valid lengths [B] (int64).

        Returns ``(log_probs [T', B, V], output_lengths [B] int64)`` ready for ``F.ctc_loss``.
        """
        out_lengths = output_lengths(self.config, feature_lengths)
        x = features.transpose(1, 2).unsqueeze(1)  # [B, 1, F, T]
        t_out = int(_conv_out(x.shape[-1], 1))
        # Packing and masking only matter for padded batches; the synthetic full-length batches skip them
        # (one small host copy of the lengths decides, and packing needs them on the host anyway).
        lengths_cpu = out_lengths.cpu()
        padded = bool((lengths_cpu < t_out).any())
        mask = (
            (torch.arange(t_out, device=x.device) < out_lengths[:, None])[:, None, None, :]
            if padded
            else None
        )

        x = self.act1(self.bn1(self.conv1(x)))
        if mask is not None:
            # Zero the padding so later layers see the same input whatever the batch's longest utterance.
            x = x * mask
        x = self.act2(self.bn2(self.conv2(x)))
        if mask is not None:
            x = x * mask

        b, c, f, t = x.shape
        x = x.reshape(b, c * f, t).permute(2, 0, 1).contiguous()  # [T', B, C*F']
        for rnn in self.rnns:
            x = rnn(x, lengths_cpu if padded else None)
        if self.lookahead is not None and self.lookahead_act is not None:
            x = self.lookahead_act(self.lookahead(x))
        x = self.fc(self.fc_norm(x.reshape(t * b, -1))).view(t, b, -1)
        return F.log_softmax(x, dim=-1), out_lengths


DEEPSPEECH2_PRESETS: dict[str, DeepSpeech2Config] = {
    "tiny": DeepSpeech2Config(
        num_features=32,
        num_frames=64,
        hidden=32,
        num_rnn_layers=2,
        vocab_size=29,
        conv_channels=8,
        transcript_len=8,
    ),
    "small": DeepSpeech2Config(
        num_features=81,
        num_frames=200,
        hidden=256,
        num_rnn_layers=3,
        vocab_size=29,
        conv_channels=16,
        transcript_len=30,
    ),
    # deepspeech.pytorch's GRU configuration (--rnn-type gru --hidden-size 800 --hidden-layers 5) on
    # 161-bin spectrograms (20 ms windows, 10 ms hop, 16 kHz); 1000 frames = 10 s of audio (LibriSpeech
    # utterances average ~12 s); ~15 characters per second of read speech gives 150.
    "full": DeepSpeech2Config(
        num_features=161,
        num_frames=1000,
        hidden=800,
        num_rnn_layers=5,
        vocab_size=29,
        conv_channels=32,
        transcript_len=150,
    ),
}
