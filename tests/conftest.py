"""Fixtures every suite shares.

`device`: every backend compiled into this build (rlx.backends()), so a test that takes `device`
runs on each of them, and a new backend is tested by all such tests with no list to edit.
"""

from __future__ import annotations

import pytest

import rlx


@pytest.fixture(params=rlx.backends())
def device(request) -> str:
    return request.param
