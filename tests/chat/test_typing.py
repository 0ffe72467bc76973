"""rlx ships its types: a py.typed marker and stubs for the extension, rlx/_C.pyi, with a stub for
every public name of rlx._C and every public attribute of its classes (so a name added to the C
module without a stub fails here); help(rlx) starts from rlx.load."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import rlx
from rlx import _C

PKG = Path(rlx.__file__).resolve().parent


def stub_names() -> tuple[set[str], dict[str, set[str]]]:
    tree = ast.parse((PKG / "_C.pyi").read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return top, members


def test_every_public_name_of_C_has_a_stub():
    top, members = stub_names()
    public = {n for n in dir(_C) if not n.startswith("_")}
    assert public - top == set(), "names of rlx._C without a stub in rlx/_C.pyi"
    assert top - public == set(), "stubs for names rlx._C does not have"
    for name in sorted(public):
        obj = getattr(_C, name)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            attrs = {a for a in vars(obj) if not a.startswith("_")}
            assert attrs - members[name] == set(), f"_C.{name} attributes without a stub"
            assert members[name] - attrs - {"__init__"} == set(), f"stubs for attributes _C.{name} lacks"


def test_py_typed_marker_and_packaging():
    assert (PKG / "py.typed").is_file()
    if sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads((PKG.parent / "pyproject.toml").read_text())
        assert set(project["tool"]["setuptools"]["package-data"]["rlx"]) >= {"py.typed", "*.pyi"}


def test_help_starts_from_load():
    doc = rlx.__doc__.strip().splitlines()
    assert "rlx.load(" in "\n".join(doc[:5])
    assert "ChatTemplate" in rlx.__all__ and callable(rlx.load)
