"""Distributed training on torch.distributed: dnnperf launches and measures ranks; it does not
implement communication (gloo on CPU, NCCL on CUDA).

- ``launch.py``: ``dnnperf profile W --nproc N`` starts N ranks with torchrun (or in network
  namespaces, ``netns.py``), watches their heartbeats, stops the run when a rank crashes or hangs.
- ``worker.py``: one rank: process group, the strategy's task, per-step gathering on rank 0.
- ``ddp.py``: data parallelism (DDP with every bucket's allreduce timed); ``sharded.py``: sharded
  data parallelism (FSDP2 ``fully_shard``, ZeRO-1's ``ZeroRedundancyOptimizer``); ``pipeline.py`` and
  ``tensor_parallel.py``: model parallelism.
- ``gather.py`` / ``ranks.py``: per-rank measurements as JSON bytes to rank 0; the record's ``ranks``
  section and its analyses.
See docs/distributed.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STRATEGIES = ("dp", "fsdp", "zero1", "pp", "tp")
#: The strategies that split the global batch over the ranks (each rank trains on its slice).
DATA_PARALLEL = ("dp", "fsdp", "zero1")
SCHEDULES = ("gpipe", "1f1b")
#: A rank that makes no progress (no new step or stage) for this long stops the run.
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DistributedSettings:
    """How a distributed run is laid out. ``nproc`` None: ranks come from the user's own torchrun."""

    strategy: str = "dp"
    nproc: int | None = None
    schedule: str = "1f1b"
    microbatches: int = 4
    #: Intra-op threads per rank; None: one when several ranks share the machine, else torch's default.
    rank_threads: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: DDP's bucket cap in MiB; None: DDP's own default (25 MiB, and 1 MiB for the first bucket, which
    #: DDP drops whenever a cap is given, even 25).
    bucket_cap_mb: float | None = None
    #: Each rank in its own network namespace, joined by a veth pair shaped with tc (root only).
    netns: bool = False
    link_mbit: float | None = None
    link_delay_ms: float = 0.0
    #: fsdp: free each unit's gathered parameters after its forward (gather them again for backward).
    reshard_after_forward: bool = True
    #: fsdp: parameters all-gathered and computed in this dtype ("bf16"); None: as the model's.
    mixed_precision: str | None = None
    #: dp: write the trained parameters (rank 0's replica) to this .npz file at the end of each point.
    save_params: Path | None = None
