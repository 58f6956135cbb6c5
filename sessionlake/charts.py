"""Small charts as inline SVG, drawn on the server.

The health page runs inside the Airflow UI on machines that may have no network, and the
report is a single HTML file to mail around: no JavaScript library, no CDN, just SVG
elements with the numbers baked in. Every chart has a ``<title>`` (what it shows) so that
it reads in a screen reader and in a test.

Example::

    svg = line_chart("Batch duration", {"seconds": [1.2, 3.4, 2.0]},
                     x_labels=("10:00", "10:10"), unit="s")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 640, 220
_MARGIN_LEFT, _MARGIN_RIGHT, _MARGIN_TOP, _MARGIN_BOTTOM = 56, 16, 44, 36
_LEGEND_SLOT = 100
#: Colours of the series, in order (readable on white, and for most colour blindness).
PALETTE = ("#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd")


def _number(value: float) -> str:
    """A short label: 1234567 -> 1.2M, 0.25 -> 0.25."""
    size = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _frame(title: str, width: int, height: int, top: float, unit: str) -> list[str]:
    """The SVG's start: title, axes, and the top and zero labels of the y axis."""
    plot_bottom = height - _MARGIN_BOTTOM
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{_MARGIN_LEFT}" y="16" font-size="13" font-weight="bold">'
        f"{escape(title)}</text>",
        f'<line x1="{_MARGIN_LEFT}" y1="{_MARGIN_TOP}" x2="{_MARGIN_LEFT}" y2="{plot_bottom}" '
        'stroke="#555"/>',
        f'<line x1="{_MARGIN_LEFT}" y1="{plot_bottom}" x2="{width - _MARGIN_RIGHT}" '
        f'y2="{plot_bottom}" stroke="#555"/>',
        f'<text x="{_MARGIN_LEFT - 4}" y="{_MARGIN_TOP + 4}" font-size="11" '
        f'text-anchor="end">{escape(_number(top) + unit)}</text>',
        f'<text x="{_MARGIN_LEFT - 4}" y="{plot_bottom}" font-size="11" '
        f'text-anchor="end">0</text>',
    ]


def _empty(title: str, width: int, height: int) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}"><title>{escape(title)}</title>'
        f'<text x="{_MARGIN_LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}'
        f'</text><text x="{_MARGIN_LEFT}" y="{height // 2}" font-size="12" fill="#777">'
        "no data yet</text></svg>"
    )


def line_chart(
    title: str,
    series: Mapping[str, Sequence[float]],
    *,
    x_labels: tuple[str, str] = ("", ""),
    unit: str = "",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Lines over a shared x axis (one point per index), with a legend.

    :param series: name -> values; all of the same length (one per x position).
    :param x_labels: the labels under the first and the last point.
    :param unit: appended to the y axis' top label (``s``, ``%``).
    :return: an ``<svg>`` element.
    """
    longest = max((len(v) for v in series.values()), default=0)
    if longest == 0:
        return _empty(title, width, height)
    top = max((max(v) for v in series.values() if v), default=0.0) or 1.0
    plot_w = width - _MARGIN_LEFT - _MARGIN_RIGHT
    plot_h = height - _MARGIN_TOP - _MARGIN_BOTTOM
    step = plot_w / max(longest - 1, 1)
    parts = _frame(title, width, height, top, unit)
    for index, (name, values) in enumerate(series.items()):
        colour = PALETTE[index % len(PALETTE)]
        points = [(_MARGIN_LEFT + i * step, _MARGIN_TOP + plot_h * (1 - v / top))
                  for i, v in enumerate(values)]
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline class="series" data-name="{escape(name)}" fill="none" '
                     f'stroke="{colour}" stroke-width="2" points="{coords}"/>')
        if len(points) <= 60:
            parts.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"/>'
                         for x, y in points)
        # The legend: a line of its own under the title, clear of the plot.
        legend_x = _MARGIN_LEFT + index * _LEGEND_SLOT
        parts.append(f'<rect x="{legend_x}" y="23" width="10" height="10" '
                     f'fill="{colour}"/><text x="{legend_x + 14}" y="32" '
                     f'font-size="11">{escape(name)}</text>')
    bottom = height - _MARGIN_BOTTOM + 16
    parts.append(f'<text x="{_MARGIN_LEFT}" y="{bottom}" font-size="11">'
                 f"{escape(x_labels[0])}</text>")
    parts.append(f'<text x="{width - _MARGIN_RIGHT}" y="{bottom}" font-size="11" '
                 f'text-anchor="end">{escape(x_labels[1])}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def bar_chart(
    title: str,
    bars: Sequence[tuple[str, float]],
    *,
    unit: str = "",
    width: int = WIDTH,
    height: int = HEIGHT,
    label_every: int | None = None,
) -> str:
    """Vertical bars, one per (label, value), with the labels under them.

    :param label_every: write every n-th label only (default: as many as fit).
    :return: an ``<svg>`` element.
    """
    if not bars:
        return _empty(title, width, height)
    top = max(v for _, v in bars) or 1.0
    plot_w = width - _MARGIN_LEFT - _MARGIN_RIGHT
    plot_h = height - _MARGIN_TOP - _MARGIN_BOTTOM
    slot = plot_w / len(bars)
    every = label_every or max(1, int(len(bars) * 60 // plot_w) + 1)
    parts = _frame(title, width, height, top, unit)
    for index, (label, value) in enumerate(bars):
        bar_h = plot_h * value / top
        x = _MARGIN_LEFT + index * slot + slot * 0.1
        y = _MARGIN_TOP + plot_h - bar_h
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}" '
            f'height="{bar_h:.1f}" fill="{PALETTE[0]}"><title>{escape(label)}: '
            f"{escape(_number(value))}</title></rect>"
        )
        if index % every == 0:
            parts.append(
                f'<text x="{x + slot * 0.4:.1f}" y="{height - _MARGIN_BOTTOM + 14}" '
                f'font-size="10" text-anchor="middle">{escape(label)}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts)
