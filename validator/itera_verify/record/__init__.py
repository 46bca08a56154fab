"""Record an `itera-output/1` package while the campaign runs (docs/record.md).

    campaign = open_campaign("outdir", "my-campaign", question, "corpus", "v1", eval_ids)
    campaign.declare_plan(lots=[...], reserved_hours=48)
    campaign.declare_stop_rules([...])
    run = campaign.start_run("control", "control", params={"seed": 0, ...})

Pure Python: importing this imports neither torch, transformers nor lightning (itera_verify.integrations holds
the callbacks that do)."""
from __future__ import annotations

from .campaign import Campaign, cost_per_accepted, open_campaign
from .errors import RecordError
from .hub import resolve_commit
from .run import PredictionStream, Run
from .stoprules import Violation

__all__ = ["Campaign", "PredictionStream", "RecordError", "Run", "Violation", "cost_per_accepted",
           "open_campaign", "resolve_commit"]
