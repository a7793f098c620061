"""The batch size a run trains when none is given: the preset's, looked up in one place."""

import pytest

from dnnperf.errors import UsageError
from dnnperf.workloads import all_workloads, get_workload

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def test_the_default_is_each_presets_and_a_given_size_wins():
    for workload in all_workloads():
        for preset, size in workload.default_batch_size.items():
            assert workload.batch_size(preset) == size
            assert workload.batch_size(preset, size + 3) == size + 3


def test_an_unknown_preset_is_a_usage_error_not_a_key_error():
    with pytest.raises(UsageError, match="unknown preset 'huge'"):
        get_workload("basic_cnn").batch_size("huge")
