"""`itera-verify assemble PART... -o DIR`: the lots' parts, each audited as hostile input, joined into one campaign
that closes and seals whole; every refusal with its code, and nothing written under DIR then."""
from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from itera_verify import settle, verify
from itera_verify.flows.assemble import assemble
from tests.helpers import run_cli
from tests.lots import CAMPAIGN, allowed_signers, close, keygen, lots, record_lot, seal_part

needs_ssh = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")


@pytest.fixture(scope="module")
def machines(tmp_path_factory) -> Path:
    """Lot A's and lot B's packages, recorded on their own 'machines' (folders), and their parts sealed."""
    folder = tmp_path_factory.mktemp("machines")
    for lot in ("lot-a", "lot-b"):
        seal_part(record_lot(folder / lot, lot), folder / "parts")
    return folder


def parts(machines: Path, tmp_path: Path, *lots: str) -> list[Path]:
    """Private copies of the sealed parts (a test may change them)."""
    out = tmp_path / "parts"
    out.mkdir(exist_ok=True)
    return [Path(shutil.copy(machines / "parts" / f"{CAMPAIGN}.{lot}.part.tar.zst", out)) for lot in lots]


def join(sources, out: Path, **options):
    return assemble([str(s) for s in sources], out, settle(reviewer=True, **options))


def refused(assembly, out: Path) -> list[tuple[str, str]]:
    """The refusals (code, message); nothing may be left under DIR."""
    assert assembly.verdict == "fail" and assembly.package is None
    assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())
    found = [(f.code, f.message) for f in assembly.findings]
    found += [(f.code, f.message) for part in assembly.parts for f in part.findings]
    return found


def test_two_parts_assemble_into_one_campaign_that_closes_and_seals_whole(machines, tmp_path):
    out = tmp_path / "assembled"
    assembly = join(parts(machines, tmp_path, "lot-b", "lot-a"), out)
    assert assembly.verdict == "pass", [f.to_json() for f in assembly.findings]
    package = out / CAMPAIGN
    manifest = json.loads((package / "manifest.json").read_text())
    assert [p["lot"] for p in manifest["parts"]] == ["lot-a", "lot-b"]  # the plan's order, whatever was given
    assert all(p["signer"] is None and len(p["sha256"]) == 64 for p in manifest["parts"])
    assert [r["id"] for r in manifest["runs"]] == ["control", "lora-r8", "lora-r16"]
    assert sorted(json.loads((package / "reload.json").read_text())["artifacts"]) == [
        "control-weights", "lora-r16-weights", "lora-r8-weights"]
    lot_b = json.loads((package / "provenance/lot-b/manifest.json").read_text())
    # Each machine declared at its own moment: the campaign keeps the earliest.
    assert manifest["created_at"] <= lot_b["created_at"]
    assert (package / "params/lora-r8.json").read_bytes() == \
        (machines / "lot-b" / CAMPAIGN / "params/lora-r8.json").read_bytes()  # as the part holds it
    close(package, ["control", "lora-r8", "lora-r16"], observed_hours=4)
    report = verify(package, settle(reload=False, output=f"{tmp_path}/sealed/"))
    assert report.verdict == "pass" and report.sealed, [f.to_json() for f in report.findings]
    assert report.budget["total_usd"] == 94.28 and report.budget["cost_per_accepted_usd"] == 31.43
    assert [(lot["id"], lot["runs"]) for lot in report.plan["lots"]] == [
        ("lot-a", ["control"]), ("lot-b", ["lora-r8", "lora-r16"])]


