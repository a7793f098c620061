"""Language models in plain PyTorch: GPT-2 (Radford et al. 2019).

Decoder-only, pre-norm blocks, learned positions, a 4x GELU MLP, a final LayerNorm and an output
projection tied to the token embedding. The "full" preset is GPT-2 small (124,439,808 parameters).
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from dnnperf.models.translation import FeedForward, MultiHeadAttention

__all__ = ["GPT2", "GPT2_PRESETS", "GPT2Block", "GPT2Config"]


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 hyper-parameters; ``seq_len`` is both the context size (learned positions) and the
    synthetic sequence length of the workload."""

    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    seq_len: int = 1024
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")


class GPT2Block(nn.Module):
    """Pre-norm block: ``x += Drop(Attn(LN(x)))``, ``x += Drop(MLP(LN(x)))`` with causal attention."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = MultiHeadAttention(config.n_embd, config.n_head, config.dropout)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = FeedForward(config.n_embd, 4 * config.n_embd, activation="gelu")
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Transform [B, S, D]."""
        x = x + self.dropout(self.attn(self.ln_1(x), causal=True))
        return x + self.dropout(self.mlp(self.ln_2(x)))


class GPT2(nn.Module):
    """GPT-2 language model returning next-token logits."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.seq_len, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([GPT2Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        # A Linear module so the vocabulary projection can be hooked; its weight is the token embedding.
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self._init_weights()
        self.lm_head.weight = self.wte.weight

    def _init_weights(self) -> None:
        # GPT-2 initialisation: N(0, 0.02) everywhere, the projections that write into the residual stream
        # scaled by 1/sqrt(2 * n_layer) so the stream's variance does not grow with depth.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / (2 * self.config.n_layer) ** 0.5
        for block in self.blocks:
            nn.init.normal_(block.attn.out_proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp.fc2.weight, mean=0.0, std=residual_std)

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits [B, S, V] for tokens [B, S] (int64, S <= seq_len)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.dropout(self.wte(tokens) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


GPT2_PRESETS: dict[str, GPT2Config] = {
    "tiny": GPT2Config(vocab_size=256, n_layer=2, n_head=4, n_embd=64, seq_len=16, dropout=0.1),
    "small": GPT2Config(vocab_size=4096, n_layer=4, n_head=4, n_embd=256, seq_len=128, dropout=0.1),
    # GPT-2 small ("124M").
    "full": GPT2Config(vocab_size=50257, n_layer=12, n_head=12, n_embd=768, seq_len=1024, dropout=0.1),
}
