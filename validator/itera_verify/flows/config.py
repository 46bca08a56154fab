"""Configuration: `[tool.itera-verify]` in pyproject.toml, or itera-verify.toml, found from a folder upward.

One reading for every entry point: the command line and the Python API (`verify(..., config=None)`, `audit`)
settle their options here the same way (`settle`); an explicit argument overrides the file. An unknown key,
code or level is a usage error naming it.

An audit applies the reviewer's configuration, never the sender's: a folder that holds an entry named
`manifest.json` or `SEAL` (what every sealed archive extracts to) is read as an extracted package, and no
configuration file in it, in a folder below it, or named by --config there, is read. The rule takes the
outermost such folder on the way up (a package inside a package is still the sender's), and it does not look
at what the manifest says: the sender writes the manifest, so its `format` field cannot be the test.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..format.names import PACKAGE_MARKS
from ..model import Severity, UsageError
from ..options import (CONFINEMENTS, DEFAULT_DEVICE, DEFAULT_TIMEOUT, DEVICES, ENGINES, ISOLATIONS, RunOptions,
                       Selection, make_options, option_names)
from ..runtime.environment import Environment
from ..runtime.hfcache import resolve_hf_cache

KEYS = {"select", "ignore", "levels", "tmp-patterns", "tariffs", "device", "timeout"}




@dataclass
class Config:
    source: Path | None = None
    not_applied: tuple[tuple[Path, str], ...] = ()  # configuration files passed over, and why
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    levels: dict[str, Severity] = field(default_factory=dict)
    tmp_patterns: tuple[str, ...] = ()
    tariffs: dict[str, Any] | None = None
    device: str | None = None
    timeout: float | None = None
    environment: Environment | None = None  # the entry point's snapshot (None: read when the options settle)


def find_config(start: Path, folders: list[Path] | None = None) -> tuple[Path, dict] | None:
    """The nearest itera-verify.toml, or pyproject.toml with a [tool.itera-verify] table, from `start` upward
    (or in `folders`, nearest first)."""
    for folder in [start, *start.parents] if folders is None else folders:
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


def package_mark(folder: Path) -> str | None:
    """`manifest.json` or `SEAL` when `folder` holds an entry of that name (of any type), else None."""
    return next((name for name in PACKAGE_MARKS if os.path.lexists(folder / name)), None)


def outermost_package(folder: Path) -> tuple[Path, str] | None:
    """(the outermost folder from `folder` upward that holds an extracted package, the entry that marks it)."""
    marked = [(f, mark) for f in [folder, *folder.parents] if (mark := package_mark(f)) is not None]
    return marked[-1] if marked else None


def _candidates(folders: list[Path]) -> list[Path]:
    """Every configuration file a search of `folders` could read (a pyproject.toml only with our table)."""
    found = []
    for folder in folders:
        found += [path for path in (folder / "itera-verify.toml", folder / "pyproject.toml") if path.is_file()]
    return found


def _tool_table(data: dict, default):
    """`[tool.itera-verify]` when the file has one (a `tool` that is not a table has none)."""
    tool = data.get("tool")
    return tool.get("itera-verify", default) if isinstance(tool, dict) else default


def _read_toml(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: invalid configuration ({exc})") from exc


def load_config(start: Path | None = None, explicit: Path | None = None, reviewer: bool = False) -> Config:
    """The configuration of `--config FILE`, or the one found from `start` (the current folder) upward.
    `reviewer` (an audit): never one in or below a folder that holds an extracted package (module docstring);
    those passed over are listed in `not_applied`."""
    passed_over: list[tuple[Path, str]] = []
    if explicit is not None:
        package = outermost_package(explicit.resolve().parent) if reviewer else None
        if package is not None:
            raise UsageError(f"--config {explicit}: {package[0]} holds {package[1]}, an extracted package: an audit "
                             "never applies a configuration from the sender's folder (use one outside it)")
        data = _read_toml(explicit)
        found = (explicit, _tool_table(data, data))
    else:
        origin = (start or Path.cwd()).resolve()
        folders = [origin, *origin.parents]
        package = outermost_package(origin) if reviewer else None
        if package is not None:
            inside = folders[:folders.index(package[0]) + 1]
            passed_over = [(path, f"{package[0]} holds {package[1]}: an extracted package, the sender's folder")
                           for path in _candidates(inside)]
            folders = folders[len(inside):]
        found = find_config(origin, folders)
    if found is None:
        return Config(not_applied=tuple(passed_over))
    source, table = found
    config = parse_config(table, source)
    config.not_applied = tuple(passed_over)
    return config


def describe(config: Config) -> dict:
    """What the report says about the configuration: the file applied (None: none, the rules' own levels) and
    the files passed over."""
    return {"applied": str(config.source) if config.source is not None else None,
            "not_applied": [{"path": str(path), "why": why} for path, why in config.not_applied]}


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


def settle(config: Config | None = None, *, reviewer: bool = False, **overrides: Any) -> RunOptions:
    """The options of one run, the only way to make them: the configuration file's settings under the caller's
    explicit `overrides` (RunOptions' field names; None leaves the file's or the default value).

    `config` None: the file the command line would find from the current folder (`reviewer`: an audit's rule,
    never the sender's file; an audit reloads only when asked); `Config()`: no file at all. The environment is
    read here, once, unless the entry point hands its own (`environment=`, or the Config's). An unknown name is
    a TypeError (a programming mistake); a value out of range is a UsageError (exit 2)."""
    from ..rules import unknown_codes

    unknown = sorted(set(overrides) - set(option_names()))
    if unknown:
        raise TypeError(f"settle() got an unknown option {unknown[0]!r} (RunOptions has: {', '.join(option_names())})")
    config = load_config(reviewer=reviewer) if config is None else config
    given = {name: value for name, value in overrides.items() if value is not None}
    environment = given.pop("environment", None) or config.environment or Environment.read()
    selection = given.pop("selection", None) or Selection(select=config.select, ignore=config.ignore,
                                                            levels=config.levels)
    bad = unknown_codes([*selection.select, *selection.ignore, *selection.levels])
    if bad:
        raise UsageError(f"unknown rule code {bad[0]!r} (see `itera-verify rules`)")
    fields: dict[str, Any] = {
        "device": config.device or DEFAULT_DEVICE, "timeout": config.timeout or DEFAULT_TIMEOUT,
        "tmp_patterns": config.tmp_patterns, "tariffs": config.tariffs,
        "reload": not reviewer,  # verify reloads unless told not to; an audit only when asked (--reload)
        **given,
    }
    fields["hf_cache"] = resolve_hf_cache(fields.get("hf_cache"), environment)
    for name in ("tmp_patterns", "sign"):
        if name in fields:
            fields[name] = (fields[name],) if isinstance(fields[name], str) else tuple(fields[name])
    fields.setdefault("results_key", environment.results_key)
    for name in ("allowed_signers", "oms_public_key", "results_key"):
        if fields.get(name) is not None:
            fields[name] = Path(fields[name])
    _validate(fields)
    return make_options(environment=environment, selection=selection,
                        configuration={**describe(config), "environment": environment.applied(),
                                       "torch": {"version": environment.torch_version,
                                                 "advisory": environment.torch_advisory}}, **fields)


def _validate(fields: dict[str, Any]) -> None:
    """What the command line's own types check, for the API too: one line naming the option."""
    if fields["device"] not in DEVICES:
        raise UsageError(f"device {fields['device']!r}: choose one of {', '.join(DEVICES)}")
    if fields.get("confine", "auto") not in CONFINEMENTS:
        raise UsageError(f"confine {fields['confine']!r}: choose one of {', '.join(CONFINEMENTS)}")
    if fields.get("isolation", "auto") not in ISOLATIONS:
        raise UsageError(f"isolation {fields['isolation']!r}: choose one of {', '.join(ISOLATIONS)}")
    timeout = fields["timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise UsageError(f"timeout {timeout!r}: a positive number of seconds")
    fields["timeout"] = float(timeout)
    for name, low, high in (("jobs", 1, None), ("level", 1, 19), ("threads", 0, None), ("max_size", 1, None),
                            ("scan_budget", 0, None), ("batch_jobs", 1, 1024)):
        value = fields.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            span = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise UsageError(f"{name} {value!r}: a whole number {span}")
    if not isinstance(fields.get("part", False), bool):
        raise UsageError(f"part {fields['part']!r}: True (one lot's part of a campaign) or False")
    if fields.get("engine", "local") not in ENGINES:
        raise UsageError(f"engine {fields['engine']!r}: choose one of {', '.join(ENGINES)}")
    if fields.get("shard") is not None:
        fields["shard"] = _shard(fields["shard"])
    if fields.get("results") is not None:
        fields["results"] = _results(fields["results"])
    if fields.get("sign") and fields.get("seal") is False:
        raise UsageError("--sign signs the seal: it cannot be used with --no-seal")


def _shard(value: Any) -> tuple[int, int]:
    """--shard I/N (or the pair): the I-th of N slices, counted from 0 as a Slurm array, a Kubernetes Indexed
    Job and a GitHub Actions matrix count."""
    text = value if isinstance(value, str) else "/".join(map(str, value)) if isinstance(value, (tuple, list)) \
        else repr(value)
    index, sep, count = text.strip().partition("/")
    if not sep or not index.isdigit() or not count.isdigit() or not 0 <= int(index) < int(count):
        raise UsageError(f"--shard {text}: I/N with 0 <= I < N, e.g. --shard 0/4 "
                         "(Slurm: --array=0-3 and --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
    return int(index), int(count)


def _results(value: Any) -> str:
    """--results DIR/ or s3://bucket/prefix/: where each archive's report is kept for a rerun."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else ""
    if not text or "\n" in text:
        raise UsageError(f"--results {value!r}: a folder or an s3://bucket/prefix/")
    if text.startswith("s3://"):
        return text if text.endswith("/") else text + "/"
    return text
