"""Messages that say what is wrong in the user's terms (issue 19): a template placeholder for an adapter's base
is not called a local path (IV502)."""
from __future__ import annotations

from fixtures.edit import edit_json, edit_manifest
from tests.helpers import static_findings
from tests.test_artifact_rules import ADAPTER_CONFIG, _adapter_entry


def iv502(package_dir):
    return {f.path: f.message for f in static_findings(package_dir) if f.code == "IV502"}


def test_a_placeholder_base_is_called_a_placeholder_not_a_local_path(package_dir):
    edit_manifest(package_dir, lambda m: _adapter_entry(m)["base"].update(name="<hub id of the base model>"))
    edit_json(package_dir, ADAPTER_CONFIG, lambda c: c.update(base_model_name_or_path="<base model>"))
    messages = iv502(package_dir)
    assert set(messages) == {"manifest.json", ADAPTER_CONFIG}
    for message in messages.values():
        assert "template placeholder" in message and "local path" not in message, message


def test_a_local_path_base_is_still_called_a_local_path(package_dir):
    edit_manifest(package_dir, lambda m: _adapter_entry(m)["base"].update(name="/workspace/models/base"))
    assert "is a local path" in iv502(package_dir)["manifest.json"]
