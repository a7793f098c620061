"""Seed 004, TBD (Zhu et al., 2018): the training suite's throughput against batch size, how busy the
compute device is, CPU utilisation, and the memory breakdown per workload.

On a CPU-only machine the "compute device" is the CPU itself: its busy share is the part of each step
spent in the model's forward, backward and update (the stages), against reading, preprocessing,
playing the game (reinforcement learning) and everything else.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from dnnperf.reproduce.base import (
    Claim,
    Reproduction,
    Session,
    commands_of,
    finish,
    percent,
    started,
    verdict,
)
from dnnperf.results.memory import CATEGORIES

KEY, SEED, TITLE = "tbd", "004", "TBD: benchmarking and analyzing DNN training (Zhu et al., 2018)"

COMPUTE_STAGES = ("forward", "backward", "update")
CNNS = ("basic_cnn", "alexnet", "vgg16", "vgg19", "resnet18", "resnet50", "inception_v3")
#: size -> (preset, batch sizes, measured steps, workloads: None for the whole suite). The default
#: starts at 2: with batch 1, BatchNorm in training mode cannot normalise a 1x1 feature map (resnet18's
#: last stage at ``tiny``), so the suite's BatchNorm models cannot train at all there.
SIZES = {
    "smoke": ("tiny", (1, 4), 1, ("basic_cnn", "a3c")),
    "default": ("tiny", (2, 4, 16, 64, 128), 3, None),
}


def planned(size: str) -> int:
    """How many commands ``run`` makes (for progress)."""
    from dnnperf.workloads import all_workloads

    only = SIZES[size][3]
    return len(all_workloads()) if only is None else len(only)


def run(session: Session, size: str, progress: Callable[[str], None] | None = None) -> Reproduction:
    from dnnperf.workloads import all_workloads

    start = started()
    preset, sweep, steps, only = SIZES[size]
    names = [w.name for w in all_workloads() if only is None or w.name in only]
    rows, memory_rows, commands = [], [], {}
    for name in names:
        command, record, _ = session.profile(
            name, "--preset", preset, "--sweep", ",".join(map(str, sweep)),
            "--steps", str(steps), "--warmup", "1", "--memory",
        )  # fmt: skip
        commands[name] = command
        done = [p for p in record.points if p.status == "complete" and p.stages is not None]
        for point in done:
            summary = point.stages.summary()
            stages = summary["stages"]
            busy = sum(stages.get(s, {}).get("share", 0.0) for s in COMPUTE_STAGES)
            cpu = point.stages.cpu or {}
            rows.append(
                {
                    "workload": name,
                    "batch": point.batch_size,
                    "samples_per_s": summary["samples_per_s"],
                    "compute_busy_share": busy,
                    "environment_share": stages.get("environment", {}).get("share", 0.0),
                    "cpu_cores_busy": cpu.get("process_cores", float("nan")) + cpu.get("workers_cores", 0.0),
                    "usable_cores": cpu.get("usable_cores", float("nan")),
                }
            )
        biggest = max((p for p in done if p.memory is not None), key=lambda p: p.batch_size, default=None)
        if biggest is not None:
            memory = biggest.memory
            peak = {c: memory.category_max.get(c, 0) for c in CATEGORIES}
            largest = max(peak, key=lambda c: peak[c])
            memory_rows.append(
                {"workload": name, "batch": biggest.batch_size, "largest": largest}
                | {f"{c}_MiB": v / 2**20 for c, v in peak.items() if c != "other"}
            )
        if progress is not None:
            progress(name)
    throughput = pd.DataFrame(rows)
    memory = pd.DataFrame(memory_rows)
    reproduction = Reproduction(KEY, SEED, TITLE, size)
    reproduction.tables = [
        (f"throughput, busy share and CPU use against batch size ({preset} presets)", throughput),
        ("memory at the largest batch: each category's largest value over the step", memory),
    ]
    reproduction.claims = [
        _scaling_claim(throughput, commands),
        _feature_maps_claim(memory, commands),
        _rl_claim(throughput, commands),
    ]
    reproduction.notes.append(
        f"Each workload: `{commands[names[0]].replace(names[0], 'WORKLOAD', 1)}`; the memory breakdown "
        "is that run's memory-tracked step at its largest batch."
    )
    return finish(reproduction, start)


def _scaling_claim(throughput: pd.DataFrame, commands: dict[str, str]) -> Claim:
    grows = []
    for name, rows in throughput.groupby("workload"):
        rows = rows.sort_values("batch")
        if len(rows) > 1:
            first, best = rows["samples_per_s"].iloc[0], rows["samples_per_s"].max()
            grows.append((name, best / first))
    rising = [n for n, ratio in grows if ratio > 1.0]
    text = ", ".join(f"{n} x{r:.1f}" for n, r in sorted(grows, key=lambda x: -x[1]))
    return Claim(
        claim="Throughput grows with the mini-batch size until the device saturates.",
        measured=f"best throughput over the smallest batch's, per workload: {text}",
        verdict=verdict(len(rising) >= 0.8 * len(grows) and bool(grows)),
        why=f"{len(rising)} of {len(grows)} workloads train faster at a larger batch than at their smallest",
        commands=commands_of(list(commands.values())),
    )


def _feature_maps_claim(memory: pd.DataFrame, commands: dict[str, str]) -> Claim:
    cnns = memory[memory["workload"].isin(CNNS)]
    dominated = cnns[cnns["largest"] == "activations"]
    shares = []
    for _, row in cnns.iterrows():
        total = sum(row[c] for c in row.index if c.endswith("_MiB"))
        shares.append(f"{row['workload']} {percent(row['activations_MiB'] / total) if total else 'n/a'}")
    return Claim(
        claim="Feature maps (saved activations) dominate the memory of CNN training.",
        measured="activations' share of the categories' largest values: " + ", ".join(shares),
        verdict=verdict(len(cnns) > 0 and len(dominated) == len(cnns)),
        why=f"activations are the largest category in {len(dominated)} of {len(cnns)} CNNs measured",
        commands=commands_of([commands[n] for n in cnns["workload"]]),
    )


def _rl_claim(throughput: pd.DataFrame, commands: dict[str, str]) -> Claim:
    rl = throughput[throughput["workload"] == "a3c"]
    if rl.empty:
        return Claim(
            claim="The reinforcement-learning workload (A3C) is CPU-bound: the device waits on the game.",
            measured="a3c was not measured",
            verdict="differs",
            why="no a3c run",
            commands=[],
        )
    environment, compute = rl["environment_share"].median(), rl["compute_busy_share"].median()
    return Claim(
        claim="The reinforcement-learning workload (A3C) is CPU-bound: the device waits on the game.",
        measured=(
            f"a3c, median over batch sizes: {percent(environment)} of each step playing the game "
            f"(environment stage), {percent(compute)} in the model's forward, backward and update"
        ),
        verdict=verdict(environment > compute),
        why=(
            "the game's simulation and rendering take more of the step than the network"
            if environment > compute
            else "on this CPU-only machine the network's compute takes more of the step than the game"
        ),
        commands=[commands["a3c"]],
    )
