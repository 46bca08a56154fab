"""What a loader admits from the artifact's own files, before the library reads them.

A library that loads from a folder reads options from the folder's files (sentence-transformers merges
sentence_bert_config.json's `model_args` into from_pretrained, diffusers imports the classes model_index.json names,
timm hands config.json's `model_args` to the model's constructor): whoever wrote the package would choose the
loader's arguments (a device map offloading to a folder of their choice, a file outside the package, code to
import). Each loader lists, in one constant, the keys it admits in each such file and the values each may take;
anything else is refused here, before the library is called (IV504 naming the file, the key and the value).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..common import LOAD, Outcome, Stop

SHOWN = 80  # characters of a refused value quoted in the message


@dataclass(frozen=True)
class Admit:
    """One admitted form of a value: a test, and the form in words for the message ('true or false')."""

    test: Callable[[Any], bool]
    what: str

    def __call__(self, value: Any) -> bool:
        try:
            return bool(self.test(value))
        except (TypeError, ValueError, AttributeError):
            return False


# A section: a JSON object whose own keys are admitted by the mapping (nested checks, named `outer.inner`).
Section = Mapping[str, "Admit | Section"]

PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# A module's dotted name inside a model (`encoder.layer.0.attention`): no pattern characters, no path.
MODULE_PATH = re.compile(r"[A-Za-z0-9_]{1,64}(?:\.[A-Za-z0-9_]{1,64}){0,15}")
TEXT_LIMIT = 4096


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2 ** 31


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


ANY = Admit(lambda value: True, "anything (not read by the library)")
BOOLEAN = Admit(lambda value: isinstance(value, bool), "true or false")
WHOLE = Admit(_whole, "a whole number")
NUMBER = Admit(_number, "a finite number")
NAME = Admit(lambda value: isinstance(value, str) and bool(PLAIN_NAME.fullmatch(value)), "a plain name")
MODULE = Admit(lambda value: isinstance(value, str) and bool(MODULE_PATH.fullmatch(value)),
               "a module name (letters, digits, _ and dots)")
TEXT = Admit(lambda value: isinstance(value, str) and len(value) <= TEXT_LIMIT,
             f"text of at most {TEXT_LIMIT} characters")


def _same(value, expected) -> bool:
    """Equal as JSON values: true is not 1, 0 is not false, 1.0 is 1."""
    return value == expected and isinstance(value, bool) == isinstance(expected, bool) \
        and type(value) in (type(expected), int, float)


def one_of(*values, what: str | None = None) -> Admit:
    words = ", ".join(json.dumps(v) for v in values)
    return Admit(lambda value: any(_same(value, v) for v in values),
                 what or (f"one of {words}" if len(values) > 1 else words))


def optional(admit: Admit) -> Admit:
    return Admit(lambda value: value is None or admit(value), f"null or {admit.what}")


def list_of(admit: Admit, most: int = 64) -> Admit:
    return Admit(lambda value: isinstance(value, list) and len(value) <= most and all(admit(v) for v in value),
                 f"a list of at most {most} × {admit.what}")


def mapping_of(key: Admit, value: Admit, most: int = 64) -> Admit:
    return Admit(lambda given: isinstance(given, dict) and len(given) <= most
                 and all(key(k) and value(v) for k, v in given.items()),
                 f"an object of at most {most} entries, {key.what} → {value.what}")


def shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


def refuse(outcome: Outcome, file: Path, key: str, value: Any, why: str) -> None:
    """Record one refused option (IV504): the file, the key (dotted for a nested one), the value and why."""
    outcome.fail(LOAD, f"{outcome.rel(file)}: {key} = {shown(value)} is not admitted ({why}); refused before "
                       "loading: no file of the package chooses the loader's arguments", file)


def admit(document: Any, admitted: Section, file: Path, outcome: Outcome, *, prefix: str = "") -> int:
    """Every key of `document` is one `admitted` lists, with a value of the admitted form; each other one is
    recorded as refused. Returns how many were refused (the caller stops before loading when any was)."""
    if not isinstance(document, dict):
        refuse(outcome, file, prefix.rstrip(".") or "(the document)", document, "expected a JSON object")
        return 1
    refused = 0
    for key, value in document.items():
        rule = admitted.get(key)
        name = f"{prefix}{key}"
        if rule is None:
            refuse(outcome, file, name, value, f"not a key this loader admits here; it admits "
                                               f"{', '.join(sorted(admitted)) or 'none'}")
            refused += 1
        elif isinstance(rule, Mapping):
            refused += admit(value, rule, file, outcome, prefix=f"{name}.")
        elif not rule(value):
            refuse(outcome, file, name, value, f"expected {rule.what}")
            refused += 1
    return refused


def walk(document: Any, prefix: str = "") -> Iterator[tuple[str, str, Any, dict]]:
    """Every (dotted name, key, value, the object holding it) of a JSON document, at any depth."""
    if isinstance(document, dict):
        for key, value in document.items():
            name = f"{prefix}{key}"
            yield name, str(key), value, document
            yield from walk(value, f"{name}.")
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from walk(value, f"{prefix}{index}.")


def stop_if_refused(outcome: Outcome) -> None:
    if outcome.problems:
        raise Stop.recorded()
