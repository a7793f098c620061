"""Network-namespace mode: two ranks joined by a veth pair shaped to 100 Mbit/s; the gradient exchange
grows as bytes / bandwidth predicts. Needs root, iproute2 and namespace support (skipped otherwise)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
from tests.conftest import run_cli

from dnnperf.distributed.netns import existing_namespaces


def _netns_usable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    probe = f"probe-dnnperf-{os.getpid()}"  # not a dnnperf- name: no test counts it as left behind
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode:
        return "this machine does not let us create network namespaces"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_netns_usable() is not None, reason=str(_netns_usable()))]

MBIT = 100.0


@pytest.fixture(autouse=True)
def one_namespace_test_at_a_time() -> Iterator[None]:
    """Each test here checks that no dnnperf namespace is left on the machine: a lock shared by every
    process on it keeps another test run's namespaces (two `make test` at once) out of that count."""
    with open(os.path.join(tempfile.gettempdir(), "dnnperf-netns-tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(*link: str) -> dict:
    result = run_cli(
        "profile", "resnet18", "--nproc", "2", "-b", "4", "--steps", "4", "--warmup", "1", "--json",
        "--netns", *link,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["record"]


def _medians(record: dict) -> tuple[float, float, float]:
    """Per-step bytes exchanged, median allreduce seconds (summed over buckets) and median exchange stage."""
    rank = record["points"][0]["ranks"]["per_rank"][0]
    (size,) = {sum(b["bytes"] for b in step) for step in rank["buckets"]}
    allreduce = statistics.median(sum(b["seconds"] for b in step) for step in rank["buckets"])
    return size, allreduce, statistics.median(rank["stages"]["exchange"])


def test_shaped_link_slows_the_exchange_as_bandwidth_predicts():
    base = _run()
    shaped = _run("--link-mbit", str(MBIT))
    assert shaped["settings"]["distributed"]["netns"] == {"link_mbit": MBIT, "link_delay_ms": 0.0}
    size, allreduce, exchange = _medians(shaped)
    _, base_allreduce, base_exchange = _medians(base)
    # two-rank ring allreduce: each rank sends half the gradient in reduce-scatter and half in all-gather
    predicted = size * 8 / (MBIT * 1e6)
    assert 0.7 * predicted < allreduce - base_allreduce < 1.5 * predicted, (
        allreduce,
        base_allreduce,
        predicted,
    )
    # backward overlaps little of it on this tiny model: the exposed exchange grows by most of it
    assert 0.5 * predicted < exchange - base_exchange < 1.5 * predicted, (exchange, base_exchange, predicted)
    assert existing_namespaces() == []  # namespaces (and their veth pair) are gone


def test_link_delay_without_netem_is_one_line_or_runs(isolated_dirs):
    result = run_cli(
        "profile", "basic_cnn", "--nproc", "2", "--netns", "--link-delay-ms", "1", "--steps", "1", "--json"
    )  # fmt: skip
    if result.returncode == 0:  # netem present: the run works and records the delay
        assert json.loads(result.stdout)["record"]["settings"]["distributed"]["netns"]["link_delay_ms"] == 1.0
    else:
        assert result.returncode == 2 and "netem" in result.stderr and len(result.stderr.splitlines()) == 1
    assert existing_namespaces() == []
    assert not list(isolated_dirs["runs"].glob("*.log"))  # nothing left beside the records


def test_collectives_timed_over_a_shaped_link_never_beat_its_rate():
    from dnnperf.distributed.netns import LinkShape, burst_bytes
    from dnnperf.perfmodel.collective_calibration import measure

    mbit = 50.0
    frame = measure(2, (256 << 10, 1 << 20), rounds=2, shape=LinkShape(mbit))
    assert existing_namespaces() == []
    rate, burst = mbit * 1e6 / 8, burst_bytes(mbit)
    times = frame.set_index(["op", "bytes"])["median_s"]
    # What each operation sends one way over the link, no faster than the token bucket lets it after
    # its first burst: a 2-rank allreduce and a send each move the whole message, an allgather half.
    for op, one_way in (("send_recv", 1 << 20), ("allreduce", 1 << 20), ("allgather", 1 << 19)):
        assert times[op, 1 << 20] >= (one_way - burst) / rate, op
    # Between two sizes the burst cancels: the extra bytes go at most at the rate (noise: 5%).
    slope = ((1 << 20) - (256 << 10)) / (times["send_recv", 1 << 20] - times["send_recv", 256 << 10])
    assert slope <= rate * 1.05
