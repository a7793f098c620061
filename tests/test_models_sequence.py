"""Tests of the sequence and recommendation models: GNMT, Transformer, GPT-2, DeepSpeech2 and NeuMF.

Full-size parameter counts are checked on the meta device against closed-form counts derived from the
configs (independently of the module code); everything that runs does so at the "tiny" presets.
"""

import dataclasses
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dnnperf.models.language import GPT2, GPT2_PRESETS, GPT2Config
from dnnperf.models.recommendation import NEUMF_PRESETS, NeuMF, NeuMFConfig
from dnnperf.models.speech import DEEPSPEECH2_PRESETS, DeepSpeech2, DeepSpeech2Config, output_lengths
from dnnperf.models.translation import (
    SEQ2SEQ_PRESETS,
    TRANSFORMER_PRESETS,
    Seq2Seq,
    Seq2SeqConfig,
    Transformer,
    TransformerConfig,
    sinusoidal_positions,
)

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

ALL_PRESETS = {
    "seq2seq": (SEQ2SEQ_PRESETS, Seq2Seq),
    "transformer": (TRANSFORMER_PRESETS, Transformer),
    "gpt2": (GPT2_PRESETS, GPT2),
    "deepspeech2": (DEEPSPEECH2_PRESETS, DeepSpeech2),
    "neumf": (NEUMF_PRESETS, NeuMF),
}

GPT2_SMALL_PARAMS = 124_439_808


def _num_params(model: nn.Module) -> int:
    # parameters() de-duplicates shared tensors, so tied embeddings count once.
    return sum(p.numel() for p in model.parameters())


def _meta_params(cls: type[nn.Module], config: object) -> int:
    with torch.device("meta"):
        return _num_params(cls(config))


def _assert_close(actual: int, expected: int, rel: float = 1e-3) -> None:
    assert abs(actual - expected) <= rel * expected, f"{actual:,} parameters, expected {expected:,}"


# ----------------------------------------------------------------------------------------------------------
# Closed-form parameter counts
# ----------------------------------------------------------------------------------------------------------


def _lstm(inp: int, hidden: int, directions: int = 1) -> int:
    # Four gates, input and recurrent weights, two bias vectors (PyTorch's b_ih and b_hh).
    return directions * (4 * hidden * (inp + hidden) + 2 * 4 * hidden)


def _gru(inp: int, hidden: int, directions: int = 1) -> int:
    return directions * (3 * hidden * (inp + hidden) + 2 * 3 * hidden)


def expected_seq2seq_params(c: Seq2SeqConfig) -> int:
    h, v, n = c.hidden, c.vocab_size, c.num_layers
    embeddings = v * h * (1 if c.share_embedding else 2)
    encoder = _lstm(h, h, 2) + _lstm(2 * h, h) + (n - 2) * _lstm(h, h)
    attention = 2 * h * h + h + 1 + h  # W_q, W_k, v, g, b
    decoder = _lstm(h, h) + attention + (n - 1) * _lstm(2 * h, h) + (h * v + v)
    return embeddings + encoder + decoder


def expected_transformer_params(c: TransformerConfig) -> int:
    d, f = c.d_model, c.d_ff
    attention = 4 * (d * d + d)
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    # One embedding matrix shared by source, target and (tied) output projection, which has no bias.
    return c.vocab_size * d + c.num_encoder_layers * encoder_layer + c.num_decoder_layers * decoder_layer


