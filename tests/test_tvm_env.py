"""pipeline.tvm_env's shared helpers: one-line messages from TVM's (often multi-line) errors."""

import pytest


def test_last_line_takes_the_message_after_tvms_traceback_and_copes_with_none():
    from pipeline.tvm_env import last_line

    assert last_line(RuntimeError("Traceback (most recent call last):\n  0: f\nValueError: bad tile\n\n")) == \
        "ValueError: bad tile"
    assert last_line(RuntimeError("")) == ""
    assert last_line(IndexError()) == ""
    assert last_line(RuntimeError("\n   \n")) == ""


def test_a_design_space_error_without_a_message_is_a_space_error(monkeypatch, matmul_mod, cpu_target):
    """An error TVM raises with no message used to escape as an IndexError of our own
    (splitlines()[-1] of ""), not the one-line SpaceError the callers catch."""
    from pipeline import space

    class Empty:
        def generate_design_space(self):
            raise RuntimeError()

    monkeypatch.setattr(space, "context", lambda target, mod: Empty())
    with pytest.raises(space.SpaceError, match="no design space on llvm: RuntimeError$"):
        space.design_spaces(matmul_mod, cpu_target)
