"""assemble's merge resolves every link of the joined tree through the links of every part (flows/assemble_merge.py):
each part's audit resolved only its own links, so two parts whose links chain can lead out of the campaign folder
or loop once joined. These call the real merge on the parts' entries as `_extract` reads them from an archive;
the end-to-end attack (two sealed parts, the real command line) is tests/test_redteam4_assemble.py."""
from __future__ import annotations

from itera_verify.flows.assemble_merge import PartContent, merge


def part(lot: str, entries: dict[str, tuple[str, str]]) -> PartContent:
    manifest = {"format": "itera-output/1", "campaign_id": "two-lots", "question": "q",
                "plan": {"lots": [{"id": "lot-a"}, {"id": "lot-b"}]}, "runs": [{"id": f"run-{lot}", "lot": lot}]}
    return PartContent(f"two-lots.{lot}.part.tar.zst", {"manifest.json": manifest, "stops.json": {"stops": []},
                                                        "reload.json": {"artifacts": {}}}, entries)


def link(target: str) -> tuple[str, str]:
    return ("symlink", target)


FILE = ("file", "0" * 64)


def refusals(*parts: PartContent) -> list[tuple[str, str]]:
    return [(f.code, f.path) for f in merge(list(parts)).findings]


def test_two_parts_links_that_chain_above_the_campaign_folder_are_IV703():
    """lot-a's `x/up -> ..` stays inside; lot-b's `y -> x/up/..` would be its own folder on lot-b; joined, `y`
    climbs one level above the campaign folder."""
    a = part("lot-a", {"x/up": link(".."), "x/keep": FILE})
    b = part("lot-b", {"y": link("x/up/.."), "z": FILE})
    assert refusals(a, b) == [("IV703", "y")]


def test_a_loop_of_links_across_two_parts_is_IV703():
    a = part("lot-a", {"p": link("q")})
    b = part("lot-b", {"q": link("p")})
    assert {code for code, _ in refusals(a, b)} == {"IV703"}


def test_a_chain_of_41_links_over_two_parts_is_IV703_and_one_of_40_is_not():
    def chain(length: int) -> tuple[PartContent, PartContent]:
        names = [f"l{i}" for i in range(length)]
        a = {name: link(names[i + 1] if i + 1 < length else "data") for i, name in enumerate(names) if i % 2 == 0}
        b = {name: link(names[i + 1] if i + 1 < length else "data") for i, name in enumerate(names) if i % 2 == 1}
        return part("lot-a", {**a, "data": FILE}), part("lot-b", {**b, "data": FILE})

    assert refusals(*chain(40)) == []
    assert ("IV703", "l0") in refusals(*chain(41))


def test_an_entry_beneath_another_parts_link_is_IV615_though_no_folder_is_listed():
    a = part("lot-a", {"lnk": link("artifacts")})
    b = part("lot-b", {"lnk/.bashrc": FILE})
    assert refusals(a, b) == [("IV615", "lnk")]


def test_links_that_chain_inside_the_campaign_folder_across_two_parts_assemble():
    """The control: lot-b's link runs through lot-a's and lands on a folder both hold."""
    a = part("lot-a", {"x/up": link(".."), "artifacts/a.safetensors": FILE})
    b = part("lot-b", {"y": link("x/up/artifacts"), "artifacts/b.safetensors": FILE})
    merged = merge([a, b])
    assert merged.findings == [] and set(merged.sources) == {"x/up", "artifacts/a.safetensors", "y",
                                                               "artifacts/b.safetensors"}
