"""The one timer (tfbigconv/timer.py): what it counts, on a fake clock."""
import pytest
import tensorflow as tf

from tfbigconv import timer


class Clock:
    """perf_counter for the timer; each call of `fn` advances it by the next of `seconds`."""

    def __init__(self, seconds):
        self.now, self.seconds, self.calls = 0.0, list(seconds), 0

    def perf_counter(self):
        return self.now

    def fn(self):
        self.now += self.seconds[self.calls]
        self.calls += 1
        return tf.zeros([1])


@pytest.fixture
def clock(monkeypatch):
    def make(seconds):
        c = Clock(seconds)
        monkeypatch.setattr(timer.time, "perf_counter", c.perf_counter)
        return c
    return make


def test_call_seconds_waits_for_the_result(clock):
    c = clock([0.5])
    assert timer.call_seconds(c.fn) == 0.5
    assert timer.call_seconds(lambda: None) == 0.0  # nothing to wait for


def test_calls_seconds_counts_after_a_warm_up(clock):
    c = clock([9.0, 1.0, 2.0, 3.0])
    assert timer.calls_seconds(c.fn, 3) == [1.0, 2.0, 3.0] and c.calls == 4
    c = clock([1.0, 2.0])
    assert timer.calls_seconds(c.fn, 2, warm_up=False) == [1.0, 2.0]


def test_a_slow_warm_up_is_the_only_call(clock):
    c = clock([3.0, 1.0])
    assert timer.calls_seconds(c.fn, 5, alone_above_s=2.0) == [3.0] and c.calls == 1


def test_calls_stop_once_enough_or_the_share_is_spent(clock):
    c = clock([0.1] + [1.0] * 5)
    assert timer.calls_seconds(c.fn, 5, enough_s=1.5) == [1.0, 1.0]  # two, then enough
    c = clock([0.1] + [1.0] * 5)
    assert timer.calls_seconds(c.fn, 5, share_s=0.5) == [1.0]  # one after the warm-up
