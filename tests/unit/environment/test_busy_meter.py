"""The environment service's load measure: the mean fraction of slots busy over a trailing window."""

from __future__ import annotations

import pytest

from scalerl.environment.service import BusyMeter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_one_call_for_half_the_window_on_two_slots_is_a_quarter():
    clock = Clock()
    meter = BusyMeter(slots=2, window_s=10.0, clock=clock)
    meter.change(+1)
    clock.t += 5.0
    meter.change(-1)
    clock.t += 5.0
    assert meter.busy_fraction() == pytest.approx(5.0 / (10.0 * 2))


def test_the_window_forgets_what_ended_before_it():
    clock = Clock()
    meter = BusyMeter(slots=1, window_s=10.0, clock=clock)
    meter.change(+1)
    clock.t += 4.0
    meter.change(-1)  # busy 100-104
    clock.t += 12.0  # now 116: the window 106-116 saw nothing
    assert meter.busy_fraction() == 0.0
    meter.change(+1)
    clock.t += 3.0  # busy 116-119, window 109-119
    assert meter.busy_fraction() == pytest.approx(0.3)


def test_a_window_that_cuts_a_busy_stretch_counts_only_its_part():
    clock = Clock()
    meter = BusyMeter(slots=4, window_s=10.0, clock=clock)
    for _ in range(3):
        meter.change(+1)  # 3 calls from t=100
    clock.t += 8.0
    meter.change(-1)  # 2 from t=108
    clock.t += 7.0  # now 115, window 105-115: 3 calls for 3 s, 2 calls for 7 s
    assert meter.busy_fraction() == pytest.approx((3 * 3 + 2 * 7) / (10 * 4))


def test_a_young_meter_averages_over_its_life_and_saturates_at_one():
    clock = Clock()
    meter = BusyMeter(slots=1, window_s=30.0, clock=clock)
    meter.change(+1)
    clock.t += 3.0  # 3 s old, busy all of it
    assert meter.busy_fraction() == pytest.approx(1.0)
    meter.change(+1)  # two calls on one slot (a queue the meter does not see): still at most 1
    clock.t += 3.0
    assert meter.busy_fraction() == 1.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="slots"):
        BusyMeter(slots=0)
