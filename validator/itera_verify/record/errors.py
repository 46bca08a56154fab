"""The one exception the recorder raises for a user mistake; its message says what to do instead."""
from __future__ import annotations


class RecordError(ValueError):
    """A refused recording step (a changed configuration under an old run id, a plan rewritten after the
    first run started, a prediction for an id outside the frozen corpus, ...)."""
