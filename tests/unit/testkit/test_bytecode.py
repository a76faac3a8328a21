"""compile_project writes the byte code a process told not to write it would compile on every start."""

from __future__ import annotations

import sys

from testkit.bytecode import compile_project


def _package(root):
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text("VALUE = 1\n")


def test_byte_code_is_written_where_python_writes_none_by_itself(tmp_path, monkeypatch):
    _package(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert compile_project(tmp_path, packages=("pkg", "absent"))
    assert {p.name.split(".")[0] for p in (tmp_path / "pkg" / "__pycache__").glob("*.pyc")} == {"__init__", "mod"}


def test_nothing_is_written_where_the_first_import_writes_it(tmp_path, monkeypatch):
    _package(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert not compile_project(tmp_path, packages=("pkg",))
    assert not (tmp_path / "pkg" / "__pycache__").exists()
