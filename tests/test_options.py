"""One frozen, typed options object and a run context nothing writes after it is built (docs/architecture.md):
settle() makes the options, the workflows and the rules only read them, and a later phase gets a new context."""
from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import itera_verify
from itera_verify import RunOptions, Selection, settle
from itera_verify.flows.config import Config
from itera_verify.model import ReloadResult, UsageError
from itera_verify.package import RunContext, discover
from itera_verify.runtime.environment import Environment

SOURCE = Path(__file__).resolve().parents[1] / "validator" / "itera_verify"


def test_verify_and_audit_show_their_typed_options():
    for function in (itera_verify.verify, itera_verify.audit):
        parameters = inspect.signature(function).parameters
        assert list(parameters)[1:] == ["options", "progress"]
        assert parameters["options"].annotation == "RunOptions | None"
        assert parameters["progress"].kind is inspect.Parameter.KEYWORD_ONLY
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    fields = {f.name: f.type for f in dataclasses.fields(RunOptions) if not f.name.startswith("_")}
    assert fields["timeout"] == "float" and fields["selection"] == "Selection" and fields["hf_cache"] == "Path | None"


def test_settle_is_the_only_constructor_and_what_it_makes_is_frozen():
    options = settle(Config(), reload=False, timeout=30)
    assert (options.reload, options.timeout, options.device) == (False, 30.0, "auto")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.timeout = 5  # type: ignore[misc]
    with pytest.raises(TypeError, match="settle"):
        RunOptions(environment=Environment.read())
    with pytest.raises(TypeError, match="unknown option 'relaod'"):
        settle(Config(), relaod=False)
    with pytest.raises(TypeError):
        options.configuration["applied"] = "elsewhere"  # type: ignore[index]


@pytest.mark.parametrize("override, named", [({"device": "tpu"}, "device"), ({"timeout": float("nan")}, "timeout"),
                                             ({"jobs": 0}, "jobs"), ({"level": 20}, "level"),
                                             ({"isolation": "thread"}, "isolation"),
                                             ({"sign": ("ssh:k.pub",), "seal": False}, "--sign")])
def test_a_value_out_of_range_is_a_usage_error_naming_it(override, named):
    with pytest.raises(UsageError, match=named):
        settle(Config(), **override)


def test_an_audit_reloads_only_when_asked_and_verify_unless_told_not_to():
    assert settle(Config()).reload is True
    assert settle(Config(), reviewer=True).reload is False
    assert settle(Config(), reviewer=True, reload=True).reload is True


def test_the_configuration_file_sits_under_the_explicit_values(tmp_path):
    from itera_verify.flows.config import parse_config

    config = parse_config({"device": "cpu", "timeout": 12, "ignore": ["IV6"], "tmp-patterns": ["/scratch"]})
    options = settle(config, timeout=40)
    assert (options.device, options.timeout, options.tmp_patterns) == ("cpu", 40.0, ("/scratch",))
    assert options.selection.ignore == ("IV6",)
    assert settle(config, selection=Selection(select=("IV2",))).selection.ignore == ()


def test_the_run_context_is_frozen_and_a_later_phase_gets_a_new_one(tmp_path):
    (tmp_path / "manifest.json").write_text('{"campaign_id": "c"}')
    ctx = RunContext(discover(tmp_path), settle(Config()))
    assert dataclasses.is_dataclass(ctx) and type(ctx).__dataclass_params__.frozen
    assert [f.name for f in dataclasses.fields(RunContext)] == ["inventory", "options", "documents", "reloads"]
    for name in ("reloads", "options", "documents", "inventory"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(ctx, name, None)
    assert ctx.documents.manifest == {"campaign_id": "c"}
    later = dataclasses.replace(ctx, reloads=[ReloadResult("a", "safetensors", ok=True)])
    assert later.documents is ctx.documents and ctx.reloads is None and later.reloads[0].artifact == "a"
    assert later.environment is ctx.options.environment


def test_a_missing_hand_off_is_a_type_error_never_a_second_reading(tmp_path):
    with pytest.raises(TypeError):
        RunContext(discover(tmp_path))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        RunContext(discover(tmp_path), {"device": "cpu"})  # type: ignore[arg-type]
    from itera_verify.runtime.hfcache import resolve_hf_cache
    from itera_verify.runtime.launcher import Launcher

    with pytest.raises(TypeError):
        resolve_hf_cache(None)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Launcher()  # type: ignore[call-arg]


# The entry points that read the process's environment, each once: the command line, settle() (the API's), the
# recorder's hub cache lookup (open_campaign's own entry) and a reload child's own start.
# The entry points: the command line (a batch's too), settle(), the recorder (its hub cache lookup, and the resume
# proof it starts from the training process, handed that process's variables filtered by `for_tool`), and a Ray
# task of a batch (an entry point on the worker's machine: it audits with that machine's environment).
READS_ENVIRONMENT = {"cli/__init__.py", "cli/batch.py", "flows/config.py", "record/hub.py", "record/proofs.py",
                     "flows/batch_ray.py"}


def _reads_environment(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "read" and isinstance(node.value, ast.Name) \
                and node.value.id == "Environment":
            return True
    return False


def test_the_environment_is_read_at_the_entry_points_only():
    readers = {path.relative_to(SOURCE).as_posix() for path in SOURCE.rglob("*.py")
               if _reads_environment(ast.parse(path.read_text(encoding="utf-8")))}
    assert readers <= READS_ENVIRONMENT, readers - READS_ENVIRONMENT


def test_no_rule_reads_a_setting_the_options_do_not_type():
    """`ctx.settings` is gone: a rule reads ctx.options' typed fields (or nothing at all)."""
    for path in (SOURCE / "rules").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "ctx.settings" not in source and "hasattr(ctx" not in source, path.name


def test_the_registry_finds_rules_and_the_runner_schedules_them():
    registry = ast.parse((SOURCE / "rules" / "__init__.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(registry) if isinstance(node, ast.ImportFrom) and node.module}
    assert not any("launcher" in name or "runtime" in name for name in imported), imported
    from itera_verify.flows import checks

    assert callable(checks.run_checks) and callable(checks.StartedChecks)


def test_the_recorders_helpers_never_import_the_run():
    """record/run.py imports its helpers; a helper takes a run through record/handle.py's protocol, never
    run.py, and no module reaches another's private names."""
    for path in (SOURCE / "record").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path.name not in ("campaign.py", "__init__.py"):  # the campaign makes runs; __init__ exports both
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 1:
                    assert node.module not in ("run", "campaign"), f"{path.name} imports .{node.module}"
        privates = [] if path.name == "run.py" else [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id == "run"]
        assert not privates, f"{path.name} reaches {privates}"  # run.py's own class may use its own
