"""What the HTML renderer (html_format.py, html_charts.py) writes, as an allowlist: the audit holds a sealed
`SEAL/report.html` to it, since the README sends reviewers to that page and a sender writes every byte of it.

Kept here, beside the renderer, so the two change together: tests/test_report_page_check.py renders pages and
requires that each passes. A page passes when it holds only these elements and attributes, links only to its own
sections, carries the renderer's Content-Security-Policy, and names one verdict. No script, event handler, comment,
external URL, `javascript:` or `data:` value, and no CSS that fetches (`url(`, `@import`) is ever the renderer's.

Before html.parser reads the page, a linear pass checks its shape as the renderer writes it: every `<` opens a tag
that closes before the next `<` (values are escaped), no comment, no control character. That way no text reaches
html.parser that a browser would read as markup and it would not, and its work stays linear in the page's size.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

from .html_format import CSP

ELEMENTS = frozenset({
    "html", "head", "meta", "title", "style", "body", "main", "nav", "footer", "h1", "h2", "h3", "p", "div", "span",
    "b", "br", "code", "a", "table", "thead", "tbody", "tr", "th", "td", "dl", "dt", "dd", "details", "summary",
    "figure", "figcaption",
    "svg", "g", "rect", "line", "circle", "polyline", "path", "text",  # the charts (html_charts.py)
})
ATTRIBUTES = frozenset({
    "class", "id", "title", "style", "lang", "href", "charset", "http-equiv", "name", "content",
    "role", "aria-label", "viewbox", "width", "height", "x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "r", "rx",
    "d", "points", "fill", "stroke", "stroke-width", "stroke-linejoin", "stroke-dasharray", "text-anchor",
    "font-size",
})
META = {"charset": {"utf-8"}, "name": {"viewport"}, "http-equiv": {"content-security-policy"}}
TEXT_ATTRIBUTES = frozenset({"title", "aria-label"})  # shown as words, never fetched
PAGE_MAX = 64 << 20  # bytes read of a sealed page, as the seal's records (seal/plan.py SEAL_LAYOUT)
PROBLEMS_SHOWN = 5

_FRAGMENT = re.compile(r"#[A-Za-z0-9_-]*")
_SCHEMES = re.compile(r"(?:javascript|data|vbscript)\s*:", re.I)
_FETCHING_CSS = re.compile(r"url|image|@import|@font-face|expression|\\|javascript|src", re.I)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_TAG = re.compile(r"<[^<>]*(>)?")
_VERDICT = re.compile(r"(?:^|\s)verdict\s+(pass|fail)(?:\s|$)")


@dataclass
class PageCheck:
    problems: list[str] = field(default_factory=list)  # what the renderer never writes, first few
    verdict: str | None = None  # the page's verdict (its `verdict pass|fail` box), when it names one

    def add(self, problem: str) -> None:
        if len(self.problems) < PROBLEMS_SHOWN and problem not in self.problems:
            self.problems.append(problem)


def check_page(data: bytes) -> PageCheck:
    """What in `data` (a whole page, at most PAGE_MAX bytes) the renderer never writes."""
    result = PageCheck()
    if len(data) > PAGE_MAX:
        result.add(f"larger than {PAGE_MAX} bytes")
        return result
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        result.add(f"not UTF-8 (byte {exc.start})")
        return result
    _check_shape(text, result)
    if result.problems:
        return result  # html.parser might read it otherwise than a browser: nothing more is said of it
    parser = _Parser(result)
    parser.feed(text)
    parser.close()
    if not parser.csp:
        result.add(f"no Content-Security-Policy meta element `{CSP}`")
    if len(parser.verdicts) != 1:
        result.add(f"{len(parser.verdicts)} verdict boxes (the renderer writes one)")
    else:
        result.verdict = parser.verdicts[0]
    return result


def _check_shape(text: str, result: PageCheck) -> None:
    control = _CONTROL.search(text)
    if control:
        result.add(f"a control character U+{ord(control.group()):04X} at character {control.start()}")
    if "<!--" in text:
        result.add(f"a comment at character {text.index('<!--')}")
    for match in _TAG.finditer(text):
        if match.group(1) is None:
            result.add(f"a `<` that opens no whole tag at character {match.start()}")
        elif match.group().startswith(("<!", "<?")) and match.group().lower() != "<!doctype html>":
            result.add(f"a declaration {match.group()[:40]!r}")
        if len(result.problems) >= PROBLEMS_SHOWN:
            return


class _Parser(HTMLParser):
    def __init__(self, result: PageCheck):
        super().__init__(convert_charrefs=False)  # a raw `<` in text stays visible to handle_data
        self.result = result
        self.open: list[str] = []
        self.csp = False
        self.verdicts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ELEMENTS:
            self.result.add(f"a <{tag}> element")
        for name, value in attrs:
            self._attribute(tag, name, value or "", attrs)
        if tag == "div":
            found = _VERDICT.search(dict(attrs).get("class") or "")
            if found:
                self.verdicts.append(found.group(1))
        if tag not in ("meta", "br"):
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in ("meta", "br") and self.open:
            self.open.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag in self.open:
            while self.open and self.open.pop() != tag:
                pass

    def _attribute(self, tag: str, name: str, value: str, attrs) -> None:
        if name.startswith("on"):
            self.result.add(f"an event handler {name}= on <{tag}>")
            return
        if name not in ATTRIBUTES:
            self.result.add(f"an attribute {name}= on <{tag}>")
            return
        if tag == "meta":
            self._meta(name, value, dict(attrs))
            return
        if name == "href" and not _FRAGMENT.fullmatch(value):
            self.result.add(f"a link to {value[:80]!r} (the renderer links only to the page's own sections)")
        elif name == "content":
            self.result.add(f"a content= attribute on <{tag}>")
        elif name == "style" and _FETCHING_CSS.search(value):
            self.result.add(f"a style that may fetch or hide a value: {value[:80]!r}")
        elif name not in TEXT_ATTRIBUTES and (_SCHEMES.search(value) or "url(" in value.lower()):
            self.result.add(f"{name}={value[:80]!r} on <{tag}>")

    def _meta(self, name: str, value: str, attrs: dict) -> None:
        """<meta charset="utf-8">, the viewport, and the renderer's own Content-Security-Policy: nothing else."""
        if name != "content":
            if name not in META or value.lower() not in META[name]:
                self.result.add(f"a <meta {name}={value[:80]!r}>")
        elif (attrs.get("http-equiv") or "").lower() == "content-security-policy":
            if value != CSP:
                self.result.add(f"a Content-Security-Policy other than the renderer's: {value[:120]!r}")
            self.csp = self.csp or value == CSP
        elif attrs.get("name") != "viewport" or _SCHEMES.search(value) or "url" in value.lower():
            self.result.add(f"a <meta> content {value[:80]!r}")

    def handle_data(self, data: str) -> None:
        if "<" in data:
            self.result.add("a `<` in text (the renderer escapes every one)")
        if self.open and self.open[-1] == "style" and _FETCHING_CSS.search(data):
            self.result.add(f"a style sheet that may fetch: {_FETCHING_CSS.search(data).group()!r}")

    def handle_comment(self, data: str) -> None:
        self.result.add("a comment")

    def handle_decl(self, decl: str) -> None:
        if decl.lower() != "doctype html":
            self.result.add(f"a declaration <!{decl[:40]}>")

    def unknown_decl(self, data: str) -> None:
        self.result.add(f"a declaration <![{data[:40]}")

    def handle_pi(self, data: str) -> None:
        self.result.add(f"a processing instruction <?{data[:40]}")


__all__ = ["ATTRIBUTES", "ELEMENTS", "PAGE_MAX", "PageCheck", "check_page"]
