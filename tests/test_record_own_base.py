"""A base pre-trained locally, laid out as a hub cache (itera_verify.record.hub.add_to_hub_cache, the recipe in
docs/record.md): transformers loads it offline by hub id, the recorder resolves the commit it pins, and
the same files give the same commit."""
from __future__ import annotations

import pytest
from itera_verify.record import RecordError
from itera_verify.record.hub import add_to_hub_cache, resolve_commit

from fixtures.artifacts import tiny_gpt2


def test_a_locally_built_base_loads_offline_by_hub_id_at_its_pinned_commit(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny_gpt2(3).save_pretrained(tmp_path / "my-base")
    cache = tmp_path / "hub"
    commit = add_to_hub_cache(tmp_path / "my-base", "my-lab/tiny-base", cache_dir=cache)
    assert add_to_hub_cache(tmp_path / "my-base", "my-lab/tiny-base", cache_dir=cache) == commit  # same files
    assert resolve_commit("my-lab/tiny-base", cache_dir=cache) == commit
    model = AutoModelForCausalLM.from_pretrained("my-lab/tiny-base", cache_dir=cache, local_files_only=True)
    built = tiny_gpt2(3).state_dict()
    assert all(value.equal(built[name]) for name, value in model.state_dict().items())
    snapshot = cache / "models--my-lab--tiny-base" / "snapshots" / commit / "model.safetensors"
    assert snapshot.is_symlink() and snapshot.resolve().parent.name == "blobs"


def test_a_folder_without_config_or_a_local_path_as_id_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordError, match="config.json"):
        add_to_hub_cache(tmp_path / "empty", "my-lab/x", cache_dir=tmp_path / "hub")
    with pytest.raises(RecordError, match="not a hub id"):
        add_to_hub_cache(tmp_path / "empty", "../my-base", cache_dir=tmp_path / "hub")
