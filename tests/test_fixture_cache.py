"""The shared fixtures are built once per checkout and kept from one session to the next (conftest.built_once): a
second session takes them as they are, and one whose files a test changed by mistake is built again from empty,
never handed on."""
from __future__ import annotations

import importlib.util
import json

from tests import conftest


def test_a_kept_fixture_is_taken_again_and_a_changed_one_is_built_again(tmp_path, monkeypatch, tmp_path_factory):
    monkeypatch.setattr(conftest, "FIXTURES", tmp_path)
    builds = []

    def build(folder):
        builds.append(sorted(p.name for p in folder.iterdir()))  # what the build found: always an empty folder
        (folder / "package").mkdir()
        (folder / "package" / "manifest.json").write_text(json.dumps({"campaign_id": "c"}))
        return {"campaign": "c"}

    shared, info = conftest.built_once(tmp_path_factory, "toy", build)
    assert info["campaign"] == "c" and builds == [[]]
    assert conftest.built_once(tmp_path_factory, "toy", build)[0] == shared and builds == [[]]  # kept
    (shared / "package" / "manifest.json").write_text("{}")  # a test wrote into the shared fixture
    conftest.built_once(tmp_path_factory, "toy", build)
    assert builds == [[], []] and json.loads((shared / "package" / "manifest.json").read_text())["campaign_id"] == "c"
    (shared / "package" / "stray").write_bytes(b"")  # or left a file there
    conftest.built_once(tmp_path_factory, "toy", build)
    assert len(builds) == 3 and not (shared / "package" / "stray").exists()
    conftest.built_once(tmp_path_factory, "toy", build, version="2")  # its builder changed
    assert len(builds) == 4


def test_a_fixture_whose_builder_changed_is_built_again(tmp_path, monkeypatch, tmp_path_factory):
    """A builder in a test module of its own (test_gguf_header_caps._large_forms) is outside fixtures/: the file
    that defines it is part of the fixture's version."""
    monkeypatch.setattr(conftest, "FIXTURES", tmp_path / "kept")
    conftest.FIXTURES.mkdir()
    source = tmp_path / "toy_builder.py"
    source.write_text("calls = []\n\n\ndef build(folder):\n    calls.append(folder)\n    return {}\n")
    spec = importlib.util.spec_from_file_location("toy_builder", source)
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    conftest.built_once(tmp_path_factory, "toy", builder.build)
    conftest.built_once(tmp_path_factory, "toy", builder.build)
    assert len(builder.calls) == 1
    source.write_text(source.read_text() + "# the builder changed\n")
    conftest.built_once(tmp_path_factory, "toy", builder.build)
    assert len(builder.calls) == 2
