"""IV614: a lot the tariff catalog does not price (a B200) is said to be unchecked, never passed in silence; the
configuration's tariffs cover it, and it is then checked like a catalog lot (IV602)."""
from __future__ import annotations

import json

from fixtures.edit import edit_manifest
from tests.helpers import codes, run_cli, static_findings


def b200_lot(package_dir, price: float, gpus: int = 1) -> None:
    def edit(m):
        m["plan"]["lots"][0].update(gpu="B200", gpus=gpus, price_usd=price)
        m["plan"]["rental_total_usd"] = price
        m["decision"].pop("cost_per_accepted_usd")

    edit_manifest(package_dir, edit)


def test_a_b200_lot_the_catalog_does_not_price_is_IV614_info(package_dir):
    b200_lot(package_dir, 500)
    found = static_findings(package_dir)
    (finding,) = [f for f in found if f.code == "IV614"]
    assert finding.severity.value == "info" and finding.pointer == "/plan/lots/0"
    assert "lot 0 (B200, 3 days, 500.00 USD) is not compared with any tariff: the catalog has no B200 lot" \
        in finding.message
    assert '"B200" = { "3" = 500 }' in finding.message
    assert "IV602" not in codes(found)


def test_a_lot_length_the_catalog_lacks_is_IV614_naming_the_lengths_it_has(package_dir):
    edit_manifest(package_dir, lambda m: m["plan"]["lots"][0].update(days=5))
    (finding,) = [f for f in static_findings(package_dir) if f.code == "IV614"]
    assert "the catalog prices RTX 4090 for 3, 7, 30 days only" in finding.message


def test_the_clean_package_has_no_IV614(package_dir):
    assert "IV614" not in codes(static_findings(package_dir))


def write_tariff(folder, price: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "itera-verify.toml").write_text(f'[tariffs]\n"B200" = {{ "3" = {price} }}\n')


def verify_json(folder, package_dir) -> dict:
    result = run_cli(package_dir, "--no-reload", "--no-seal", "--format", "json", cwd=folder)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_the_configured_tariffs_cover_a_b200_lot_and_check_it_like_a_catalog_lot(package_dir, tmp_path):
    b200_lot(package_dir, 500)
    write_tariff(tmp_path / "agrees", 500)
    agreed = {f["code"] for f in verify_json(tmp_path / "agrees", package_dir)["findings"]}
    assert not agreed & {"IV602", "IV614"}
    write_tariff(tmp_path / "differs", 450)
    (finding,) = [f for f in verify_json(tmp_path / "differs", package_dir)["findings"] if f["code"] == "IV602"]
    assert "500.00 USD but the catalog says 450.00 USD" in finding["message"]
    assert finding["severity"] == "warning"
