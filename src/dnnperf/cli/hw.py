"""``dnnperf hw``: calibrate this machine (or show its saved profile); and the profile other commands
compute efficiencies against."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dnnperf.cli.options import common
from dnnperf.cli.output import Output
from dnnperf.errors import UsageError
from dnnperf.paths import output_file, path_argument


def add_parsers(commands: Any) -> None:
    hw = commands.add_parser(
        "hw", help="calibrate this machine: peak FLOP/s, memory and host-device bandwidth, dispatch overhead"
    )
    hw.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (auto)")
    hw.add_argument("--quick", action="store_true", help="seconds instead of minutes: rough numbers")
    hw.add_argument(
        "--output", type=path_argument, help="where to save the profile (default: dnnperf's cache)"
    )
    hw.add_argument("--show", action="store_true", help="show the saved profile instead of calibrating")
    common(hw)
    hw.set_defaults(handler=cmd_hw)


def hardware_for(device_name: str, path: Path | None, out: Output) -> Any:
    """The hardware profile efficiencies are computed against: ``path``, else the saved one for the
    device (with a warning when it may not describe this process); None, with a note, when none."""
    from dnnperf import hardware
    from dnnperf.devices import resolve_device

    device = resolve_device(device_name)
    if path is not None and not path.exists():
        raise UsageError(f"--hw {path}: no such file")
    profile = hardware.load_profile(device, path)
    if profile is None:
        out.warn(f"no hardware profile for {device}: efficiencies and roofline need `dnnperf hw` first")
        return None
    reasons = hardware.stale_reasons(profile)
    if reasons:
        out.warn(f"hardware profile {path or hardware.profile_path(device)}: {'; '.join(reasons)}")
    return profile


def cmd_hw(args: argparse.Namespace, out: Output) -> int:
    from dnnperf import calibration, hardware
    from dnnperf.devices import resolve_device

    device = resolve_device(args.device)
    if args.show and args.quick:
        raise UsageError("--quick calibrates quickly; --show calibrates nothing: give one of them")
    if args.show:
        profile = hardware.load_profile(device, args.output)  # a bad file is a UsageError naming it
        if profile is None:
            raise UsageError(f"no saved hardware profile for {device}: run `dnnperf hw` first")
        path = args.output or hardware.profile_path(device)
    else:
        if args.output is not None:
            output_file(args.output, "--output", parents=True)  # before minutes of calibration
        with out.progress_fraction("calibrating") as progress:
            profile = calibration.calibrate(device, progress=progress, quick=args.quick)
        path = hardware.save_profile(profile, args.output)
        busy = hardware.busy_reason(profile)
        if busy:
            out.warn(busy)
    if args.json:
        out.json({"profile_path": str(path), "profile": profile.to_dict()})
    else:
        from dnnperf.report.terminal import hardware_table

        out.print(hardware_table(profile))
        out.print(f"profile: {path}")
    return 0
