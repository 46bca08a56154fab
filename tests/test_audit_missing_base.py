"""A reviewer's machine without the renter's hub cache (issue 39 item 5): `audit --reload` says the base is
missing as such (IV505 naming `--hf-cache` and the repo@revision to fetch), and the record comparison never
reports IV701 ("the record does not describe this content") for what the reviewer's machine could not do."""
from __future__ import annotations

import pytest

from itera_verify import audit, settle

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]


@pytest.fixture(scope="module")
def without_the_base(sealed, tmp_path_factory):
    empty_cache = tmp_path_factory.mktemp("reviewer-hub-cache")
    return audit(sealed, settle(reviewer=True, reload=True, device="cpu", hf_cache=empty_cache)), empty_cache


def test_a_base_missing_from_the_reviewers_cache_is_IV505_naming_hf_cache_and_what_to_fetch(without_the_base, built):
    report, _ = without_the_base
    [finding] = [f for f in report.findings if f.code == "IV505"]
    assert finding.artifact == "lora-r16-adapter"
    assert f"{built['base_model']}@{built['base_revision']}" in finding.message
    assert f"huggingface-cli download {built['base_model']} --revision {built['base_revision']}" in finding.message
    assert "--hf-cache DIR" in finding.message


def test_what_the_reviewers_machine_could_not_do_is_no_IV701(without_the_base):
    report, _ = without_the_base
    codes = {f.code for f in report.findings}
    assert "IV701" not in codes and "IV509" not in codes, [f.to_json() for f in report.findings]
    comparison = report.audit["comparison"]
    assert comparison["explained_by_this_machine"] == ["IV505"] and comparison["unexplained_blocking"] == []
