"""cachenode/store/pins_file.py: a node's pins in its data directory, whole or not at all."""

from __future__ import annotations

import json

from cachenode.store import pins_file


def test_pins_saved_are_loaded_as_they_were(tmp_path):
    saved = {"http://h/a": {"Job/ml/a": None, "Job/ml/b": 1767225600.5}}
    pins_file.save(tmp_path, saved)
    assert pins_file.load(tmp_path) == saved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pins.json"], "no temporary file left"


def test_no_file_is_no_pins(tmp_path):
    assert pins_file.load(tmp_path / "never-made") == {}


def test_an_unreadable_file_is_set_aside_and_the_node_starts_without_pins(tmp_path):
    (tmp_path / "pins.json").write_text(json.dumps({"version": 9, "pins": {}}))
    assert pins_file.load(tmp_path) == {}
    assert (tmp_path / "pins.json.unreadable").exists() and not (tmp_path / "pins.json").exists()
    (tmp_path / "pins.json").write_text("{not json")
    assert pins_file.load(tmp_path) == {}
