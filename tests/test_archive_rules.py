"""Issue 15, "one module owns each code", for the archive codes: IV701–IV706 are declared and made in
rules/archive.py only (the seal and the audit hand it facts), IV706 has one message, and the seal no longer
re-emits the path rules' IV203/IV204."""
from __future__ import annotations

import re
from pathlib import Path

from itera_verify.archive.extract import Extraction
from itera_verify.rules import archive as archive_rules

SOURCE = Path(archive_rules.__file__).resolve().parents[1]
CODE_LITERAL = re.compile(r"""["'](IV70[1-6]|IV20[34])["']""")


def test_only_the_owning_rule_modules_spell_the_archive_and_link_codes():
    owners = {"IV203": "rules/paths.py", "IV204": "rules/paths.py"}
    for path in sorted(SOURCE.rglob("*.py")):
        rel = path.relative_to(SOURCE).as_posix()
        for code in set(CODE_LITERAL.findall(path.read_text(encoding="utf-8"))):
            assert rel == owners.get(code, "rules/archive.py"), f"{rel} spells {code}"


def test_IV706_reads_the_same_from_the_static_check_and_from_the_seal():
    static = archive_rules._reserved_seal_folder()
    [sealed] = archive_rules.seal_findings([("seal-folder", "SEAL", "")])
    assert (static.code, static.path, static.message) == (sealed.code, sealed.path, sealed.message)


def test_the_seals_link_refusals_are_its_own_IV703():
    findings = archive_rules.seal_findings([("broken-link", "a", "gone"), ("leaving-link", "b", "/etc")])
    assert [(f.code, f.path) for f in findings] == [("IV703", "a"), ("IV703", "b")]
    assert "broken" in findings[0].message and "/etc" in findings[1].message


def test_a_stream_outside_the_profile_is_IV703_named_after_its_member():
    from itera_verify.archive.profile import OutsideProfile

    facts = archive_rules.AuditFacts("a.tar.zst", 1 << 30,
                                     Extraction(error=OutsideProfile("a GNU long name", "top/SEAL/zz1", 512)))
    [finding] = archive_rules.audit_findings(facts)
    assert (finding.code, finding.path) == ("IV703", "top/SEAL/zz1")
