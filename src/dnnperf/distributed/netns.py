"""Network-namespace mode: two ranks on one machine, each in its own network namespace, joined by a
veth pair whose bandwidth (tbf) and delay (netem, where the kernel has it) are set with ``tc``, so
that link speed and latency can be varied without a second machine. Root only.

The namespaces, the veth pair (deleted with them) and every process inside are removed when the
context ends, also on error, and by the launch's lifeline (``lifeline.py``) when the launcher is killed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from dnnperf.distributed.lifeline import remove_namespaces
from dnnperf.errors import UsageError

MASTER_PORT = 29500  # the namespaces are new: nothing else listens there
SUBNET = "10.231.0"


@dataclass(frozen=True)
class LinkShape:
    """The link between the ranks: bandwidth in Mbit/s (None: unshaped) and one-way delay."""

    mbit: float | None = None
    delay_ms: float = 0.0


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def _check(*command: str) -> None:
    result = _run(*command)
    if result.returncode:
        message = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        raise UsageError(f"--netns: `{' '.join(command)}` failed: {message}")


def burst_bytes(mbit: float) -> int:
    """The token bucket's burst at ``mbit`` Mbit/s: 4 ms worth of bytes, no less than a tick of a
    250 Hz kernel can release (or the rate is not reached), and small beside the transfers measured,
    which the burst speeds up."""
    return max(int(mbit * 1e6 / 8 / 250), 16 * 1024)


class NetnsPair:
    """Two namespaces ``dnnperf-<tag>-0`` and ``-1`` with addresses 10.231.0.1 and .2 on a veth pair."""

    def __init__(self, shape: LinkShape) -> None:
        tag = secrets.token_hex(3)
        self.shape = shape
        self.namespaces = [f"dnnperf-{tag}-{rank}" for rank in range(2)]
        self.interfaces = [f"dnp{tag}{'ab'[rank]}" for rank in range(2)]  # at most 15 characters
        self.addresses = [f"{SUBNET}.{rank + 1}" for rank in range(2)]

    def __enter__(self) -> NetnsPair:
        if os.geteuid() != 0:
            raise UsageError("--netns needs root (it creates network namespaces and shapes links with tc)")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise UsageError(f"--netns needs the `{tool}` command (iproute2), which is not installed")
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        for namespace in self.namespaces:
            _check("ip", "netns", "add", namespace)
        a, b = self.interfaces
        _check("ip", "link", "add", a, "netns", self.namespaces[0], "type", "veth",
               "peer", "name", b, "netns", self.namespaces[1])  # fmt: skip
        for namespace, interface, address in zip(
            self.namespaces, self.interfaces, self.addresses, strict=True
        ):
            ns = ("ip", "-n", namespace)
            _check(*ns, "addr", "add", f"{address}/24", "dev", interface)
            _check(*ns, "link", "set", interface, "up")
            _check(*ns, "link", "set", "lo", "up")
            self._shape(namespace, interface)

    def _shape(self, namespace: str, interface: str) -> None:
        """Each end's egress: netem for the delay (its child tbf for the rate), or tbf alone."""
        tc = ("ip", "netns", "exec", namespace, "tc", "qdisc", "add", "dev", interface)
        parent: tuple[str, ...] = ("root",)
        if self.shape.delay_ms > 0:
            result = _run(*tc, "root", "handle", "1:", "netem", "delay", f"{self.shape.delay_ms}ms")
            if result.returncode:
                raise UsageError(
                    "--link-delay-ms needs the netem qdisc, which this kernel lacks "
                    f"({result.stderr.strip() or 'tc failed'}); --link-mbit alone works with tbf"
                )
            parent = ("parent", "1:1")
        if self.shape.mbit is not None:
            burst = burst_bytes(self.shape.mbit)
            _check(*tc, *parent, "handle", "10:", "tbf", "rate", f"{self.shape.mbit}mbit",
                   "burst", str(burst), "latency", "100ms")  # fmt: skip

    def rank_command(self, rank: int, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[rank], *argv]

    def rank_environment(self, rank: int) -> dict[str, str]:
        """What torchrun would set, with the rendezvous on rank 0's veth address."""
        return {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": self.addresses[0],
            "MASTER_PORT": str(MASTER_PORT),
            "GLOO_SOCKET_IFNAME": self.interfaces[rank],
            "NCCL_SOCKET_IFNAME": self.interfaces[rank],
        }

    def close(self) -> None:
        """Kill what still runs inside, then delete the namespaces (which deletes the veth pair)."""
        remove_namespaces(self.namespaces)

    def __exit__(self, *exc: object) -> None:
        self.close()


def existing_namespaces() -> list[str]:
    """dnnperf's namespaces now on this machine (a test checks none outlives a run)."""
    listing = _run("ip", "netns", "list").stdout.split("\n")
    return [line.split()[0] for line in listing if line.startswith("dnnperf-")]
