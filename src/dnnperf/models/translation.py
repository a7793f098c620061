"""Machine-translation models in plain PyTorch: GNMT-style LSTM Seq2Seq and the Transformer (base).

``Seq2Seq`` follows MLPerf's GNMT reference (Wu et al. 2016 as trimmed by MLPerf): a bidirectional first
encoder layer, residual LSTM layers from the third layer on, and a decoder whose first LSTM drives a
normalised Bahdanau attention whose context feeds every later decoder layer. ``Transformer`` is the
encoder-decoder of Vaswani et al. 2017 (post-norm, sinusoidal positions, one vocabulary shared by source,
target and the output projection).

Attention is written out with separate ``q_proj``/``k_proj``/``v_proj``/``out_proj`` ``nn.Linear`` layers
and ``F.scaled_dot_product_attention`` (no ``nn.MultiheadAttention``) so that per-layer profilers can hook
each projection and tensor parallelism can split them Megatron-style (column-parallel q/k/v and ``fc1``,
row-parallel ``out_proj`` and ``fc2``). ``MultiHeadAttention`` and ``FeedForward`` are reused by GPT-2.

Synthetic batches are fixed-length, so neither model takes padding masks.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "SEQ2SEQ_PRESETS",
    "TRANSFORMER_PRESETS",
    "BahdanauAttention",
    "FeedForward",
    "GNMTDecoder",
    "GNMTEncoder",
    "MultiHeadAttention",
    "Seq2Seq",
    "Seq2SeqConfig",
    "Transformer",
    "TransformerConfig",
    "TransformerDecoderLayer",
    "TransformerEncoderLayer",
    "sinusoidal_positions",
]


# ---------------------------------------------------------------------------------------------------------
# Shared transformer building blocks
# ---------------------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention with separate q/k/v/out projections.

    Self-attention when ``memory`` is None, cross-attention over ``memory`` otherwise.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, memory: Tensor | None = None, causal: bool = False) -> Tensor:
        """Attend from ``x`` [B, T, D] to itself or to ``memory`` [B, S, D]; returns [B, T, D]."""
        kv = x if memory is None else memory
        b, t, _ = x.shape
        s = kv.shape[1]
        # The head count is inferred (-1) from the projection width so that a tensor-parallel rank holding
        # a column slice of q/k/v runs the same code with its local heads.
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(kv).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(kv).view(b, s, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=causal
        )
        return self.out_proj(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """Position-wise two-layer MLP ``fc2(act(fc1(x)))``."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        if activation == "relu":
            self.activation: nn.Module = nn.ReLU()
        elif activation == "gelu":
            # GPT-2 uses the tanh approximation of GELU.
            self.activation = nn.GELU(approximate="tanh")
        else:
            raise ValueError(f"unknown activation {activation!r}")
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the MLP to [..., D]."""
        return self.fc2(self.activation(self.fc1(x)))


def sinusoidal_positions(length: int, d_model: int, device: torch.device | str | None = None) -> Tensor:
    """Fixed sine/cosine position table [length, d_model] of Vaswani et al. (sin on even, cos on odd)."""
    position = torch.arange(length, dtype=torch.float32, device=device).unsqueeze(1)
    even = torch.arange(0, d_model, 2, dtype=torch.float32, device=device)
    inv_freq = torch.exp(even * (-math.log(10000.0) / d_model))  # 1 / 10000^(2i / d)
    table = torch.zeros(length, d_model, device=device)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table


# ---------------------------------------------------------------------------------------------------------
# GNMT-style Seq2Seq (MLPerf GNMT reference)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seq2SeqConfig:
    """GNMT hyper-parameters. ``src_len``/``tgt_len`` are the synthetic sequence lengths of the workload."""

    vocab_size: int = 32320
    hidden: int = 1024
    num_layers: int = 4
    dropout: float = 0.2
    src_len: int = 50
    tgt_len: int = 50
    # MLPerf GNMT shares one embedding between encoder and decoder (its vocabulary is joint BPE).
    share_embedding: bool = True

    def __post_init__(self) -> None:
        if self.num_layers < 2:
            raise ValueError("GNMT needs at least 2 layers (a bidirectional one and a unidirectional one)")


class BahdanauAttention(nn.Module):
    """Normalised additive attention (Bahdanau et al. 2015 with the weight-normalised score of GNMT).

    ``score(q, k) = (g * v / ||v||) . tanh(W_q q + W_k k + b)``; the context is the softmax-weighted sum of
    the raw keys (the encoder outputs).
    """

    def __init__(self, query_size: int, key_size: int, num_units: int, init_range: float = 0.1) -> None:
        super().__init__()
        self.linear_q = nn.Linear(query_size, num_units, bias=False)
        self.linear_k = nn.Linear(key_size, num_units, bias=False)
        self.linear_att = nn.Parameter(torch.empty(num_units).uniform_(-init_range, init_range))
        # g and b of the normalised form; g starts at 1/sqrt(units) as in the TF/MLPerf implementation.
        self.normalize_scalar = nn.Parameter(torch.full((1,), 1.0 / math.sqrt(num_units)))
        self.normalize_bias = nn.Parameter(torch.zeros(num_units))

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        """Context vectors [B, T, K] for queries [B, T, Q] over keys [B, S, K]."""
        q = self.linear_q(query)  # [B, T, U]
        k = self.linear_k(keys)  # [B, S, U]
        # Additive scoring needs the full [B, T, S, U] tanh; the reference computes it the same way.
        hidden = torch.tanh(q.unsqueeze(2) + k.unsqueeze(1) + self.normalize_bias)
        v = self.linear_att / self.linear_att.norm() * self.normalize_scalar
        scores = hidden @ v  # [B, T, S]
        weights = torch.softmax(scores, dim=-1)
        return weights @ keys


class GNMTEncoder(nn.Module):
    """Bidirectional first layer, then unidirectional LSTMs with residual connections from layer 3 on."""

    def __init__(self, config: Seq2SeqConfig, embedding: nn.Embedding) -> None:
        super().__init__()
        h = config.hidden
        self.embedding = embedding
        self.dropout = nn.Dropout(config.dropout)
        layers = [
            nn.LSTM(h, h, batch_first=True, bidirectional=True),
            nn.LSTM(2 * h, h, batch_first=True),
        ]
        layers += [nn.LSTM(h, h, batch_first=True) for _ in range(config.num_layers - 2)]
        self.layers = nn.ModuleList(layers)

    def forward(self, src: Tensor) -> Tensor:
        """Encoder outputs [B, S, H] for source tokens [B, S]."""
        x = self.dropout(self.embedding(src))
        for i, lstm in enumerate(self.layers):
            residual = x
            x, _ = lstm(x if i == 0 else self.dropout(x))
            # Layers 0 and 1 change the width (H -> 2H -> H), so residuals start at the third layer.
            if i >= 2:
                x = x + residual
        return x


class GNMTDecoder(nn.Module):
    """Attention LSTM + normalised Bahdanau attention, then LSTMs fed [hidden; context], then vocab logits."""

    def __init__(self, config: Seq2SeqConfig, embedding: nn.Embedding) -> None:
        super().__init__()
        h = config.hidden
        self.embedding = embedding
        self.dropout = nn.Dropout(config.dropout)
        self.attention_rnn = nn.LSTM(h, h, batch_first=True)
        self.attention = BahdanauAttention(h, h, h)
        self.layers = nn.ModuleList(
            [nn.LSTM(2 * h, h, batch_first=True) for _ in range(config.num_layers - 1)]
        )
        self.classifier = nn.Linear(h, config.vocab_size)

    def forward(self, tgt_in: Tensor, memory: Tensor) -> Tensor:
        """Logits [B, T, V] for teacher-forced target inputs [B, T] and encoder outputs [B, S, H]."""
        x, _ = self.attention_rnn(self.embedding(tgt_in))
        # GNMT queries attention with the first decoder layer's output; because that layer does not consume
        # the context, teacher forcing lets the whole target sequence attend in one batched call.
        context = self.attention(x, memory)
        for i, lstm in enumerate(self.layers):
            residual = x
            x, _ = lstm(torch.cat((self.dropout(x), context), dim=-1))
            # As in the encoder: the first layer after attention has no residual, the rest do.
            if i >= 1:
                x = x + residual
        return self.classifier(x)


class Seq2Seq(nn.Module):
    """GNMT-style LSTM encoder-decoder with attention (MLPerf GNMT)."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = config
        src_embedding = nn.Embedding(config.vocab_size, config.hidden)
        tgt_embedding = (
            src_embedding if config.share_embedding else nn.Embedding(config.vocab_size, config.hidden)
        )
        self.encoder = GNMTEncoder(config, src_embedding)
        self.decoder = GNMTDecoder(config, tgt_embedding)
        self._init_weights()

    def _init_weights(self, init_range: float = 0.1) -> None:
        # GNMT initialises every weight uniformly in [-0.1, 0.1]; the attention's normalisation parameters
        # keep their own initial values.
        skip = {id(self.decoder.attention.normalize_scalar), id(self.decoder.attention.normalize_bias)}
        for p in self.parameters():
            if id(p) not in skip:
                nn.init.uniform_(p, -init_range, init_range)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits [B, T, V] for source tokens [B, S] and teacher-forced target inputs [B, T] (int64)."""
        return self.decoder(tgt_in, self.encoder(src))


SEQ2SEQ_PRESETS: dict[str, Seq2SeqConfig] = {
    "tiny": Seq2SeqConfig(vocab_size=256, hidden=32, num_layers=4, dropout=0.2, src_len=12, tgt_len=12),
    "small": Seq2SeqConfig(vocab_size=4096, hidden=256, num_layers=4, dropout=0.2, src_len=24, tgt_len=24),
    # MLPerf GNMT: joint BPE vocabulary of 32320, 1024 units, 4+4 layers; 50 tokens covers the bulk of
    # WMT16 En-De sentences (MLPerf trains with max_length_train = 50).
    "full": Seq2SeqConfig(vocab_size=32320, hidden=1024, num_layers=4, dropout=0.2, src_len=50, tgt_len=50),
}


# ---------------------------------------------------------------------------------------------------------
# Transformer (Vaswani et al. 2017, base)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerConfig:
    """Transformer hyper-parameters. ``src_len``/``tgt_len`` are the synthetic sequence lengths;
    ``max_len`` is the longest sequence the model is meant for (positions are computed, not learned)."""

    vocab_size: int = 37000
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dropout: float = 0.1
    src_len: int = 128
    tgt_len: int = 128
    max_len: int = 1024

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads != 0:
            raise ValueError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if max(self.src_len, self.tgt_len) > self.max_len:
            raise ValueError("src_len/tgt_len exceed max_len")


class TransformerEncoderLayer(nn.Module):
    """Post-norm encoder layer: ``x = LN(x + Drop(SelfAttn(x)))``, ``x = LN(x + Drop(FFN(x)))``."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.d_model, config.num_heads, config.dropout)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff, activation="relu")
        self.norm2 = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Encode [B, S, D]."""
        x = self.norm1(x + self.dropout(self.self_attn(x)))
        return self.norm2(x + self.dropout(self.ffn(x)))


class TransformerDecoderLayer(nn.Module):
    """Post-norm decoder layer: causal self-attention, cross-attention over the encoder output, FFN."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config.d_model, config.num_heads, config.dropout)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.cross_attn = MultiHeadAttention(config.d_model, config.num_heads, config.dropout)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff, activation="relu")
        self.norm3 = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        """Decode [B, T, D] given the encoder output [B, S, D]."""
        x = self.norm1(x + self.dropout(self.self_attn(x, causal=True)))
        x = self.norm2(x + self.dropout(self.cross_attn(x, memory)))
        return self.norm3(x + self.dropout(self.ffn(x)))


