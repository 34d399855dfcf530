"""Training budgets: the time limit stops before a step that would run past it (GRPO steps on
the H200 vary 28-118 s), and SIGTERM reaches a stage as KeyboardInterrupt so it can save."""

import os
import signal
import time

import pytest

from pipeline import budget


class _State:
    global_step = 0


class _Control:
    should_training_stop = False


def _steps(monkeypatch, limit, lengths):
    """Runs the callback over steps of the given lengths on a fake clock; the step it stopped at."""
    now = [0.0]
    monkeypatch.setattr(budget.time, "perf_counter", lambda: now[0])
    cb, state, control = budget.time_limit(limit), _State(), _Control()
    cb.on_train_begin(None, state, control)
    for n, length in enumerate(lengths, 1):
        cb.on_step_begin(None, state, control)
        now[0] += length
        state.global_step = n
        cb.on_step_end(None, state, control)
        if control.should_training_stop:
            return cb.stopped_at
    return cb.stopped_at


def test_the_limit_stops_before_a_step_that_would_end_past_it(monkeypatch):
    # 100 s steps, 505 s: after step 4 (400 s) a fifth would end at 500 s, a sixth at 600 s
    assert _steps(monkeypatch, 505, [100] * 8) == 5
    # the longest step so far counts: one 118-s step makes the stop come a step sooner
    assert _steps(monkeypatch, 505, [118, 75, 65, 54, 46, 43, 61, 28, 60]) == 6
    assert _steps(monkeypatch, None, [100] * 8) is None
    assert _steps(monkeypatch, 10_000, [100] * 8) is None


def test_sigterm_is_an_interrupt_within_and_only_within():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with budget.interrupts():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)                  # the handler raises at once; a test failure would wait 5 s
    assert signal.getsignal(signal.SIGTERM) is before
