"""Fixtures for the model tests: `hf_model`, a random-initialised transformers model saved as a
Hugging Face directory once per session per case (see hf_cases.py). Parametrize with
    @pytest.mark.parametrize("hf_model", list(HF_CASES), indirect=True)
and the fixture yields (path, model).
"""

from __future__ import annotations

import pytest
from hf_cases import HF_CASES, build


@pytest.fixture(scope="session")
def hf_model(request, tmp_path_factory):
    """(path, model) for the case named by request.param (indirect parametrization)."""
    name = request.param
    family, kwargs = HF_CASES[name]
    model = build(family, kwargs)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path, safe_serialization=True)
    return str(path), model
