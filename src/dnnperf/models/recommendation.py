"""Recommendation models in plain PyTorch: NeuMF (He et al. 2017) as in MLPerf's NCF reference.

GMF branch (element-wise product of user and item factors) and MLP branch (concatenated user and item
embeddings through ReLU layers) are concatenated and mapped to one logit of "user interacted with item".
"""

import math
from dataclasses import dataclass
from itertools import pairwise

import torch
from torch import Tensor, nn

__all__ = ["NEUMF_PRESETS", "NeuMF", "NeuMFConfig"]


@dataclass(frozen=True)
class NeuMFConfig:
    """NeuMF hyper-parameters. ``mlp_layers[0]`` is the width of the concatenated MLP embeddings (each
    half of it); ``negatives`` is the number of sampled negatives per positive used by the data pipeline."""

    num_users: int = 138493
    num_items: int = 26744
    mf_dim: int = 64
    mlp_layers: tuple[int, ...] = (256, 256, 128, 64)
    negatives: int = 4

    def __post_init__(self) -> None:
        if len(self.mlp_layers) < 1 or self.mlp_layers[0] % 2 != 0:
            raise ValueError("mlp_layers[0] must be an even embedding width (user half + item half)")


class NeuMF(nn.Module):
    """Neural matrix factorisation returning one logit per (user, item) pair."""

    def __init__(self, config: NeuMFConfig) -> None:
        super().__init__()
        self.config = config
        half = config.mlp_layers[0] // 2
        self.mf_user_embed = nn.Embedding(config.num_users, config.mf_dim)
        self.mf_item_embed = nn.Embedding(config.num_items, config.mf_dim)
        self.mlp_user_embed = nn.Embedding(config.num_users, half)
        self.mlp_item_embed = nn.Embedding(config.num_items, half)
        self.mlp = nn.ModuleList([nn.Linear(d_in, d_out) for d_in, d_out in pairwise(config.mlp_layers)])
        self.final = nn.Linear(config.mf_dim + config.mlp_layers[-1], 1)
        self._init_weights()

    def _init_weights(self) -> None:
        # MLPerf NCF: embeddings N(0, 0.01), hidden layers Glorot-uniform, the output layer LeCun-uniform.
        for embed in (self.mf_user_embed, self.mf_item_embed, self.mlp_user_embed, self.mlp_item_embed):
            nn.init.normal_(embed.weight, mean=0.0, std=0.01)
        for layer in self.mlp:
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
        bound = math.sqrt(3.0 / self.final.in_features)
        nn.init.uniform_(self.final.weight, -bound, bound)
        nn.init.zeros_(self.final.bias)

    def forward(self, users: Tensor, items: Tensor) -> Tensor:
        """Logits [B] for user ids [B] and item ids [B] (int64); apply a sigmoid for probabilities."""
        gmf = self.mf_user_embed(users) * self.mf_item_embed(items)
        x = torch.cat((self.mlp_user_embed(users), self.mlp_item_embed(items)), dim=-1)
        for layer in self.mlp:
            x = torch.relu(layer(x))
        return self.final(torch.cat((gmf, x), dim=-1)).squeeze(-1)


NEUMF_PRESETS: dict[str, NeuMFConfig] = {
    "tiny": NeuMFConfig(num_users=1000, num_items=500, mf_dim=8, mlp_layers=(32, 32, 16, 8), negatives=4),
    "small": NeuMFConfig(
        num_users=20000, num_items=5000, mf_dim=32, mlp_layers=(128, 128, 64, 32), negatives=4
    ),
    # MLPerf NCF on MovieLens-20M: 138493 users, 26744 items, 64 factors, MLP 256-256-128-64, 4 negatives.
    "full": NeuMFConfig(
        num_users=138493, num_items=26744, mf_dim=64, mlp_layers=(256, 256, 128, 64), negatives=4
    ),
}
