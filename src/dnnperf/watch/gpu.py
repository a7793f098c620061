"""NVIDIA GPU counters through NVML (the nvidia-ml-py package, module ``pynvml``).

Used only when the package is installed and a driver answers; otherwise there are no GPU series and
:func:`open_gpus` says why in one line. A counter a device does not support is None in its series.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from dnnperf.results.watch import GpuSeries


class GpuSampler:
    """Reads every device NVML sees; :meth:`close` shuts NVML down."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.series = [
            GpuSeries(index=i, name=_text(nvml.nvmlDeviceGetName(h))) for i, h in enumerate(self.handles)
        ]

    def sample(self) -> None:
        """Append one value per counter and device."""
        nvml = self.nvml
        for handle, series in zip(self.handles, self.series, strict=True):
            utilization = self.read(lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            memory = self.read(lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h).used)
            # PCIe throughput comes in KB/s (a 20 ms window the driver samples); power in milliwatts.
            rx = self.read(lambda h=handle: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES))
            tx = self.read(lambda h=handle: nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES))
            power = self.read(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h))
            series.utilization_pct.append(None if utilization is None else float(utilization))
            series.memory_used_bytes.append(None if memory is None else int(memory))
            series.pcie_rx_bytes_per_s.append(None if rx is None else rx * 1024.0)
            series.pcie_tx_bytes_per_s.append(None if tx is None else tx * 1024.0)
            series.power_w.append(None if power is None else power / 1000.0)

    def read(self, call: Callable[[], Any]) -> Any:
        """A counter's value, or None where the device or driver does not give it."""
        try:
            return call()
        except self.nvml.NVMLError:
            return None

    def close(self) -> None:
        with contextlib.suppress(Exception):  # NVML gone already: nothing left to release
            self.nvml.nvmlShutdown()


def open_gpus() -> tuple[GpuSampler | None, str | None]:
    """A sampler over every NVIDIA device, or None and the reason there is none."""
    try:
        import pynvml
    except ImportError:
        return None, "no GPU series: nvidia-ml-py (module pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return None, f"no GPU series: no NVIDIA driver answered ({error})"
    try:
        sampler = GpuSampler(pynvml)
    except pynvml.NVMLError as error:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
        return None, f"no GPU series: NVML could not list the devices ({error})"
    if not sampler.handles:
        sampler.close()
        return None, "no GPU series: the NVIDIA driver sees no device"
    return sampler, None


def _text(value: str | bytes) -> str:
    """Older nvidia-ml-py releases return bytes for names."""
    return value.decode() if isinstance(value, bytes) else value
