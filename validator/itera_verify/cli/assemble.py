"""`itera-verify assemble PART... -o DIR`: one campaign from the parts its lots sealed (flows/assemble.py)."""
from __future__ import annotations

from pathlib import Path

import click

from ..flows.config import load_config, settle
from ..report import FORMATS, renderer
from ..report.words import clean, plain_lines
from . import _make_progress, _run, main


@main.command("assemble")
@click.argument("parts", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(),
              help="Write the campaign to DIR/<campaign_id>/ (DIR is created if its parent exists).")
@click.option("--allowed-signers", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Require every part signed by one of these keys (OpenSSH allowed_signers format).")
@click.option("--signer", default=None, metavar="IDENTITY",
              help="Require this principal of --allowed-signers (as ssh-keygen -Y verify -I).")
@click.option("--endpoint-url", default=None,
              help="For s3:// parts: an S3-compatible store's endpoint (default: the AWS environment).")
@click.option("--max-size", type=click.IntRange(min=1), default=None,
              help="Refuse a part that expands beyond this many bytes (default: 20 × its size, at least 1 GiB).")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="The reviewer's configuration (as for audit).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text",
              help="Output format on stdout (default text).")
@click.option("-q", "--quiet", is_flag=True, help="Only the verdict and the refusals.")
def assemble_command(parts, output, allowed_signers, signer, endpoint_url, max_size, config_path, fmt, quiet):
    """Join the lots' PARTs (archives, folders holding *.part.tar.zst, s3:// keys or prefixes) into one
    campaign, DIR/<campaign_id>/; each part is audited as hostile input first. Exit 0 assembled, 1 refused
    (nothing written under DIR), 2 could not run."""
    from ..flows.assemble import assemble

    def action() -> int:
        config = load_config(explicit=config_path, reviewer=True)  # settle() reads the environment, once
        options = settle(config, reviewer=True, endpoint_url=endpoint_url, max_size=max_size,
                         allowed_signers=allowed_signers, signer=signer)
        with _make_progress(quiet or fmt != "text", False) as progress:
            assembly = assemble(list(parts), output, options, progress=progress)
        if fmt == "text":
            click.echo(plain_lines(text_lines(assembly, quiet)), nl=False)
        else:  # the shared renderers, over the report of mode `assemble`
            click.echo(renderer(fmt)(assembly.report(), {"quiet": quiet}), nl=False)
        return 0 if assembly.verdict == "pass" else 1

    _run(action)


def text_lines(assembly, quiet: bool) -> str:
    """The parts, each refusal with its code, and one verdict line."""
    lines = []
    for part in assembly.parts:
        if not quiet:
            lines.append(f"part {clean(part.name)}: lot {clean(part.lot) or '?'}, audit {part.verdict}, sha256 "
                         f"{clean(part.sha256)}, signer {clean(part.signer) or 'none (unsigned)'}")
        for finding in part.findings:
            where = f" {clean(finding.path)}" if finding.path else ""
            lines.append(f"  {finding.code}{where}: {clean(finding.message)}")
    for finding in assembly.findings:
        where = f" {clean(finding.path)}" if finding.path else ""
        lines.append(f"{finding.code}{where}: {clean(finding.message)}")
    if assembly.lots_without_part and not quiet:
        lines.append(f"no part for lot {', '.join(clean(lot) for lot in assembly.lots_without_part)} (its price is "
                     "still in the budget)")
    if assembly.verdict == "pass":
        lines.append(f"ASSEMBLED: {clean(str(assembly.package))} from {len(assembly.parts)} parts; next: "
                     f"open_campaign(\"{clean(str(assembly.package))}\", ...).close(...), then itera-verify "
                     f"{clean(str(assembly.package))}")
    else:
        lines.append(f"REFUSED: nothing written under {clean(str(assembly.output))}")
    return "\n".join(lines) + "\n"