class Transformer(nn.Module):
    """Encoder-decoder Transformer with a shared, output-tied embedding and sinusoidal positions."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(
            [TransformerEncoderLayer(config) for _ in range(config.num_encoder_layers)]
        )
        self.decoder_layers = nn.ModuleList(
            [TransformerDecoderLayer(config) for _ in range(config.num_decoder_layers)]
        )
        # A Linear module (rather than a bare matmul) so the vocabulary projection can be hooked; it shares
        # its weight with the embedding, as in the paper (section 3.4).
        self.output_projection = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights()
        self.output_projection.weight = self.embedding.weight

    def _init_weights(self) -> None:
        # Xavier-uniform projections (tensor2tensor / fairseq); embedding N(0, d^-1/2) so that the
        # sqrt(d)-scaled input and the tied output logits both start at unit scale.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=self.config.d_model**-0.5)

    def _embed(self, tokens: Tensor) -> Tensor:
        if tokens.shape[1] > self.config.max_len:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens exceeds max_len {self.config.max_len}")
        x = self.embedding(tokens) * math.sqrt(self.config.d_model)
        # Computed per call rather than cached in a buffer: a handful of tiny kernels, and a model built on
        # the meta device and materialised later needs no extra step to fill a non-parameter table.
        positions = sinusoidal_positions(tokens.shape[1], self.config.d_model, device=tokens.device)
        return self.dropout(x + positions.to(x.dtype))

    def encode(self, src: Tensor) -> Tensor:
        """Encoder output [B, S, D] for source tokens [B, S]."""
        x = self._embed(src)
        for layer in self.encoder_layers:
            x = layer(x)
        return x

    def decode(self, tgt_in: Tensor, memory: Tensor) -> Tensor:
        """Decoder hidden states [B, T, D] for target inputs [B, T] and encoder output [B, S, D]."""
        x = self._embed(tgt_in)
        for layer in self.decoder_layers:
            x = layer(x, memory)
        return x

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits [B, T, V] for source tokens [B, S] and teacher-forced (causal) target inputs [B, T]."""
        return self.output_projection(self.decode(tgt_in, self.encode(src)))


TRANSFORMER_PRESETS: dict[str, TransformerConfig] = {
    "tiny": TransformerConfig(
        vocab_size=256,
        d_model=64,
        num_heads=4,
        d_ff=128,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout=0.1,
        src_len=12,
        tgt_len=12,
        max_len=64,
    ),
    "small": TransformerConfig(
        vocab_size=4096,
        d_model=256,
        num_heads=4,
        d_ff=1024,
        num_encoder_layers=3,
        num_decoder_layers=3,
        dropout=0.1,
        src_len=32,
        tgt_len=32,
        max_len=256,
    ),
    # Transformer base on WMT14 En-De (37000 shared BPE tokens). 128 tokens per side: a bucket of long
    # sentences (fairseq caps at 256, the mean is ~30), long enough for attention to show in the profile.
    "full": TransformerConfig(
        vocab_size=37000,
        d_model=512,
        num_heads=8,
        d_ff=2048,
        num_encoder_layers=6,
        num_decoder_layers=6,
        dropout=0.1,
        src_len=128,
        tgt_len=128,
        max_len=1024,
    ),
}
