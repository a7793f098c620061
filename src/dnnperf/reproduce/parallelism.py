"""Seed 002, "Performance modeling for distributed training of CNNs" (Castelló et al., PDP 2021): data
against model parallelism predicted along five axes (batch size, node FLOP/s, node memory bandwidth,
link bandwidth, number of nodes) by an analytical model, and the model validated against a Python
distributed-training library (PyDTNN there; torch.distributed with gloo here).

The cluster is the paper's simulator defaults (background.md; the ``seed002`` machine preset): 4 TFLOP/s
and 50 GB/s per node, 1 Gbit/s links with 0.5 us latency, one device per node, 8 nodes; each axis is
swept with the others held there.
The validation runs 2 ranks on this machine (``dnnperf validate --distributed``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pandas as pd

from dnnperf.perfmodel.whatif import crossovers
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

KEY, SEED = "parallelism", "002"
TITLE = "Performance modeling for distributed training of CNNs (Castelló et al., 2021)"

#: The paper's simulator defaults are dnnperf's ``seed002`` machine preset; the cluster has 8 nodes.
MACHINE, NODES = "seed002", 8
AXES = {
    "batch_size": "64,128,256,512,1024,2048",
    "tflops": "0.5,1,2,4,8,16,32",
    "memory_gbs": "10,25,50,100,200,400",
    "link_gbps": "0.1,1,10,25,100,400",
    "nodes": "2,4,8,16,32,64",
}
#: size -> (CNN, preset, global batch, axes swept, validation workloads, their batches, strategies,
#: steps, launches per configuration). The smoke size sweeps only the two axes its claims about data
#: parallelism read, and launches its 2 ranks once (each launch is most of its time).
SIZES = {
    "smoke": ("basic_cnn", "tiny", 256, ("link_gbps", "tflops"), ("basic_cnn",), "8", "dp", 2, 1),
    "default": ("vgg16", "small", 256, tuple(AXES), ("resnet18", "vgg16", "gpt2"), "8,16", "dp,pp,tp", 10, 3),
}


def planned(size: str) -> int:
    """How many commands ``run`` makes (for progress)."""
    return len(SIZES[size][3]) + 2


def run(session: Session, size: str, progress: Callable[[str], None] | None = None) -> Reproduction:
    start = started()
    cnn, preset, batch, axes, validated, batches, strategies, steps, launches = SIZES[size]
    sweeps, sweep_commands, rows = {}, [], []
    for axis, values in ((a, AXES[a]) for a in axes):
        command, document = session.run(
            "predict", cnn, "--preset", preset, "-b", str(batch), "--machine", MACHINE, "--nodes", str(NODES),
            "--sweep", f"{axis}={values}",
        )  # fmt: skip
        sweep_commands.append(command)
        frame = pd.DataFrame(document["rows"])
        sweeps[axis] = (frame, command)
        rows += [_sweep_row(axis, r) for r in frame.to_dict("records")]
        if progress is not None:
            progress(command)
    hw_command, hw_path = _one_thread_profile(session, quick=size == "smoke")
    if progress is not None:
        progress(hw_command)
    val_command, validation = session.run(
        "validate", *validated, "--preset", preset, "--batch-sizes", batches,
        "--steps", str(steps), "--processes", str(launches), "--distributed", strategies, "--hw", hw_path,
    )  # fmt: skip
    if progress is not None:
        progress(val_command)
    measured = pd.DataFrame(validation["distributed"]["rows"])
    ranking = pd.DataFrame(validation["distributed"]["ranking"])
    reproduction = Reproduction(KEY, SEED, TITLE, size)
    reproduction.notes = [
        f"The cluster: the `{MACHINE}` preset (4 TFLOP/s, 50 GB/s, 16 GB per node, 1 Gbit/s links with "
        f"0.5 us latency) with {NODES} nodes of one device; each axis is swept with the others held there."
    ]
    reproduction.tables = [
        (f"predicted throughput (samples/s) of {cnn} ({preset}) along each axis", pd.DataFrame(rows)),
        ("2 ranks on this machine: measured against predicted", _validation_table(measured)),
    ]
    changes = _crossover_table(sweeps)
    if len(changes):  # none is said in the claim; an empty table would say nothing
        reproduction.tables.insert(1, ("where the best strategy changes", changes))
    reproduction.claims = [
        _crossover_claim(sweeps),
        _link_claim(sweeps),
        _compute_claim(sweeps),
        _accuracy_claim(measured, ranking, [hw_command, val_command]),
    ]
    return finish(reproduction, start)


def _one_thread_profile(session: Session, quick: bool) -> tuple[str, str]:
    """A hardware profile at one intra-op thread, what each of the 2 ranks runs with."""
    path = session.runs_dir / "hardware" / "hw-1thread.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    args = ("hw", *(("--quick",) if quick else ()), "--output", str(path))
    command, _ = session.run(*args, env={"OMP_NUM_THREADS": "1"})
    return f"OMP_NUM_THREADS=1 {command}", str(path)


def _sweep_row(axis: str, row: dict) -> dict:
    applies = row.get("reason") is None
    return {
        "axis": axis,
        "value": row[axis],
        "strategy": row["strategy"],
        "samples_per_s": row.get("throughput") if applies else None,
        "exposed_comm_share": row["communication_s"] / row["step_s"] if applies else None,
        "fits": row.get("fits") if applies else None,
        "cannot_apply": row.get("reason"),
    }


def _crossover_table(sweeps: dict) -> pd.DataFrame:
    frames = [crossovers(frame, [axis]) for axis, (frame, _) in sweeps.items()]
    found = [f for f in frames if len(f)]
    return pd.concat(found, ignore_index=True).drop(columns=["held"]) if found else pd.DataFrame()


def _validation_table(measured: pd.DataFrame) -> pd.DataFrame:
    ran = measured[measured["reason"].isna()]
    return pd.DataFrame(
        {
            "workload": ran["workload"],
            "batch": ran["batch"],
            "strategy": ran["strategy"],
            "measured_ms": 1e3 * ran["measured_s"],
            "predicted_ms": 1e3 * ran["predicted_s"],
            "error": ran["error"].map(percent),
        }
    )


def _best(frame: pd.DataFrame, axis: str) -> list[tuple[float, str]]:
    """(value, best strategy) along the axis, the best being the fastest that applies and fits."""
    from dnnperf.perfmodel.whatif import best_per_configuration

    best = best_per_configuration(frame, [axis])
    return [(float(v), b or "none fits") for v, b in zip(best[axis], best["best"], strict=True)]


def _crossover_claim(sweeps: dict) -> Claim:
    found = _crossover_table(sweeps)
    axes_with = sorted(set(found["axis"])) if len(found) else []
    parts = [
        f"{r.axis}: {r.before or 'none fits'} -> {r.after or 'none fits'} between {r.below:g} and {r.above:g}"
        for r in found.itertuples()
    ]
    if not parts:
        bests = [b for axis, (frame, _) in sweeps.items() for _, b in _best(frame, axis)]
        counts = ", ".join(f"{b} at {bests.count(b)}" for b in sorted(set(bests)))
        parts = [
            f"no crossover along the {len(sweeps)} axes: the fastest of {len(bests)} configurations is "
            + counts
        ]
    return Claim(
        claim="Which of data and model parallelism scales better depends on where the configuration lies "
        "along the five axes: the best choice changes along them.",
        measured="; ".join(parts),
        verdict=verdict(len(axes_with) >= 2),
        why=f"the best strategy changes along {len(axes_with)} of {len(sweeps)} axes "
        f"({', '.join(axes_with) or 'none'})",
        commands=[command for _, command in sweeps.values()],
    )


def _comm_share(frame: pd.DataFrame, axis: str, strategy: str) -> list[tuple[float, float]]:
    rows = frame[(frame["strategy"] == strategy) & frame["reason"].isna()].sort_values(axis)
    return [(float(r[axis]), r["communication_s"] / r["step_s"]) for _, r in rows.iterrows()]


def _link_claim(sweeps: dict) -> Claim:
    frame, command = sweeps["link_gbps"]
    shares = _comm_share(frame, "link_gbps", "dp")
    falling = all(b[1] <= a[1] + 1e-12 for a, b in itertools.pairwise(shares))
    text = ", ".join(f"{v:g} Gbit/s: {percent(s)}" for v, s in shares)
    best = ", ".join(f"{v:g}: {b}" for v, b in _best(frame, "link_gbps"))
    return Claim(
        claim="Data parallelism's gradient exchange is bound by the network link: a slower link makes it "
        "costlier and moves the balance towards model parallelism.",
        measured=f"dp's exposed exchange as a share of its step: {text}; best strategy per link: {best}",
        verdict=verdict(len(shares) > 1 and falling and shares[0][1] > shares[-1][1]),
        why="the exposed share falls as the link gets faster" if falling else "the share does not fall",
        commands=[command],
    )


def _compute_claim(sweeps: dict) -> Claim:
    frame, command = sweeps["tflops"]
    shares = _comm_share(frame, "tflops", "dp")
    rising = all(b[1] >= a[1] - 1e-12 for a, b in itertools.pairwise(shares))
    text = ", ".join(f"{v:g} TFLOP/s: {percent(s)}" for v, s in shares)
    return Claim(
        claim="Faster nodes shorten computation but not communication, so communication weighs more on "
        "data parallelism as node FLOP/s grow.",
        measured=f"dp's exposed exchange as a share of its step: {text}",
        verdict=verdict(len(shares) > 1 and rising and shares[-1][1] > shares[0][1]),
        why="the share rises with node FLOP/s" if rising else "the share does not rise",
        commands=[command],
    )


def _accuracy_claim(measured: pd.DataFrame, ranking: pd.DataFrame, commands: list[str]) -> Claim:
    ran = measured[measured["reason"].isna()]
    errors = ran["error"].abs()
    agree = int(ranking["agrees"].sum()) if len(ranking) else 0
    return Claim(
        claim="The analytical model predicts real distributed training (validated against a Python "
        "distributed-training library).",
        measured=f"{len(ran)} 2-rank runs (gloo): median |error| {percent(errors.median())}, max "
        f"{percent(errors.max())}; the strategies' ranking agrees in {agree} of {len(ranking)}",
        verdict=verdict(len(ran) > 0 and errors.median() <= 0.15),
        why="median error within 15% (the performance model's target for 2-rank runs)"
        if errors.median() <= 0.15
        else "median error above 15% on this shared 2-core CPU",
        commands=commands_of(commands),
    )
