"""Every checker runs as a student runs it and as grading runs it: each chapter's test module
imports this fixture (``from hidden_sizes import hidden_sizes``), which then applies to all its tests."""

import pytest

from course_lib.teaching import exercises


@pytest.fixture(autouse=True, params=[False, True], ids=["visible sizes", "hidden sizes"])
def hidden_sizes(request, monkeypatch):
    """Every checker as a student runs it, and as grading runs it: with one more case of
    random size (exercises.common.HIDDEN_SIZES), which right answers must pass too."""
    monkeypatch.setattr(exercises.common, "HIDDEN_SIZES", request.param)
    return request.param
