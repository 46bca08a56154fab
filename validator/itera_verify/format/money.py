"""The campaign's money, as docs/format.md reads it: exact decimals, rounded to the cent half up.

The recorder writes `rental_total_usd` and `decision.cost_per_accepted_usd` with these functions and the budget
rules (IV601, IV604) and the report's summary check them with the same ones: a package the recorder writes can
never disagree with its own checker by a rounding rule (a float's half-to-even against a Decimal's half-up once
did: 10.25 USD over 2 runs was written 5.12 and checked as 5.13).
"""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from .values import is_number, listed

CENT = Decimal("0.01")
MAX_USD = 10_000_000  # a rental campaign's money: lot prices, totals, expenses, cost per run


def usd(value: Any) -> Decimal | None:
    """A money amount as an exact decimal (47.14 stays 47.14), or None when it is not a finite number."""
    if not is_number(value) or abs(value) > MAX_USD:
        return None  # beyond any rental budget (IV105 says so): nothing to compute on
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def to_cent(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_HALF_UP)


def money(amount: Decimal | None) -> float | None:
    """An amount as the JSON number written to the manifest or the report: to the cent."""
    return None if amount is None else float(to_cent(amount))


def fmt_usd(amount: Decimal | float | None) -> str:
    return "?" if amount is None else f"{to_cent(Decimal(str(amount))):.2f} USD"


def lots(plan: dict) -> list[tuple[int, dict]]:
    return [(index, lot) for index, lot in enumerate(listed(plan, "lots")) if isinstance(lot, dict)]


def rental_usd(plan: dict) -> Decimal | None:
    """The sum of the lots' prices (a lot's price covers all its GPUs); None when there is no lot or a price
    cannot be read."""
    prices = [usd(lot.get("price_usd")) for _, lot in lots(plan)]
    if not prices or any(p is None for p in prices):
        return None
    return sum(prices, Decimal(0))


def other_expenses(plan: dict, included: bool) -> list[tuple[str, Decimal]]:
    out = []
    for expense in listed(plan, "other_expenses"):
        if isinstance(expense, dict) and expense.get("included") is included and usd(expense.get("usd")) is not None:
            label = expense.get("label") if isinstance(expense.get("label"), str) else "other expense"
            out.append((label, usd(expense.get("usd"))))
    return out


def total_usd(plan: dict) -> Decimal | None:
    """Rental + included other expenses. Falls back on the stated rental total when the lots cannot be read."""
    rental = rental_usd(plan)
    if rental is None:
        rental = usd(plan.get("rental_total_usd"))
    if rental is None:
        return None
    return rental + sum((amount for _, amount in other_expenses(plan, True)), Decimal(0))


def cost_per_accepted(total: Decimal | None, accepted: int) -> Decimal | None:
    """total / accepted runs, to the cent (half up); None at zero accepted runs: the ratio is undefined."""
    if total is None or accepted <= 0:
        return None
    return to_cent(total / accepted)
