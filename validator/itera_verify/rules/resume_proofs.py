"""IV413, IV414: the resume proven during the campaign (docs/record.md, `runs[].checkpoints[].proof`).

The guide: test an early backup, then its reload in a new process, before the rental's hours are spent on runs
whose checkpoints cannot resume. The final reload proves every kept checkpoint, but only when the campaign is
over; these rules read what was proven while it ran."""
from __future__ import annotations

from typing import Iterator

from ..model import Finding, Rule, Severity
from ..package import MANIFEST, RunContext, pointer_of
from ..package.campaign import accepted_declared, indexed_runs, listed

RULES = [
    Rule("IV413", Severity.WARNING, "checkpoints saved but no resume proven during the campaign",
         explain="A run that saves checkpoints counts on resuming from them. The guide asks to test an early "
                 "checkpoint's reload in a new process while the campaign runs, not at its end: a broken save "
                 "setup found at the last hour has already cost the rental. The recorder's callbacks prove the "
                 "first checkpoint of each run in the background (`prove_resume=\"first\"`), and a hand-written "
                 "loop calls `run.prove_resume(artifact_id)`; the result is `runs[].checkpoints[].proof`. A proof "
                 "that could not run (its process killed, no result) proves nothing either. Said of runs whose "
                 "saves were recorded (`runs[].checkpoints`): a package written by hand without them is not "
                 "judged here (the final reload still proves its checkpoints).",
         bad='{"id": "control", "checkpoints": [{"artifact": "control-checkpoint-200", "step": 200}]}',
         good='{"id": "control", "checkpoints": [{"artifact": "control-checkpoint-200", "step": 200, '
              '"proof": {"ok": true, "codes": [], ...}}]}'),
    Rule("IV414", Severity.ERROR, "a failed resume proof, and the run accepted anyway",
         explain="A resume proof recorded during the campaign found the checkpoint unusable (its codes say why: "
                 "a truncated optimizer.pt, a missing scheduler, an optimizer that does not fit the model). The "
                 "run went on, and was accepted, without a newer proof that passed: its later checkpoints were "
                 "saved by the same broken setup, so nothing shows the run could have resumed. Declare a "
                 "`no_usable_resume` stop rule (the recorder then stops the run at its next step), or fix the "
                 "save and prove a later checkpoint (`run.prove_resume`).",
         bad='"checkpoints": [{"artifact": "ckpt-200", "proof": {"ok": false, "codes": ["IV504"]}}]  (accepted)',
         good='"checkpoints": [..., {"artifact": "ckpt-400", "proof": {"ok": true, "codes": []}}]'),
]


def checkpoints_of(run: dict) -> list[tuple[int, dict]]:
    """(index, entry) of each checkpoint record of a run that is an object."""
    return [(i, c) for i, c in enumerate(listed(run, "checkpoints")) if isinstance(c, dict)]


def proof_of(entry: dict) -> dict | None:
    proof = entry.get("proof")
    return proof if isinstance(proof, dict) else None


def failed(proof: dict | None) -> bool:
    """A proof that judged the checkpoint unusable (ok false with the codes of its findings)."""
    return proof is not None and proof.get("ok") is False and bool(proof.get("codes"))


def conclusive(proof: dict | None) -> bool:
    return proof is not None and (proof.get("ok") is True or failed(proof))


def _order(item: tuple[int, dict]) -> tuple:
    index, entry = item
    step = entry.get("step")
    return (step if isinstance(step, int) and not isinstance(step, bool) else -1, index)


def check(ctx: RunContext) -> Iterator[Finding]:
    if not ctx.documents.manifest:
        return
    accepted = set(accepted_declared(ctx))
    for index, run, run_id in indexed_runs(ctx):
        checkpoints = sorted(checkpoints_of(run), key=_order)
        proven = [(i, c) for i, c in checkpoints if conclusive(proof_of(c))]
        if checkpoints and not proven and run.get("status") != "stopped":
            unproven = [proof_of(c) for _, c in checkpoints if proof_of(c) is not None]
            why = (f": the proof of {checkpoints[-1][1].get('artifact')} did not conclude "
                   f"({unproven[-1].get('error') or 'no result'})" if unproven else "")
            yield Finding("IV413", MANIFEST, pointer=pointer_of(["runs", index]), run=run_id,
                          message=f"run {run_id or index} saved checkpoints but no resume proof was recorded "
                                  f"during the campaign{why}; prove an early checkpoint's reload while the "
                                  "campaign runs (RecordCallback(prove_resume='first'), run.prove_resume)")
        if run_id not in accepted or not proven:
            continue
        last_failure = max((item for item in proven if failed(proof_of(item[1]))), key=_order, default=None)
        if last_failure is None or any(_order(item) > _order(last_failure) and proof_of(item[1]).get("ok") is True
                                       for item in proven):
            continue
        position, entry = last_failure
        proof = proof_of(entry)
        codes = ", ".join(str(c) for c in listed(proof, "codes"))
        yield Finding("IV414", MANIFEST, pointer=pointer_of(["runs", index, "checkpoints", position, "proof"]),
                      run=run_id, artifact=entry.get("artifact") if isinstance(entry.get("artifact"), str) else None,
                      message=f"run {run_id}: the resume proof of {entry.get('artifact')} (step {entry.get('step')}) "
                              f"failed ({codes}{': ' + proof['error'] if isinstance(proof.get('error'), str) else ''})"
                              ", yet the run went on and is accepted without a newer proof that passed: remove it "
                              "from decision.accepted, or prove a later checkpoint")
