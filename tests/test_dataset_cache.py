"""The on-disk dataset cache against injected damage: random bytes over a JPEG, a truncated shard, a
garbage manifest, a deleted image, an unwritable cache. Each is found before training, named, and
rebuilt to the bytes of a fresh build, or refused in one line; damage that appears during a run is
one line naming the file."""

import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import run_cli

from dnnperf.data.formats import ImageFormat, LanguageModelFormat
from dnnperf.data.integrity import CorruptDataset, verify_dataset
from dnnperf.data.sources import DiskSource, ensure_dataset, open_source
from dnnperf.results.store import RunStore
from dnnperf.runner import BenchSettings, RunFailed, bench

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)

IMAGES = ImageFormat(image_size=16, num_classes=3)
SHARDS = LanguageModelFormat(vocab_size=40, seq_len=8)
COUNT = 8


def digests(directory: Path) -> dict[str, str]:
    """Every file's SHA-256, computed here rather than taken from the manifest."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def overwrite_keeping_size(path: Path, keep_mtime: bool = False) -> None:
    """Random bytes over a file, as storage corruption leaves it: same size, and with ``keep_mtime``
    the same modification time too (bit rot, or a restore that kept times)."""
    stat = path.stat()
    with open(path, "r+b") as f:
        f.write(os.urandom(stat.st_size))
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    else:  # a coarse-clock filesystem could otherwise keep the old time
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-5])


def garble(path: Path) -> None:
    path.write_bytes(b'{"files": {"images/0000000.jpg": ' + os.urandom(64))


DAMAGE = {
    "random bytes over a jpeg": (IMAGES, "images/0000003.jpg", overwrite_keeping_size),
    "truncated shard": (SHARDS, "tokens.bin", truncate),
    "garbage manifest": (IMAGES, "manifest.json", garble),
    "deleted image": (IMAGES, "images/0000005.jpg", Path.unlink),
}


def test_the_manifest_holds_every_files_size_and_checksum(tmp_path):
    directory = ensure_dataset(IMAGES, COUNT, root=tmp_path)
    files = json.loads((directory / "manifest.json").read_text())["files"]
    assert {name: entry["sha256"] for name, entry in files.items()} == digests(directory)
    assert {name: entry["size"] for name, entry in files.items()} == {
        name: (directory / name).stat().st_size for name in files
    }
    assert len(files) == COUNT + 1  # the images and the labels
    assert verify_dataset(directory, full=True) == []


@pytest.mark.parametrize("case", DAMAGE, ids=str)
def test_damage_is_found_named_and_rebuilt_to_a_fresh_builds_bytes(tmp_path, capfd, case):
    fmt, name, damage = DAMAGE[case]
    fresh = digests(ensure_dataset(fmt, COUNT, root=tmp_path / "fresh"))
    directory = ensure_dataset(fmt, COUNT, root=tmp_path / "cache")
    capfd.readouterr()
    damage(directory / name)
    assert name in " ".join(verify_dataset(directory))

    assert ensure_dataset(fmt, COUNT, root=tmp_path / "cache") == directory
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "rebuilding" in lines[0], lines
    assert digests(directory) == fresh
    assert verify_dataset(directory, full=True) == []
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [directory.name]  # no temporary left


def test_a_copied_cache_with_new_times_is_confirmed_not_rebuilt(tmp_path, capfd):
    directory = ensure_dataset(IMAGES, COUNT, root=tmp_path)
    image = directory / "images" / "0000001.jpg"
    inode = image.stat().st_ino
    stat = image.stat()
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # content unchanged
    capfd.readouterr()
    assert ensure_dataset(IMAGES, COUNT, root=tmp_path) == directory
    assert capfd.readouterr().err == ""
    assert image.stat().st_ino == inode  # the same file: nothing was rewritten
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["files"]["images/0000001.jpg"]["mtime_ns"] == image.stat().st_mtime_ns


def test_damage_that_keeps_sizes_and_times_is_found_by_a_full_verify(tmp_path):
    directory = ensure_dataset(IMAGES, COUNT, root=tmp_path)
    overwrite_keeping_size(directory / "images" / "0000002.jpg", keep_mtime=True)
    assert verify_dataset(directory) == []  # the cheap check compares sizes and times only
    assert verify_dataset(directory, full=True) == [
        "images/0000002.jpg does not match its SHA-256 (its bytes changed)"
    ]


@pytest.mark.parametrize("name", ["/dev/zero", "../../outside.jpg", "images/../../outside.jpg"])
def test_a_forged_manifest_naming_files_outside_the_dataset_is_damage(tmp_path, name):
    """Its own checksum is unkeyed, so whoever can write the cache can forge one: a name outside the
    dataset is refused unread (hashing /dev/zero would never end) and a non-regular file unhashed."""
    directory = ensure_dataset(IMAGES, COUNT, root=tmp_path)
    (tmp_path / "outside.jpg").write_bytes(b"x")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][name] = {"size": 0, "mtime_ns": 1, "sha256": "0" * 64}
    content = {key: value for key, value in manifest.items() if key != "checksum"}
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    manifest["checksum"] = hashlib.sha256(canonical).hexdigest()  # forged the way the format is defined
    (directory / "manifest.json").write_text(json.dumps(manifest))
    assert verify_dataset(directory, full=True) == [
        f"manifest.json names {name!r}, which is not a file inside the dataset"
    ]


def test_a_device_in_place_of_a_dataset_file_is_damage(tmp_path):
    directory = ensure_dataset(IMAGES, COUNT, root=tmp_path)
    image = directory / "images" / "0000001.jpg"
    image.unlink()
    os.mkfifo(image)  # reading it would block for ever
    assert verify_dataset(directory, full=True) == ["images/0000001.jpg is not a regular file"]


def test_a_manifest_for_another_dataset_is_damage(tmp_path):
    directory = ensure_dataset(IMAGES, COUNT, root=tmp_path)
    description = {**IMAGES.describe(), "count": COUNT + 1, "seed": 0}
    assert verify_dataset(directory, description) == ["manifest.json describes another dataset"]


@pytest.mark.parametrize("workers", [0, 1])
def test_damage_during_a_run_is_one_line_naming_the_file(tmp_path, workers):
    source = open_source(IMAGES, "disk", batch_size=4, workers=workers, data_dir=tmp_path, min_samples=COUNT)
    assert isinstance(source, DiskSource)
    directory = source.directory
    for image in (directory / "images").glob("*.jpg"):
        overwrite_keeping_size(image, keep_mtime=True)
    with source, pytest.raises(CorruptDataset) as caught:
        next(source)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400
    assert "images/0000" in message and "SHA-256" in message and "removed it" in message
    assert not directory.exists()  # the next run writes a fresh copy, whatever the times say


def test_a_sample_that_fails_without_damage_is_one_line_and_not_blamed_on_the_cache(tmp_path, monkeypatch):
    def broken(self, raw):
        raise ValueError("a bug in preprocessing\nwith a second line")

    monkeypatch.setattr(ImageFormat, "preprocess", broken)  # DataLoader workers fork with it
    source = open_source(IMAGES, "disk", batch_size=4, workers=1, data_dir=tmp_path, min_samples=COUNT)
    with source, pytest.raises(RuntimeError) as caught:
        next(source)
    assert not isinstance(caught.value, CorruptDataset)
    message = str(caught.value)
    assert (
        message.startswith("sample ") and "ValueError: a bug in preprocessing with a second line" in message
    )
    assert "\n" not in message and source.directory.exists()


@pytest.fixture
def sleepy_images(monkeypatch):
    """A workload with a trivial step over IMAGES, so a run costs its data only."""
    import torch
    from torch import nn

    from dnnperf.workloads import registry
    from dnnperf.workloads.base import Task, Workload, no_stages

    class Trivial(Task):
        def __init__(self) -> None:
            self.model = nn.Linear(2, 1)

        def step(self, batch, stages=no_stages):
            return torch.tensor(float(batch["image"].mean()))

    workload = Workload(
        name="sleepy_images",
        domain="test",
        summary="reads images",
        presets={"tiny": {}},
        default_batch_size={"tiny": 4},
        make_task=lambda config, device: Trivial(),
        make_data=lambda config: IMAGES,
    )
    monkeypatch.setitem(registry.REGISTRY, "sleepy_images", workload)
    return workload


def test_damage_after_measured_steps_keeps_them_in_a_failed_record(sleepy_images, tmp_path):
    store, data = RunStore(tmp_path / "runs"), tmp_path / "data"
    settings = BenchSettings("sleepy_images", steps=4, warmup=1, data="disk", workers=0, data_dir=data)

    def damage_after_two_measured(batch_size, done, total):
        if done == 3:
            for image in data.glob("*/images/*.jpg"):
                overwrite_keeping_size(image, keep_mtime=True)

    with pytest.raises(CorruptDataset, match=r"images/.*\(2 measured steps kept in failed record") as caught:
        bench(settings, store, on_step=damage_after_two_measured)
    (record,), skipped = store.scan()
    assert skipped == [] and record.status == "failed" and len(record.points[0].step_s) == 2
    assert record.id in str(caught.value) and "images/" in record.error


def test_a_bug_in_preprocessing_still_fails_the_run(sleepy_images, tmp_path, monkeypatch):
    monkeypatch.setattr(ImageFormat, "preprocess", lambda self, raw: 1 / 0)
    settings = BenchSettings("sleepy_images", steps=1, warmup=0, data="disk", workers=0, data_dir=tmp_path)
    with pytest.raises(RunFailed, match="ZeroDivisionError"):
        bench(settings, RunStore(tmp_path / "runs"))


def test_concurrent_runs_rebuild_a_damaged_dataset_once(tmp_path):
    directory = ensure_dataset(IMAGES, COUNT, root=tmp_path)
    fresh = digests(directory)
    overwrite_keeping_size(directory / "images" / "0000000.jpg")
    script = (
        "import sys; from pathlib import Path; from dnnperf.data.formats import ImageFormat; "
        "from dnnperf.data.sources import ensure_dataset; "
        f"print(ensure_dataset(ImageFormat(image_size=16, num_classes=3), {COUNT}, root=Path(sys.argv[1])))"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], results
    assert {out.strip() for out, _ in results} == {str(directory)}
    assert sum("rebuilding" in err for _, err in results) == 1  # the others waited, then found it whole
    assert digests(directory) == fresh
    assert [p.name for p in tmp_path.iterdir()] == [directory.name]


def test_a_writer_killed_midway_leaves_nothing_the_next_one_keeps(tmp_path):
    script = (
        "import sys, time; from pathlib import Path; from dnnperf.data.formats import ImageFormat; "
        "from dnnperf.data.sources import ensure_dataset\n"
        "def stuck(self, directory, count, seed):\n"
        "    (directory / 'half').write_bytes(b'x')\n"
        "    time.sleep(600)\n"
        "ImageFormat.write = stuck\n"
        f"ensure_dataset(ImageFormat(image_size=16, num_classes=3), {COUNT}, root=Path(sys.argv[1]))"
    )
    writer = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".writing-*/half")):
            assert writer.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert list(tmp_path.glob(".writing-*"))  # what SIGKILL leaves
    directory = ensure_dataset(IMAGES, COUNT, root=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [directory.name]
    assert verify_dataset(directory, full=True) == []


# ---------------------------------------------------------------------------------------------------
# The command line, end to end
# ---------------------------------------------------------------------------------------------------

BENCH = ("bench", "basic_cnn", "--data", "disk", "--steps", "1", "--warmup", "0", "--workers", "1")


def test_cli_rebuilds_a_damaged_cache_and_says_so_in_one_line(tmp_path):
    data, runs = tmp_path / "data", tmp_path / "runs"
    first = run_cli(*BENCH, "--data-dir", str(data), "--runs-dir", str(runs), "-q")
    assert first.returncode == 0, first.stderr
    (directory,) = data.iterdir()
    fresh = digests(directory)
    overwrite_keeping_size(directory / "images" / "0000007.jpg")
    again = run_cli(*BENCH, "--data-dir", str(data), "--runs-dir", str(runs), "-q")
    assert again.returncode == 0, again.stderr
    (line,) = again.stderr.strip().splitlines()
    assert "images/0000007.jpg" in line and "rebuilding" in line
    assert digests(directory) == fresh
    assert len(list(runs.glob("*.json"))) == 2


def test_cli_damage_found_during_the_run_is_one_line_and_no_record(tmp_path):
    data, runs = tmp_path / "data", tmp_path / "runs"
    directory = ensure_dataset(basic_cnn_format(), 64, root=data)
    for image in (directory / "images").glob("*.jpg"):
        overwrite_keeping_size(image, keep_mtime=True)  # passes the open's check: found by decoding
    result = run_cli(*BENCH, "--data-dir", str(data), "--runs-dir", str(runs))
    assert_one_line_error(result, str(directory), "images/", "SHA-256", "removed it")
    assert list(runs.glob("*.json")) == []  # nothing was measured: no failed record of it
    assert not directory.exists()


def basic_cnn_format():
    from dnnperf.workloads import get_workload

    return get_workload("basic_cnn").data("tiny")


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 600, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def _no_root_overrides() -> None:
    """Make permission bits bind a root process too (drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
    from the child's bounding set): a test run as root could otherwise write anywhere."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_cli_refuses_a_damaged_cache_it_cannot_rebuild(tmp_path):
    data, runs = tmp_path / "data", tmp_path / "runs"
    directory = ensure_dataset(basic_cnn_format(), 64, root=data)
    damaged = directory / "images" / "0000004.jpg"
    overwrite_keeping_size(damaged)
    before = damaged.read_bytes()
    data.chmod(0o555)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "dnnperf", *BENCH, "--data-dir", str(data), "--runs-dir", str(runs)],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=240,
            preexec_fn=_no_root_overrides if os.geteuid() == 0 else None,
        )
    finally:
        data.chmod(0o755)
    assert_one_line_error(result, "images/0000004.jpg", "cannot be rebuilt", "--data-dir")
    assert damaged.read_bytes() == before  # refused, not half rebuilt
    assert not runs.exists() or list(runs.glob("*.json")) == []
