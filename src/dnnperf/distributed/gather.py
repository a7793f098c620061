"""Gathering JSON documents from every rank, as byte tensors through torch.distributed (no pickle:
``*_object`` collectives pickle, so they are not used for results)."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist


def encode(document: Any) -> torch.Tensor:
    """A JSON document as a uint8 tensor (NaN and infinities refused: they are not JSON)."""
    data = json.dumps(document, allow_nan=False, separators=(",", ":")).encode()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode(tensor: torch.Tensor, length: int) -> Any:
    return json.loads(bytes(tensor[:length].cpu().tolist()).decode())


def gather_json(document: Any, device: torch.device, dst: int = 0) -> list[Any] | None:
    """Every rank's ``document`` on rank ``dst`` (in rank order); None on the other ranks.

    Two all-gathers: lengths, then the bytes padded to the longest (all-gather works on gloo and
    NCCL alike; NCCL needs the tensors on the rank's GPU, hence ``device``)."""
    world = dist.get_world_size()
    payload = encode(document).to(device)
    length = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    longest = int(max(n.item() for n in lengths))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    buffers = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(buffers, padded)
    if dist.get_rank() != dst:
        return None
    return [decode(buffer, int(n.item())) for buffer, n in zip(buffers, lengths, strict=True)]


def all_gather_rows(rows: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``rows`` (a 2-D tensor; ranks may give different numbers of rows, the same number
    of columns and dtype) on every rank, in rank order. Two all-gathers: row counts, then the rows
    padded to the longest."""
    world = dist.get_world_size()
    count = torch.tensor([rows.shape[0]], dtype=torch.int64, device=rows.device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    longest = int(max(n.item() for n in counts))
    padded = torch.zeros((longest, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    padded[: rows.shape[0]] = rows
    buffers = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(buffers, padded)
    return [buffer[: int(n.item())] for buffer, n in zip(buffers, counts, strict=True)]