def expected_gpt2_params(c: GPT2Config) -> int:
    d = c.n_embd
    block = 2 * (2 * d) + 4 * (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return c.vocab_size * d + c.seq_len * d + c.n_layer * block + 2 * d


def expected_deepspeech2_params(c: DeepSpeech2Config) -> int:
    ch, h = c.conv_channels, c.hidden
    conv = (ch * 41 * 11 + ch) + 2 * ch + (ch * ch * 21 * 11 + ch) + 2 * ch
    freq = (c.num_features + 2 * 20 - 41) // 2 + 1
    freq = (freq + 2 * 10 - 21) // 2 + 1
    directions = 2 if c.bidirectional else 1
    rnns = _gru(ch * freq, h, directions) + (c.num_rnn_layers - 1) * (2 * h + _gru(h, h, directions))
    lookahead = 0 if c.bidirectional else h * 20
    return conv + rnns + lookahead + 2 * h + h * c.vocab_size


def expected_neumf_params(c: NeuMFConfig) -> int:
    rows = c.num_users + c.num_items
    embeddings = rows * (c.mf_dim + c.mlp_layers[0] // 2)
    mlp = sum(a * b + b for a, b in pairwise(c.mlp_layers))
    return embeddings + mlp + (c.mf_dim + c.mlp_layers[-1] + 1)


def test_gpt2_small_parameter_count() -> None:
    assert expected_gpt2_params(GPT2_PRESETS["full"]) == GPT2_SMALL_PARAMS
    _assert_close(_meta_params(GPT2, GPT2_PRESETS["full"]), GPT2_SMALL_PARAMS)


@pytest.mark.parametrize(
    ("cls", "config", "expected"),
    [
        (Seq2Seq, SEQ2SEQ_PRESETS["full"], expected_seq2seq_params),
        (
            Seq2Seq,
            dataclasses.replace(SEQ2SEQ_PRESETS["full"], share_embedding=False),
            expected_seq2seq_params,
        ),
        (Transformer, TRANSFORMER_PRESETS["full"], expected_transformer_params),
        (GPT2, GPT2_PRESETS["full"], expected_gpt2_params),
        (DeepSpeech2, DEEPSPEECH2_PRESETS["full"], expected_deepspeech2_params),
        (
            DeepSpeech2,
            dataclasses.replace(DEEPSPEECH2_PRESETS["full"], bidirectional=False),
            expected_deepspeech2_params,
        ),
        (NeuMF, NEUMF_PRESETS["full"], expected_neumf_params),
    ],
    ids=["gnmt", "gnmt-separate-emb", "transformer-base", "gpt2-small", "ds2", "ds2-uni", "neumf"],
)
def test_full_parameter_counts(cls: type[nn.Module], config: Any, expected: Callable[[Any], int]) -> None:
    _assert_close(_meta_params(cls, config), expected(config))


def test_full_parameter_counts_are_published_sizes() -> None:
    # Sanity anchors for the closed forms: GNMT ~160 M, Transformer base ~63 M (tied), NeuMF ~31.8 M.
    assert expected_seq2seq_params(SEQ2SEQ_PRESETS["full"]) == 160_671_297
    assert expected_transformer_params(TRANSFORMER_PRESETS["full"]) == 63_082_496
    assert expected_deepspeech2_params(DEEPSPEECH2_PRESETS["full"]) == 41_187_968
    assert expected_neumf_params(NEUMF_PRESETS["full"]) == 31_832_577


@pytest.mark.parametrize("name", sorted(ALL_PRESETS))
def test_presets_are_complete_and_frozen(name: str) -> None:
    presets, _ = ALL_PRESETS[name]
    assert set(presets) == {"tiny", "small", "full"}
    config = presets["tiny"]
    field = dataclasses.fields(config)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, field, 1)


# ----------------------------------------------------------------------------------------------------------
# Shapes and behaviour at the tiny presets
# ----------------------------------------------------------------------------------------------------------


def test_seq2seq_shapes() -> None:
    c = SEQ2SEQ_PRESETS["tiny"]
    model = Seq2Seq(c)
    src = torch.randint(0, c.vocab_size, (3, c.src_len))
    tgt = torch.randint(0, c.vocab_size, (3, c.tgt_len + 2))  # decoder length independent of source
    assert model(src, tgt).shape == (3, c.tgt_len + 2, c.vocab_size)
    assert model.encoder.embedding is model.decoder.embedding


def test_transformer_shapes_and_tied_embedding() -> None:
    c = TRANSFORMER_PRESETS["tiny"]
    model = Transformer(c)
    src = torch.randint(0, c.vocab_size, (3, c.src_len))
    tgt = torch.randint(0, c.vocab_size, (3, c.tgt_len - 1))
    assert model(src, tgt).shape == (3, c.tgt_len - 1, c.vocab_size)
    assert model.output_projection.weight is model.embedding.weight


def test_gpt2_shapes_and_tied_embedding() -> None:
    c = GPT2_PRESETS["tiny"]
    model = GPT2(c)
    tokens = torch.randint(0, c.vocab_size, (3, c.seq_len))
    assert model(tokens).shape == (3, c.seq_len, c.vocab_size)
    assert model.lm_head.weight is model.wte.weight


def test_neumf_shapes() -> None:
    c = NEUMF_PRESETS["tiny"]
    model = NeuMF(c)
    users = torch.randint(0, c.num_users, (7,))
    items = torch.randint(0, c.num_items, (7,))
    assert model(users, items).shape == (7,)


def test_sinusoidal_positions_match_the_paper() -> None:
    d = 16
    table = sinusoidal_positions(50, d)
    pos, i = 37, 3
    angle = torch.tensor(pos / 10000 ** (2 * i / d))
    torch.testing.assert_close(table[pos, 2 * i], torch.sin(angle))
    torch.testing.assert_close(table[pos, 2 * i + 1], torch.cos(angle))


def test_transformer_decoder_is_causal() -> None:
    torch.manual_seed(0)
    c = TRANSFORMER_PRESETS["tiny"]
    model = Transformer(c).eval()
    src = torch.randint(0, c.vocab_size, (2, c.src_len))
    tgt = torch.randint(0, c.vocab_size, (2, c.tgt_len))
    k = c.tgt_len // 2
    changed = tgt.clone()
    changed[:, k] = (changed[:, k] + 1) % c.vocab_size
    with torch.no_grad():
        before, after = model(src, tgt), model(src, changed)
    torch.testing.assert_close(before[:, :k], after[:, :k])
    assert not torch.allclose(before[:, k:], after[:, k:])
    # The source is attended to without a mask: changing its last token changes the first output.
    src_changed = src.clone()
    src_changed[:, -1] = (src_changed[:, -1] + 1) % c.vocab_size
    with torch.no_grad():
        assert not torch.allclose(model(src_changed, tgt)[:, 0], before[:, 0])


def test_gpt2_is_causal() -> None:
    torch.manual_seed(0)
    c = GPT2_PRESETS["tiny"]
    model = GPT2(c).eval()
    tokens = torch.randint(0, c.vocab_size, (2, c.seq_len))
    k = c.seq_len // 2
    changed = tokens.clone()
    changed[:, k] = (changed[:, k] + 1) % c.vocab_size
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :k], after[:, :k])
    assert not torch.allclose(before[:, k:], after[:, k:])


