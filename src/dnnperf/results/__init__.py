"""Run records and the store that keeps them."""

from dnnperf.results.record import Point, RunRecord
from dnnperf.results.store import RunStore, read_record

__all__ = ["Point", "RunRecord", "RunStore", "read_record"]