def test_a_folder_of_parts_assembles_from_the_command_line(machines, tmp_path):
    parts(machines, tmp_path, "lot-a", "lot-b")
    done = run_cli("assemble", tmp_path / "parts", "-o", tmp_path / "assembled", "--format", "json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["mode"] == "assemble" and report["verdict"] == "pass"
    assert [p["lot"] for p in report["audit"]["parts"]] == ["lot-a", "lot-b"]
    from itera_verify.package.schemas import validator

    assert list(validator("report").iter_errors(report)) == []
    for fmt in ("junit", "github", "html"):  # the shared renderers read the assembly's report too
        shown = run_cli("assemble", tmp_path / "parts", "-o", tmp_path / fmt, "--format", fmt)
        assert shown.returncode == 0 and shown.stdout, (fmt, shown.stderr[-2000:])
    text = run_cli("assemble", tmp_path / "parts", "-o", tmp_path / "again")
    assert text.returncode == 0 and "ASSEMBLED:" in text.stdout


def test_a_package_folder_given_as_a_part_is_exit_2(machines, tmp_path):
    done = run_cli("assemble", machines / "lot-a" / CAMPAIGN, "-o", tmp_path / "assembled")
    assert done.returncode == 2 and "a package folder, not a part" in done.stderr


def test_an_existing_campaign_folder_under_DIR_is_exit_2_and_left_alone(machines, tmp_path):
    (tmp_path / "assembled" / CAMPAIGN).mkdir(parents=True)
    done = run_cli("assemble", *parts(machines, tmp_path, "lot-a", "lot-b"), "-o", tmp_path / "assembled")
    assert done.returncode == 2 and "already exists" in done.stderr
    assert [p.name for p in (tmp_path / "assembled").iterdir()] == [CAMPAIGN]


def test_parts_that_disagree_on_the_question_are_IV615_naming_both_values(machines, tmp_path):
    other = record_lot(tmp_path / "lot-b", "lot-b", question="Does a LoRA variant beat the control?")
    sources = [*parts(machines, tmp_path, "lot-a"), seal_part(other, tmp_path / "other")]
    found = refused(join(sources, tmp_path / "assembled"), tmp_path / "assembled")
    assert [code for code, _ in found] == ["IV615"]
    assert "on question: lot-a has \"Does a LoRA variant reach the control's loss?\", lot-b has " \
           "\"Does a LoRA variant beat the control?\"" in found[0][1]


def test_parts_that_disagree_on_a_lot_s_price_are_IV615_naming_the_field(machines, tmp_path):
    plan = lots("lot-a", "lot-b")
    plan[1]["price_usd"] = 48.0
    sources = [*parts(machines, tmp_path, "lot-a"), seal_part(record_lot(tmp_path / "b", "lot-b", plan=plan),
                                                              tmp_path / "other")]
    found = refused(join(sources, tmp_path / "assembled"), tmp_path / "assembled")
    assert any(code == "IV615" and "plan.lots[1].price_usd: lot-a has 47.14, lot-b has 48.0" in message
               for code, message in found), found


def test_a_file_both_parts_hold_that_differs_is_IV615(machines, tmp_path):
    a = record_lot(tmp_path / "a", "lot-a", extra_files={"analysis/notes.md": b"lot a's notes\n"})
    b = record_lot(tmp_path / "b", "lot-b", extra_files={"analysis/notes.md": b"lot b's notes\n"})
    sources = [seal_part(a, tmp_path / "pa"), seal_part(b, tmp_path / "pb")]
    found = refused(join(sources, tmp_path / "assembled"), tmp_path / "assembled")
    assert [code for code, _ in found] == ["IV615"] and "both parts hold analysis/notes.md" in found[0][1]


def test_a_run_id_on_two_lots_is_IV616(machines, tmp_path):
    b = record_lot(tmp_path / "b", "lot-b", [("control", "variant", 5)])
    found = refused(join([*parts(machines, tmp_path, "lot-a"), seal_part(b, tmp_path / "pb")],
                         tmp_path / "assembled"), tmp_path / "assembled")
    assert ("IV616", "run control is in the parts of lot-a and lot-b: a run ran on one machine; give the other its "
                     "own id (a rerun is a new run)") in found


def test_two_parts_sealed_for_one_lot_are_IV617(machines, tmp_path):
    sources = parts(machines, tmp_path, "lot-a", "lot-b")
    again = record_lot(tmp_path / "again", "lot-b", [("lora-r4", "variant", 7)])
    older = seal_part(again, tmp_path / "older")
    found = refused(join([*sources, older], tmp_path / "assembled"), tmp_path / "assembled")
    assert [code for code, _ in found] == ["IV617"] and "two parts for lot lot-b" in found[0][1]


def test_lot_a_s_part_renamed_as_lot_b_s_is_refused(machines, tmp_path):
    (a,) = parts(machines, tmp_path, "lot-a")
    renamed = tmp_path / "renamed" / f"{CAMPAIGN}.lot-b.part.tar.zst"
    renamed.parent.mkdir()
    shutil.move(a, renamed)
    found = refused(join([renamed], tmp_path / "assembled"), tmp_path / "assembled")
    assert [code for code, _ in found] == ["IV616"] and "named for lot lot-b but its runs ran on lot-a" in found[0][1]


def test_a_tampered_part_is_refused_by_its_audit(machines, tmp_path):
    a, b = parts(machines, tmp_path, "lot-a", "lot-b")
    data = bytearray(b.read_bytes())
    data[len(data) // 2] ^= 0x01
    b.write_bytes(bytes(data))
    assembly = join([a, b], tmp_path / "assembled")
    found = refused(assembly, tmp_path / "assembled")
    assert {"IV701"} <= {code for code, _ in found}, found
    assert [p.verdict for p in assembly.parts] == ["pass", "fail"]


def test_a_part_carrying_a_forged_manifest_parts_is_refused(machines, tmp_path):
    root = record_lot(tmp_path / "b", "lot-b")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["parts"] = [{"lot": "lot-a", "archive": "x.part.tar.zst", "sha256": "0" * 64, "signer": "alice"}]
    (root / "manifest.json").write_text(json.dumps(manifest))
    forged = seal_part(root, tmp_path / "pb", selection=_ignoring("IV615"))  # the sender's own configuration
    found = refused(join([*parts(machines, tmp_path, "lot-a"), forged], tmp_path / "assembled"),
                    tmp_path / "assembled")
    assert any(code == "IV615" and "holds manifest.parts" in message for code, message in found), found


def test_a_part_whose_member_climbs_out_of_its_folder_is_refused_and_writes_nothing_outside(machines, tmp_path):
    (a,) = parts(machines, tmp_path, "lot-a")
    hostile = tmp_path / "hostile" / f"{CAMPAIGN}.lot-b.part.tar.zst"
    hostile.parent.mkdir()
    payload = tmp_path / "payload"
    payload.write_bytes(b"escaped\n")
    with open(hostile, "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as stream, \
            tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        tar.add(payload, arcname=f"{CAMPAIGN}/../../escaped.txt")
    (tmp_path / "out").mkdir()
    found = refused(join([a, hostile], tmp_path / "out" / "assembled"), tmp_path / "out" / "assembled")
    assert {"IV703"} & {code for code, _ in found}, found
    assert not list(tmp_path.rglob("escaped.txt"))


@needs_ssh
def test_a_part_signed_by_a_key_the_reviewer_does_not_allow_is_IV803(tmp_path):
    alice, mallory = keygen(tmp_path, "alice"), keygen(tmp_path, "mallory")
    a = seal_part(record_lot(tmp_path / "a", "lot-a"), tmp_path / "parts", sign=f"ssh:{alice}")
    b = seal_part(record_lot(tmp_path / "b", "lot-b"), tmp_path / "parts", sign=f"ssh:{mallory}")
    reviewer = allowed_signers(tmp_path / "allowed_signers", alice)
    assembly = join([a, b], tmp_path / "assembled", allowed_signers=reviewer)
    found = refused(assembly, tmp_path / "assembled")
    assert [code for code, _ in found] == ["IV803"] and assembly.parts[1].signer is not None
    both = join([a, seal_part(record_lot(tmp_path / "b2", "lot-b"), tmp_path / "b2parts", sign=f"ssh:{alice}")],
                tmp_path / "assembled", allowed_signers=reviewer)
    assert both.verdict == "pass" and [p.signer for p in both.parts] == ["alice@example.com"] * 2


@needs_ssh
def test_an_unsigned_part_is_IV801_when_the_reviewer_requires_signatures(machines, tmp_path):
    alice = keygen(tmp_path, "alice")
    found = refused(join(parts(machines, tmp_path, "lot-a", "lot-b"), tmp_path / "assembled",
                         allowed_signers=allowed_signers(tmp_path / "allowed", alice)), tmp_path / "assembled")
    assert {code for code, _ in found} == {"IV801"}


def test_three_lots_assemble_into_one_campaign(tmp_path):
    plan = lots("lot-a", "lot-b", "lot-c")
    sources = [seal_part(record_lot(tmp_path / lot, lot, plan=plan), tmp_path / "parts")
               for lot in ("lot-c", "lot-a", "lot-b")]
    assembly = join(sources, tmp_path / "assembled")
    assert assembly.verdict == "pass", [f.to_json() for f in assembly.findings]
    package = tmp_path / "assembled" / CAMPAIGN
    close(package, ["control", "lora-r8", "lora-r16", "lora-r32"], observed_hours=4)
    report = verify(package, settle(reload=False, seal=False))
    assert report.verdict == "pass", [f.to_json() for f in report.findings]
    assert [lot["id"] for lot in report.plan["lots"]] == ["lot-a", "lot-b", "lot-c"]
    assert report.budget["total_usd"] == 141.42 and report.budget["cost_per_accepted_usd"] == 35.36


def test_a_lot_that_delivered_no_part_is_said_and_its_price_still_counts(machines, tmp_path):
    assembly = join(parts(machines, tmp_path, "lot-a"), tmp_path / "assembled")
    assert assembly.verdict == "pass" and assembly.lots_without_part == ["lot-b"]


def _ignoring(*codes):
    from itera_verify import Selection

    return Selection(ignore=codes)


def test_the_assembled_package_is_what_the_parts_sealed(machines, tmp_path):
    """Every file of every part is in the package, byte for byte, under its own path (sha256sum -c of each
    part's SHA256SUMS over the package, its three merged documents read from provenance/)."""
    join(parts(machines, tmp_path, "lot-a", "lot-b"), tmp_path / "assembled")
    package = tmp_path / "assembled" / CAMPAIGN
    for lot in ("lot-a", "lot-b"):
        sums = (package / "provenance" / lot / "SHA256SUMS").read_text().splitlines()
        listed = [line for line in sums if not line.endswith(("manifest.json", "stops.json", "reload.json"))
                  and "SEAL/" not in line]
        done = subprocess.run(["sha256sum", "-c", "--quiet", "-"], input="\n".join(listed) + "\n", text=True,
                              cwd=package, capture_output=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


# ---- a lot's signed reload proof, where the assembling machine cannot reload -------------------------------------

@pytest.fixture(scope="module")
def reloaded_parts(tmp_path_factory) -> dict:
    """Both lots' parts sealed after reloading their artifacts there, signed by alice, and unsigned."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("needs OpenSSH's ssh-keygen")
    folder = tmp_path_factory.mktemp("reloaded")
    alice = keygen(folder, "alice")
    signed, unsigned = folder / "signed", folder / "unsigned"
    for lot in ("lot-a", "lot-b"):
        package = record_lot(folder / lot, lot)
        seal_part(package, signed, reload=True, sign=f"ssh:{alice}")
        seal_part(package, unsigned, reload=True, overwrite=True)
    return {"signed": signed, "unsigned": unsigned, "allowed": allowed_signers(folder / "allowed", alice)}


def closed_campaign(parts_folder: Path, tmp_path: Path, **options) -> Path:
    assembly = join([parts_folder], tmp_path / "assembled", **options)
    assert assembly.verdict == "pass", [f.to_json() for f in assembly.findings]
    package = tmp_path / "assembled" / CAMPAIGN
    close(package, ["control", "lora-r8", "lora-r16"], observed_hours=4)
    return package


def reverify(package: Path, monkeypatch, memory: str | None):
    if memory is not None:  # this machine's reloads get less memory than the artifacts need
        monkeypatch.setenv("ITERA_RELOAD_HOST_MEMORY", memory)
    return verify(package, settle(reload=True, device="cpu", seal=False))


@pytest.mark.slow
def test_an_artifact_this_machine_lacks_the_memory_to_reload_stands_on_its_lot_s_signed_proof(
        reloaded_parts, tmp_path, monkeypatch):
    package = closed_campaign(reloaded_parts["signed"], tmp_path, allowed_signers=reloaded_parts["allowed"])
    report = reverify(package, monkeypatch, "40M")
    assert report.verdict == "pass", [f.to_json() for f in report.findings]
    where = {r.artifact: r.facts["reloaded_on"] for r in report.reloads}
    assert {a: (w["lot"], w["signer"]) for a, w in where.items()} == {
        "control-weights": ("lot-a", alice_fingerprint(package, "lot-a")),
        "lora-r8-weights": ("lot-b", alice_fingerprint(package, "lot-b")),
        "lora-r16-weights": ("lot-b", alice_fingerprint(package, "lot-b"))}
    assert all("of host memory, its limit" in w["here"]["error"] for w in where.values())
    assert [lot["reloaded_on_the_lot"] for lot in report.plan["lots"]] == [
        ["control-weights"], ["lora-r8-weights", "lora-r16-weights"]]
    from itera_verify.report import renderer

    assert not any(r.ok for r in report.reloads)  # not reloaded here: standing on a proof is not a reload
    text = renderer("text")(report, {})
    assert "not reloaded here (cpu: " in text and "stands on lot-b's signed proof: reloaded there on cpu" in text
    assert "3 not reloaded here (each stands on its lot's signed proof)" in text


def alice_fingerprint(package: Path, lot: str) -> str:
    statement = json.loads((package / "provenance" / lot / "statement.json").read_text())
    return statement["signer"]["fingerprint"]


@pytest.mark.slow
def test_with_memory_enough_every_artifact_is_reloaded_here(reloaded_parts, tmp_path, monkeypatch):
    report = reverify(closed_campaign(reloaded_parts["signed"], tmp_path), monkeypatch, None)
    assert report.verdict == "pass" and not any("reloaded_on" in r.facts for r in report.reloads)


@pytest.mark.slow
def test_an_unsigned_part_s_record_proves_nothing_here(reloaded_parts, tmp_path, monkeypatch):
    report = reverify(closed_campaign(reloaded_parts["unsigned"], tmp_path), monkeypatch, "40M")
    assert {f.code for f in report.blocking()} >= {"IV504"}
    assert not any(r.ok for r in report.reloads)


@pytest.mark.slow
def test_an_artifact_changed_after_its_lot_sealed_it_is_never_excused(reloaded_parts, tmp_path, monkeypatch):
    package = closed_campaign(reloaded_parts["signed"], tmp_path, allowed_signers=reloaded_parts["allowed"])
    weights = package / "artifacts/lora-r8.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0")  # not the bytes the lot reloaded and signed
    report = reverify(package, monkeypatch, "40M")
    failed = {r.artifact for r in report.reloads if not r.ok and "reloaded_on" not in r.facts}
    assert failed == {"lora-r8-weights"} and "IV504" in {f.code for f in report.blocking()}


@pytest.mark.slow
def test_a_campaign_assembled_under_another_reviewer_s_key_stands_on_no_lot_s_proof(
        reloaded_parts, tmp_path, monkeypatch):
    """What assemble recorded is authenticated with the key of the reviewer who ran it (provenance/<lot>/
    assembled.json): verified under another key, no lot's signed proof stands for anything."""
    package = closed_campaign(reloaded_parts["signed"], tmp_path, allowed_signers=reloaded_parts["allowed"])
    other = tmp_path / "other.key"
    other.write_text("ab" * 32 + "\n")
    other.chmod(0o600)
    monkeypatch.setenv("ITERA_RESULTS_KEY", str(other))
    report = reverify(package, monkeypatch, "40M")
    assert {f.code for f in report.blocking()} >= {"IV504"}
    assert not any(r.ok or "reloaded_on" in r.facts for r in report.reloads)


@pytest.mark.slow
def test_a_lot_s_assembled_record_removed_or_put_under_another_lot_proves_nothing(
        reloaded_parts, tmp_path, monkeypatch):
    package = closed_campaign(reloaded_parts["signed"], tmp_path, allowed_signers=reloaded_parts["allowed"])
    lot_a, lot_b = (package / "provenance" / lot / "assembled.json" for lot in ("lot-a", "lot-b"))
    lot_b.write_bytes(lot_a.read_bytes())  # lot-a's genuine record, under lot-b
    lot_a.unlink()
    report = reverify(package, monkeypatch, "40M")
    assert {r.artifact for r in report.reloads if "reloaded_on" in r.facts} == set()
    assert {f.code for f in report.blocking()} >= {"IV504"}


def test_a_memory_failure_stands_on_a_lot_only_where_the_artifact_s_size_explains_it(machines, tmp_path):
    """Never a timeout; a failure for want of memory only where what the artifact needs for its size on disk is
    more than this machine gives a reload: under a low ITERA_RELOAD_HOST_MEMORY, yes; a tiny artifact that ran
    out of the automatic limit (its size times 4, and the libraries'), never: that is the artifact's doing."""
    from itera_verify.flows.partproofs import _size_explains
    from itera_verify.model import ReloadResult
    from itera_verify.reload.limits import over_limit
    from itera_verify.runtime.environment import Environment
    from tests.helpers import context

    join(parts(machines, tmp_path, "lot-a", "lot-b"), tmp_path / "assembled")
    package = tmp_path / "assembled" / CAMPAIGN
    artifact = {"id": "control-weights", "run": "control", "path": "artifacts/control.safetensors"}
    starved = ReloadResult("control-weights", "safetensors", device="cpu", failure="crash",
                           error=over_limit(2 << 30, "automatic"))
    endless = ReloadResult("control-weights", "safetensors", device="cpu", failure="timeout",
                           error="timed out after 15 s")

    def explains(result, **variables) -> bool:
        environment = Environment.read({**variables})
        return _size_explains(context(package, reload=True, environment=environment), result, artifact)

    assert not explains(starved)  # the automatic limit, on a machine with more: the artifact asked too much
    assert explains(starved, ITERA_RELOAD_HOST_MEMORY="40M")  # the reviewer's machine gives less than it needs
    assert not explains(endless, ITERA_RELOAD_HOST_MEMORY="40M")


def test_each_lot_s_rental_start_comes_from_its_own_part(tmp_path):
    from datetime import UTC, datetime, timedelta

    sources, began = [], {}
    for lot, hours in (("lot-a", 3), ("lot-b", 2)):  # each machine knows when its own rental began
        began[lot] = (datetime.now(UTC) - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
        plan = [dict(entry, started_at=began[lot]) if entry["id"] == lot else entry for entry in lots("lot-a", "lot-b")]
        sources.append(seal_part(record_lot(tmp_path / lot, lot, plan=plan), tmp_path / "parts"))
    assembly = join(sources, tmp_path / "assembled")
    assert assembly.verdict == "pass", [f.to_json() for f in assembly.findings]
    plan = json.loads((tmp_path / "assembled" / CAMPAIGN / "manifest.json").read_text())["plan"]
    assert [lot["started_at"] for lot in plan["lots"]] == [began["lot-a"], began["lot-b"]]
