"""Recompute: chosen segments run under ``torch.utils.checkpoint`` (non-reentrant), so backward
reruns their forward instead of keeping what they saved.

- RNG: ``preserve_rng_state=True`` restores the CPU and device generators, so dropout draws the
  same mask when a segment is recomputed.
- BatchNorm running statistics are updated once: the recomputation snapshots every training
  BatchNorm's running mean, variance and batch count in the segment and puts them back after (a
  recomputation stopped early by torch's early-stop is restored too).
- Autocast: non-reentrant checkpoint re-enters the forward's autocast state itself.

A multi-unit segment (a run of one ``nn.Sequential``'s children) replaces that Sequential's
``forward`` on the instance; a single unit's own ``forward`` is wrapped. Both are put back on exit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from dnnperf.memsave.policy import Unit

_MISSING = object()


@contextmanager
def _running_stats_kept(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Put every training BatchNorm's running statistics back as they were, whatever runs inside."""
    saved = []
    for module in modules:
        for bn in module.modules():
            if isinstance(bn, _BatchNorm) and bn.training and bn.track_running_stats:
                for name in ("running_mean", "running_var", "num_batches_tracked"):
                    buffer = getattr(bn, name)
                    if buffer is not None:
                        saved.append((buffer, buffer.clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def _once(function: Callable[..., Any], modules: Sequence[nn.Module]) -> Callable[..., Any]:
    """``function`` for checkpoint: the first call is the forward; later calls are recomputations,
    which must not update BatchNorm's running statistics a second time."""
    calls = 0

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return function(*args, **kwargs)
        with _running_stats_kept(modules):
            return function(*args, **kwargs)

    return run


def _checkpointed(function: Callable[..., Any], modules: Sequence[nn.Module]) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # nothing would be saved: no need to recompute
            return function(*args, **kwargs)
        return checkpoint(
            _once(function, modules), *args, use_reentrant=False, preserve_rng_state=True, **kwargs
        )

    return forward


def _run_all(modules: Sequence[nn.Module]) -> Callable[[Any], Any]:
    def run(x: Any) -> Any:
        for module in modules:
            x = module(x)
        return x

    return run


class Checkpointing:
    """Applies recompute segments to a model's instances; ``remove`` restores every ``forward``."""

    def __init__(self, model: nn.Module, units: Sequence[Unit], segments: Sequence[Sequence[str]]) -> None:
        self.model = model
        self.units = {u.name: u for u in units}
        self.segments = [list(s) for s in segments]
        self._patched: list[tuple[nn.Module, Any]] = []

    def apply(self) -> None:
        modules = dict(self.model.named_modules())
        by_parent: dict[str, list[list[str]]] = {}
        try:
            for segment in self.segments:
                parent = self.units[segment[0]].sequential
                if parent is not None:
                    by_parent.setdefault(parent, []).append(segment)
                    continue
                module = modules[segment[0]]
                self._patch(module, _checkpointed(module.forward, [module]))
            for parent, segments in by_parent.items():
                self._patch(modules[parent], self._sequential_forward(modules[parent], segments, modules))
        except BaseException:
            self.remove()
            raise

    def _sequential_forward(
        self, sequential: nn.Module, segments: list[list[str]], modules: dict[str, nn.Module]
    ) -> Callable[[Any], Any]:
        first = {segment[0]: segment for segment in segments}
        prefix = {id(m): name for name, m in modules.items()}
        pieces: list[Any] = []
        skip: set[str] = set()
        for child in sequential.children():
            name = prefix[id(child)]
            if name in skip:
                continue
            if name in first:
                members = [modules[n] for n in first[name]]
                pieces.append(_checkpointed(_run_all(members), members))
                skip.update(first[name])
            else:
                pieces.append(child)

        def forward(x: Any) -> Any:
            for piece in pieces:
                x = piece(x)
            return x

        return forward

    def _patch(self, module: nn.Module, forward: Callable[..., Any]) -> None:
        self._patched.append((module, module.__dict__.get("forward", _MISSING)))
        module.forward = forward  # type: ignore[method-assign]

    def remove(self) -> None:
        for module, previous in reversed(self._patched):
            if previous is _MISSING:
                del module.forward
            else:
                module.forward = previous  # type: ignore[method-assign]
        self._patched.clear()
