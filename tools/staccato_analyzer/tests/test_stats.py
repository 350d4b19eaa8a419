import math

import numpy as np
import pytest

from staccato_analyzer import stats as S
from staccato_analyzer.plots import spectrum_points


def test_percentile_1_to_100():
    v = list(range(1, 101))
    assert S.percentile(v, 50) == 50
    assert S.percentile(v, 99) == 99
    assert S.percentile(v, 100) == 100
    assert S.percentile(v, 75) == 75
    assert S.percentile(v, 99.9) == 100
    assert S.percentile(v, 0) == 1
    assert S.percentile(list(reversed(v)), 90) == 90  # order does not matter


def test_percentile_edges():
    assert math.isnan(S.percentile([], 50))
    assert S.percentile([7.5], 0) == 7.5
    assert S.percentile([7.5], 99.999) == 7.5
    assert S.percentile([1, 2], 50) == 1
    assert S.percentile([1, 2], 50.0001) == 2
    assert S.percentile([1, 2, 3], 100) == 3
    # float rounding: 99.9% of 1000 is rank 999 exactly, not 1000
    assert S.percentile(range(1, 1001), 99.9) == 999
    assert S.percentile(range(1, 100001), 99.999) == 99999
    assert S.percentile([1, 2, float("inf")], 50) == 2
    assert S.percentile([1, 2, float("inf")], 100) == float("inf")
    with pytest.raises(ValueError):
        S.percentile([1], 101)


def test_pkey():
    assert [S.pkey(p) for p in S.PERCENTILES] == [
        "p50", "p75", "p90", "p99", "p99.9", "p99.99", "p99.999", "p100"]


def test_union_length():
    assert S.union_length([]) == 0
    assert S.union_length([(0, 2), (3, 5)]) == 4
    assert S.union_length([(5, 20), (10, 15), (1, 24)]) == 23
    assert S.union_length([(0, 1), (1, 2), (4, 4)]) == 2


def test_breakdown_binning():
    sched = [0.1, 0.4, 1.2, 1.3, 2.5]
    lat = [10, 20, 5, 7, 100]
    cold = [4, 0, 0, 0, float("nan")]
    queue = [1, 2, 1, 3, float("nan")]
    exe = [2, 2, 2, 2, float("nan")]  # last row has no breakdown: ignored
    b = S.breakdown_bins(sched, lat, cold, queue, exe, bin_s=1.0, t0=0.0, t1=3.0)
    assert list(b["n"]) == [2, 2, 0]
    np.testing.assert_allclose(b["center_s"], [0.5, 1.5, 2.5])
    np.testing.assert_allclose(b["init"][:2], [2.0, 0.0])
    np.testing.assert_allclose(b["wait"][:2], [1.5, 2.0])
    np.testing.assert_allclose(b["exec"][:2], [2.0, 2.0])
    np.testing.assert_allclose(b["latency"][:2], [15.0, 6.0])
    np.testing.assert_allclose(b["rest"][:2], [15 - 5.5, 6 - 4.0])
    assert np.isnan(b["init"][2])
    # rest never negative
    b = S.breakdown_bins([0.0], [1.0], [0.0], [1.0], [1.0], bin_s=0.5)
    assert b["rest"][0] == 0.0
    # nothing usable
    b = S.breakdown_bins([0.0], [1.0], [float("nan")], [float("nan")], [float("nan")], bin_s=1.0)
    assert b["n"].sum() == 0


def test_nice_bin():
    assert S.nice_bin(10) == 0.1
    assert S.nice_bin(60) == 1
    assert S.nice_bin(0.5) == 0.01


def test_spectrum_points():
    xs, ys = spectrum_points(range(1, 1001))
    assert xs[0] == 1.0 and ys[0] == 1
    assert xs[-1] == 1000 and ys[-1] == 999  # p = 1 - 1/1000 = 99.9%
    assert np.all(np.diff(ys) >= 0)


def test_slo_select():
    rows = [{"configured_rate": 10, "slo_ok": True}, {"configured_rate": 40, "slo_ok": False},
            {"configured_rate": 20, "slo_ok": True}, {"configured_rate": 30, "slo_ok": False}]
    assert S.slo_select(rows)["configured_rate"] == 20
    assert S.slo_select([{"configured_rate": 5, "slo_ok": False}]) is None
