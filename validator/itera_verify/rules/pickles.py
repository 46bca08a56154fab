"""IV506: every pickle in the package is scanned statically against the allowlist, used by an artifact or not."""
from __future__ import annotations

from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import RunContext
from ..package.pickles import ScanResult, scan_package

# Relative CPU time on a package of many files; run_checks balances its processes by it.
COST = 15  # reads the head of every file to find pickles

RULES = [
    Rule("IV506", Severity.ERROR, "pickle refers to a global outside the allowlist",
         explain=(
             "A pickle is a program: unpickling it imports and calls whatever globals it names. Every file of the "
             "package that is a pickle or a zip-format torch file (by extension: .pt .pth .bin .ckpt .pkl "
             ".pickle, or by content: pickle opcodes, a zip, a numpy object array, gzip/bz2/xz/zstd data) is "
             "scanned without being loaded, every stream of it and every member of an archive. Only torch's "
             "tensor and storage rebuilds, dtypes, torch.Size, torch.device, torch.nn.Parameter, "
             "collections.OrderedDict, _codecs.encode and the numpy globals of RNG states are allowed (a "
             "Trainer's training_args.bin may also name the transformers and accelerate classes "
             "TrainingArguments holds, each by its exact name: it is scanned, never loaded). Multi-GPU outputs "
             "add plain data records, by exact name: DeepSpeed's LossScaler, DynamicLossScaler, ZeroStageEnum and "
             "fragment_address, and the torch.distributed.checkpoint metadata records with pathlib.PosixPath "
             "(each archive inside a .distcp file is scanned). A file naming "
             "anything else is never loaded, even if no artifact uses it: a delivered package must not carry a payload "
             "for its reviewer. So is a pickle that cannot be scanned whole, exactly as its loaders would read "
             "it: a zip whose layout two readers could read differently, bytes after the last pickle stream "
             "that are not torch's storage records, a damaged or truncated file, a 7z archive (no reader here opens "
             "one, so what it holds is never judged harmless). Save weights as safetensors "
             "and optimizer/RNG state with torch.save of tensors and plain containers."),
         bad="torch.save({'weight': w, 'hook': MyCallback()}, 'optimizer.pt')   # names __main__.MyCallback",
         good="torch.save(optimizer.state_dict(), 'optimizer.pt')   # tensors, numbers and dicts only"),
]

def _owner(ctx: RunContext, rel: str) -> tuple[str | None, str | None]:
    """(run, artifact) when the file lies inside an artifact's path."""
    for artifact in ctx.documents.artifacts():
        path = ctx.inventory.normalise_ref(artifact.get("path")) if isinstance(artifact.get("path"), str) else None
        if path and (rel == path or rel.startswith(path.rstrip("/") + "/")):
            run = artifact.get("run") if isinstance(artifact.get("run"), str) else None
            art = artifact.get("id") if isinstance(artifact.get("id"), str) else None
            return run, art
    return None, None


def seal_findings(top: str | None, scans: dict[str, ScanResult]) -> list[Finding]:
    """IV506 for every pickle the audit found in a SEAL/ member (flows/audit.py scans each one, the statement
    pair and model.sig included): the same allowlist as for the package's files; these are never loaded."""
    findings = []
    for rel, result in sorted(scans.items()):
        if result.unsafe or (result.is_pickle and result.error):
            findings.append(Finding("IV506", f"{top}/{rel}", severity=Severity.ERROR,
                                    message=f"a pickle in the seal's {rel}, which {result.refusal()}; never loaded"))
    return findings


def check(ctx: RunContext) -> Iterator[Finding]:
    for rel, result in scan_package(ctx).items():
        if not result.unsafe:
            if result.is_pickle and result.error:
                run, artifact = _owner(ctx, rel)
                yield Finding("IV506", rel, run=run, artifact=artifact,
                              message=f"pickle cannot be scanned ({result.error}); the file is never loaded")
            continue
        run, artifact = _owner(ctx, rel)
        shown = ", ".join(result.unsafe[:8]) + (f" and {len(result.unsafe) - 8} more" if len(result.unsafe) > 8 else "")
        yield Finding("IV506", rel, run=run, artifact=artifact,
                      message=f"pickle names {len(result.unsafe)} global(s) outside the allowlist: {shown}; "
                              "the file is never loaded")
