"""Inline SVG drawn in Python for the HTML report: one chart per metric with the control and every variant
overlaid (their stop points and saved checkpoints marked on the line), and the plan bar.

Large curves are downsampled here too (min and max per bucket, so spikes survive) and say so in their caption;
non-finite points are never dropped silently: each is a red × at its step.
"""
from __future__ import annotations

import html
import math
from typing import Any

from .text_format import clean, hours, plural

MAX_DRAWN_POINTS = 1200
MAX_NONFINITE_MARKS = 400
HEIGHT = 190
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 16, 28
BAD_COLOR = "#cf222e"


def _esc(value: Any) -> str:
    return html.escape(clean(value), quote=True)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _points(curve: Any) -> list[tuple[float, float | None]]:
    """(step, value) pairs; value None when non-finite. Records that are not [step, value] are skipped."""
    raw = curve.get("points") if isinstance(curve, dict) else curve
    points = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, (list, tuple)) and len(item) >= 2 and _finite(item[0]) is not None:
            points.append((float(item[0]), _finite(item[1])))
    return sorted(points, key=lambda p: p[0])


def downsample(points: list[tuple[float, float | None]], limit: int = MAX_DRAWN_POINTS):
    """At most about `limit` points: per bucket the first point, its min, its max and one non-finite point."""
    if len(points) <= limit:
        return points
    bucket = math.ceil(len(points) / (limit // 3))
    kept = []
    for start in range(0, len(points), bucket):
        chunk = points[start:start + bucket]
        finite = [p for p in chunk if p[1] is not None]
        chosen = {chunk[0]}
        if finite:
            chosen |= {min(finite, key=lambda p: p[1]), max(finite, key=lambda p: p[1])}
        missing = next((p for p in chunk if p[1] is None), None)
        if missing:
            chosen.add(missing)
        kept.extend(sorted(chosen, key=lambda p: p[0]))
    if kept[-1] != points[-1]:
        kept.append(points[-1])  # the last step is what the runs table reports: always draw it
    return kept


def _step(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else _tick(value)


def _tick(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2e}"
    return f"{value:.4g}"


def _segments(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """Runs of finite points: a non-finite value breaks the line instead of being bridged."""
    segments: list[list[tuple[float, float]]] = [[]]
    for step, value in points:
        if value is None:
            segments.append([])
        else:
            segments[-1].append((step, value))
    return [s for s in segments if s]


PALETTE = ("#1f2328", "#0969da", "#bf8700", "#8250df", "#1a7f37", "#bc4c00", "#0550ae", "#953800", "#6e7781")
WIDE = 720


def comparison_chart(metric: str, series: list[dict]) -> str:
    """One metric of every run on one scale: the control first (dark), each variant in its colour; a run's stop
    is a dashed line at its step, each saved checkpoint a triangle on the step axis (red when its resume proof
    failed). `series`: [{run, role, curve, stop: {step, rule} | None, saves: [{step, failed}]}]."""
    drawn = []
    for index, item in enumerate(series):
        points = _points(item.get("curve"))
        curve = item.get("curve") if isinstance(item.get("curve"), dict) else {}
        total = curve.get("total_points") if isinstance(curve.get("total_points"), int) else len(points)
        nonfinite = {p[0] for p in points if p[1] is None}
        nonfinite |= {float(s) for s in curve.get("nonfinite_steps") or [] if _finite(s) is not None}
        kept = downsample(points)
        drawn.append({**item, "points": kept, "nonfinite": sorted(nonfinite), "total": max(total, len(points)),
                      "color": PALETTE[index % len(PALETTE)],
                      "downsampled": len(kept) < max(total, len(points)) or bool(curve.get("downsampled"))})
    legend = []
    for item in drawn:
        words = [f'<span style="color:{item["color"]}">■</span> <b>{_esc(item.get("run"))}</b>'
                 f' <span class="muted">({_esc(item.get("role") or "?")})</span>']
        words.append(f"downsampled from {item['total']:,} points ({len(item['points']):,} drawn)"
                     if item["downsampled"] else plural(item["total"], "point"))
        if item["nonfinite"]:
            words.append(f'<span style="color:{BAD_COLOR}">× {plural(len(item["nonfinite"]), "non-finite value")}'
                         "</span>")
        stop = item.get("stop") if isinstance(item.get("stop"), dict) else None
        if stop and _finite(stop.get("step")) is not None:
            words.append(f"stopped at step {_step(float(stop['step']))} ({_esc(stop.get('rule'))})")
        saves = [s for s in item.get("saves") or [] if _finite(s.get("step")) is not None]
        if saves:
            words.append(plural(len(saves), "checkpoint"))
        legend.append(" · ".join(words))
    label = f"{clean(metric)}: the control and its variants"
    return (f'<figure class="wide"><svg viewBox="0 0 {WIDE} {HEIGHT + 40}" width="100%" role="img" '
            f'aria-label="{_esc(label)}">{_overlay(drawn)}</svg>'
            f'<figcaption><b>{_esc(metric)}</b><br>{"<br>".join(legend)}</figcaption></figure>')


def _overlay(drawn: list[dict]) -> str:
    width, height = WIDE, HEIGHT + 40
    steps = [p[0] for d in drawn for p in d["points"]] + [s for d in drawn for s in d["nonfinite"]]
    steps += [float(s["step"]) for d in drawn for s in d.get("saves") or [] if _finite(s.get("step")) is not None]
    values = [p[1] for d in drawn for p in d["points"] if p[1] is not None]
    if not steps:
        return f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#59636e">no data</text>'
    x_min, x_max = min(steps), max(steps)
    y_min, y_max = (min(values), max(values)) if values else (0.0, 1.0)
    if y_min == y_max:
        y_min, y_max = y_min - (abs(y_min) * 0.1 or 1), y_max + (abs(y_max) * 0.1 or 1)
    pad = (y_max - y_min) * 0.06
    y_min, y_max = y_min - pad, y_max + pad
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM - 10

    def x(step: float) -> float:
        return LEFT + (plot_w * (step - x_min) / (x_max - x_min) if x_max > x_min else plot_w / 2)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - (value - y_min) / (y_max - y_min))

    parts = [f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#d1d9e0"/>']
    for fraction in (0, 0.5, 1):
        value = y_min + (y_max - y_min) * fraction
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                     f'stroke="#eef1f4"/><text x="{LEFT - 4}" y="{y(value) + 4:.1f}" font-size="10" '
                     f'text-anchor="end" fill="#59636e">{_tick(value)}</text>')
    for step, anchor in (((x_min, "start"), (x_max, "end")) if x_max > x_min else ((x_min, "middle"),)):
        parts.append(f'<text x="{x(step):.1f}" y="{height - 8}" font-size="10" text-anchor="{anchor}" '
                     f'fill="#59636e">step {_step(step)}</text>')
    axis = TOP + plot_h
    for item in drawn:
        color, run = item["color"], clean(item.get("run"))
        for segment in _segments(item["points"]):
            if len(segment) == 1:
                parts.append(f'<circle cx="{x(segment[0][0]):.1f}" cy="{y(segment[0][1]):.1f}" r="2.5" '
                             f'fill="{color}"/>')
            else:
                coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in segment)
                parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.6" '
                             f'stroke-linejoin="round"><title>{_esc(run)}</title></polyline>')
        for step in item["nonfinite"][:MAX_NONFINITE_MARKS]:
            cx, cy = x(step), TOP + 7
            parts.append(f'<g stroke="{BAD_COLOR}" stroke-width="2"><title>{_esc(run)}: step {_step(step)}: '
                         f'non-finite</title><line x1="{cx - 4:.1f}" y1="{cy - 4}" x2="{cx + 4:.1f}" y2="{cy + 4}"/>'
                         f'<line x1="{cx - 4:.1f}" y1="{cy + 4}" x2="{cx + 4:.1f}" y2="{cy - 4}"/></g>')
        stop = item.get("stop") if isinstance(item.get("stop"), dict) else None
        if stop and _finite(stop.get("step")) is not None:
            sx = x(float(stop["step"]))
            parts.append(f'<line x1="{sx:.1f}" x2="{sx:.1f}" y1="{TOP}" y2="{axis}" stroke="{color}" '
                         f'stroke-dasharray="4 3" stroke-width="1.4"><title>{_esc(run)} stopped at step '
                         f'{_step(float(stop["step"]))} by {_esc(stop.get("rule"))}</title></line>')
        for save in item.get("saves") or []:
            if _finite(save.get("step")) is None:
                continue
            sx, fill = x(float(save["step"])), BAD_COLOR if save.get("failed") else color
            what = "its resume proof failed" if save.get("failed") else "checkpoint saved"
            parts.append(f'<path d="M{sx:.1f},{axis - 7} l-4,7 l8,0 z" fill="{fill}"><title>{_esc(run)}: '
                         f'{what} at step {_step(float(save["step"]))}</title></path>')
    return "".join(parts)


def plan_bar(plan: dict) -> str:
    """The windows, reserved and observed hours as bars on one scale; any part beyond its limit in red
    (reserved against the plan's window, IV606; observed against the lots' window, IV603)."""
    window, lots_window, reserved, observed = (_finite(plan.get(k)) for k in (
        "window_hours", "lots_window_hours", "reserved_hours", "observed_hours"))
    rows = [("Lots' window", lots_window, "#8c959f", None)] if lots_window not in (None, window) else []
    rows += [("Plan window", window, "#afb8c1", lots_window), ("Reserved", reserved, "#0969da", window),
             ("Observed", observed, "#1a7f37", lots_window if lots_window is not None else window)]
    known = [v for _, v, _, _ in rows if v is not None and v >= 0]
    if not known or max(known) == 0:
        return '<p class="muted">No hours to draw.</p>'
    scale_max = max(known) * 1.12
    width, label_w, bar_h, gap = 900, 120, 22, 12
    usable = width - label_w - 20

    def w(value: float) -> float:
        return usable * max(value, 0) / scale_max

    height = len(rows) * (bar_h + gap) + 4
    parts = [f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="plan against actual hours">']
    for i, (name, value, color, limit) in enumerate(rows):
        top = 4 + i * (bar_h + gap)
        parts.append(f'<text x="0" y="{top + 16}" font-size="13">{name}</text>')
        if value is None:
            parts.append(f'<text x="{label_w}" y="{top + 16}" font-size="12" fill="#59636e">not stated</text>')
            continue
        inside = min(value, limit) if limit is not None else value
        parts.append(f'<rect x="{label_w}" y="{top}" width="{w(inside):.1f}" height="{bar_h}" rx="3" fill="{color}"/>')
        over = ""
        if inside < value:
            over = f" ({hours(value - inside)} over)"
            parts.append(f'<rect x="{label_w + w(inside):.1f}" y="{top}" width="{w(value - inside):.1f}" '
                         f'height="{bar_h}" rx="3" fill="#cf222e"><title>{_esc(hours(value - inside))} beyond '
                         f'the window</title></rect>')
        parts.append(f'<text x="{label_w + w(value) + 6:.1f}" y="{top + 16}" font-size="12">'
                     f'{_esc(hours(value))}{_esc(over)}</text>')
    parts.append("</svg>")
    return "".join(parts)