def test_deepspeech2_ctc_loss_and_output_lengths() -> None:
    torch.manual_seed(0)
    c = DEEPSPEECH2_PRESETS["tiny"]
    model = DeepSpeech2(c)
    b = 4
    lengths = torch.tensor([c.num_frames, c.num_frames - 1, c.num_frames - 9, c.num_frames // 2])
    features = torch.randn(b, c.num_frames, c.num_features)
    log_probs, out_lengths = model(features, lengths)

    # Time is strided by 2 once (first conv), with "same" padding: T' = ceil(T / 2).
    frames_out = (c.num_frames + 1) // 2
    assert log_probs.shape == (frames_out, b, c.vocab_size)
    assert out_lengths.dtype == torch.int64
    assert out_lengths.tolist() == [(n + 1) // 2 for n in lengths.tolist()]
    assert torch.equal(output_lengths(c, lengths), out_lengths)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(frames_out, b))

    targets = torch.randint(1, c.vocab_size, (b, c.transcript_len))  # 0 is the blank
    target_lengths = torch.full((b,), c.transcript_len)
    loss = F.ctc_loss(log_probs, targets, out_lengths, target_lengths)
    assert torch.isfinite(loss)
    loss.backward()
    assert model.conv1.weight.grad is not None


def test_deepspeech2_unidirectional_variant_runs() -> None:
    c = dataclasses.replace(DEEPSPEECH2_PRESETS["tiny"], bidirectional=False)
    model = DeepSpeech2(c)
    log_probs, _ = model(torch.randn(2, c.num_frames, c.num_features), torch.tensor([c.num_frames] * 2))
    assert log_probs.shape == ((c.num_frames + 1) // 2, 2, c.vocab_size)
    assert model.lookahead is not None


def test_deepspeech2_padding_does_not_change_valid_frames() -> None:
    # Masked convolutions and packed GRUs: a short utterance padded into a longer batch gives the same
    # outputs on its valid frames as on its own (eval mode, so BatchNorm uses running statistics).
    torch.manual_seed(0)
    c = DEEPSPEECH2_PRESETS["tiny"]
    model = DeepSpeech2(c).eval()
    short = c.num_frames - 15
    features = torch.randn(2, c.num_frames, c.num_features)
    features[1, short:] = 0.0
    with torch.no_grad():
        batch_out, batch_lengths = model(features, torch.tensor([c.num_frames, short]))
        alone_out, alone_lengths = model(features[1:, :short], torch.tensor([short]))
    n = int(alone_lengths[0])
    assert int(batch_lengths[1]) == n == alone_out.shape[0]
    torch.testing.assert_close(batch_out[:n, 1], alone_out[:, 0], atol=1e-5, rtol=1e-4)


def _tiny_batch(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], Callable[[Any], torch.Tensor]]:
    presets, cls = ALL_PRESETS[name]
    c = presets["tiny"]
    model = cls(c)
    if name in ("seq2seq", "transformer"):
        src = torch.randint(0, c.vocab_size, (8, c.src_len))
        tgt = torch.randint(0, c.vocab_size, (8, c.tgt_len + 1))
        return model, (src, tgt[:, :-1]), lambda out: F.cross_entropy(out.flatten(0, 1), tgt[:, 1:].flatten())
    if name == "gpt2":
        tokens = torch.randint(0, c.vocab_size, (8, c.seq_len + 1))
        return (
            model,
            (tokens[:, :-1],),
            lambda out: F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten()),
        )
    if name == "deepspeech2":
        features = torch.randn(8, c.num_frames, c.num_features)
        targets = torch.randint(1, c.vocab_size, (8, c.transcript_len))
        target_lengths = torch.full((8,), c.transcript_len)
        inputs = (features, torch.full((8,), c.num_frames))
        return model, inputs, lambda out: F.ctc_loss(out[0], targets, out[1], target_lengths)
    users = torch.randint(0, c.num_users, (256,))
    items = torch.randint(0, c.num_items, (256,))
    labels = torch.randint(0, 2, (256,)).float()
    return model, (users, items), lambda out: F.binary_cross_entropy_with_logits(out, labels)


@pytest.mark.parametrize("name", sorted(ALL_PRESETS))
def test_tiny_loss_falls_on_a_fixed_batch(name: str) -> None:
    torch.manual_seed(0)
    model, inputs, loss_fn = _tiny_batch(name)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2 if name == "neumf" else 3e-3)
    losses = []
    for _ in range(12):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(*inputs))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses
