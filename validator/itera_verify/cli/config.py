"""Configuration: `[tool.itera-verify]` in pyproject.toml, or itera-verify.toml, found from a folder upward.

The command line overrides the file. An unknown key, code or level is a usage error naming it.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model import Severity, UsageError

KEYS = {"select", "ignore", "levels", "tmp-patterns", "tariffs", "device", "timeout"}


@dataclass
class Config:
    source: Path | None = None
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    levels: dict[str, Severity] = field(default_factory=dict)
    tmp_patterns: tuple[str, ...] = ()
    tariffs: dict[str, Any] | None = None
    device: str | None = None
    timeout: float | None = None


def find_config(start: Path) -> tuple[Path, dict] | None:
    """The nearest itera-verify.toml, or pyproject.toml with a [tool.itera-verify] table, from `start` upward."""
    for folder in [start, *start.parents]:
        own = folder / "itera-verify.toml"
        if own.is_file():
            data = _read_toml(own)
            return own, _tool_table(data, data)
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            table = _tool_table(_read_toml(pyproject), None)
            if table is not None:
                return pyproject, table
    return None


def _tool_table(data: dict, default):
    """`[tool.itera-verify]` when the file has one (a `tool` that is not a table has none)."""
    tool = data.get("tool")
    return tool.get("itera-verify", default) if isinstance(tool, dict) else default


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: invalid configuration ({exc})") from exc


def load_config(start: Path | None = None, explicit: Path | None = None) -> Config:
    if explicit is not None:
        data = _read_toml(explicit)
        found = (explicit, _tool_table(data, data))
    else:
        found = find_config((start or Path.cwd()).resolve())
    if found is None:
        return Config()
    source, table = found
    return parse_config(table, source)


def parse_config(table: Any, source: Path | None = None) -> Config:
    from ..rules import unknown_codes

    where = str(source) if source else "configuration"
    if not isinstance(table, dict):
        raise UsageError(f"{where}: [tool.itera-verify] must be a table")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    config = Config(source=source)
    for key in ("select", "ignore"):
        codes = table.get(key, [])
        if isinstance(codes, str):
            codes = [c.strip() for c in codes.split(",") if c.strip()]
        if not isinstance(codes, list) or not all(isinstance(c, str) for c in codes):
            raise UsageError(f"{where}: {key} must be a list of rule codes")
        bad = unknown_codes(codes)
        if bad:
            raise UsageError(f"{where}: {key}: unknown rule code {bad[0]!r}")
        setattr(config, key, tuple(codes))
    levels = table.get("levels", {})
    if not isinstance(levels, dict):
        raise UsageError(f"{where}: levels must be a table of CODE = \"error\"|\"warning\"|\"info\"|\"off\"")
    ignored = list(config.ignore)
    for code, level in levels.items():
        if unknown_codes([code]):
            raise UsageError(f"{where}: levels: unknown rule code {code!r}")
        if level == "off":
            ignored.append(code)
            continue
        try:
            config.levels[code] = Severity(level)
        except ValueError:
            raise UsageError(f"{where}: levels.{code}: unknown level {level!r} (error, warning, info, off)") from None
    config.ignore = tuple(ignored)
    patterns = table.get("tmp-patterns", [])
    if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
        raise UsageError(f"{where}: tmp-patterns must be a list of path prefixes")
    config.tmp_patterns = tuple(patterns)
    if "tariffs" in table:
        config.tariffs = _tariffs(table["tariffs"], where)
    if "device" in table:
        if table["device"] not in ("auto", "cuda", "cpu"):
            raise UsageError(f"{where}: device must be auto, cuda or cpu")
        config.device = table["device"]
    if "timeout" in table:
        timeout = table["timeout"]
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise UsageError(f"{where}: timeout must be a positive number of seconds")
        config.timeout = float(table["timeout"])
    return config


def _tariffs(tariffs: Any, where: str) -> dict[str, Any]:
    """GPU -> {days: USD}. TOML has nan and inf: a price the budget rules cannot compare would switch IV602 off
    for that lot in silence, so each price must be a finite amount within the manifest's own bounds."""
    from ..format.money import MAX_USD
    from ..package.campaign import MAX_DAYS

    if not isinstance(tariffs, dict):
        raise UsageError(f"{where}: tariffs must be a table")
    for gpu, prices in tariffs.items():
        if not isinstance(prices, dict):
            raise UsageError(f"{where}: tariffs.{gpu!r} must be a table of \"DAYS\" = USD")
        for days, price in prices.items():
            try:
                length = float(days)
            except ValueError:
                length = float("nan")
            if not 0 < length <= MAX_DAYS:
                raise UsageError(f"{where}: tariffs.{gpu!r}: {days!r} is not a lot length in days "
                                 f"(between 0 and {MAX_DAYS:,})")
            if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price <= MAX_USD:
                raise UsageError(f"{where}: tariffs.{gpu!r}.{days!r} = {price!r} is not a price in USD "
                                 f"(between 0 and {MAX_USD:,})")
    return tariffs
