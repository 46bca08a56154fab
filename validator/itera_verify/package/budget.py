"""The campaign's hours and the rental catalog, as docs/format.md reads them: the lots' window, catalog prices,
the configuration's tariffs. Shared by the budget rules (rules/budget.py) and the report's budget summary
(report/summary.py); the money arithmetic itself is format/money.py, which the recorder writes with.
"""
from __future__ import annotations

import json
from decimal import Decimal
from functools import lru_cache
from typing import Mapping
from importlib import resources

from ..format.money import lots, usd
from ..format.values import is_number
from .campaign import shown


@lru_cache(maxsize=1)
def shipped_tariffs() -> dict:
    text = resources.files("itera_verify").joinpath("data/tariffs.json").read_text(encoding="utf-8")
    return {gpu: prices for gpu, prices in json.loads(text).items() if not gpu.startswith("_")}


def tariffs(ctx) -> dict[str, dict[str, float]]:
    """The shipped catalog with the configuration's `tariffs` table merged over it, per GPU and lot length."""
    merged = {gpu: dict(prices) for gpu, prices in shipped_tariffs().items()}
    override = ctx.options.tariffs
    for gpu, prices in (override.items() if override is not None else ()):
        if isinstance(gpu, str) and isinstance(prices, Mapping):
            merged.setdefault(gpu, {}).update({str(days): price for days, price in prices.items()})
    return merged


def lot_name(lot: dict) -> str:
    """The catalog key of a lot: "RTX 4090" for one GPU, "2x RTX 4090" for two (a lot is priced whole)."""
    gpus = lot.get("gpus", 1)
    gpu = lot.get("gpu") if isinstance(lot.get("gpu"), str) else "?"
    return gpu if gpus == 1 else f"{shown(gpus)}x {gpu}"


def _days_key(days) -> str:
    return str(int(days)) if is_number(days) and float(days).is_integer() else shown(days)


def catalog_price(catalog: dict, lot: dict) -> Decimal | None:
    prices = catalog.get(lot_name(lot))
    return usd(prices.get(_days_key(lot.get("days")))) if isinstance(prices, dict) else None


def longer_lot(catalog: dict, lot: dict, hours: float) -> tuple[float, Decimal] | None:
    """The shortest catalog lot of the same GPUs whose window covers `hours`."""
    prices = catalog.get(lot_name(lot))
    options = []
    for days, price in (prices.items() if isinstance(prices, dict) else ()):
        try:
            length = float(days)
        except ValueError:
            continue
        if length * 24 >= hours and usd(price) is not None:
            options.append((length, usd(price)))
    return min(options, key=lambda o: o[0]) if options else None










def lots_window_hours(plan: dict) -> tuple[float, dict] | None:
    """(hours, the longest lot): lots bought together run side by side."""
    timed = [lot for _, lot in lots(plan) if is_number(lot.get("days")) and lot["days"] > 0]
    if not timed:
        return None
    longest = max(timed, key=lambda lot: lot["days"])
    return longest["days"] * 24, longest
