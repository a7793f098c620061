import math

import numpy as np
import pytest

from dnnperf.stats import Samples

pytestmark = pytest.mark.concurrent  # nothing here is timed (pyproject: markers)


def test_quantiles_match_hand_computed_values():
    samples = Samples.of([4.0, 1.0, 3.0, 2.0, 5.0])
    assert samples.median == 3.0
    # Linear interpolation over sorted [1..5]: position q*(n-1).
    assert samples.p10 == pytest.approx(1.4)
    assert samples.p90 == pytest.approx(4.6)
    assert samples.mean == 3.0
    assert samples.std == pytest.approx(math.sqrt(2.5))
    assert samples.iqr == pytest.approx(2.0)


def test_summary_agrees_with_numpy_on_random_samples():
    values = np.random.default_rng(0).exponential(size=101)
    summary = Samples.of(values).summary()
    assert summary["n"] == 101
    assert summary["median"] == pytest.approx(float(np.median(values)))
    assert summary["p90"] == pytest.approx(float(np.percentile(values, 90)))
    assert summary["min"] == values.min() and summary["max"] == values.max()


def test_empty_samples_are_nan_not_errors():
    summary = Samples.of([]).summary()
    assert summary["n"] == 0 and math.isnan(summary["median"]) and math.isnan(summary["std"])
