"""A figure of line panels, drawn as a PNG with Pillow: ``metrics.png`` (:mod:`.metrics`
says what it shows).

Why not matplotlib, the library made for plots: at the end of every run it was the largest
cost left. Importing it and drawing the three panels took 30–39 MB of resident memory (SINGA's
LeNet: a third of the run's own) and about 1.5–2 CPU-seconds; Pillow takes about 4 MB and
draws the same figure in a few tens of milliseconds. The figure is small and fixed (up to
three panels of lines and markers, a legend each), so its layout is written here: the axes'
limits and ticks, their labels, the legend's place. Pillow draws and encodes it.

A figure is described first, in data coordinates (:class:`Panel`, :class:`Series`: what a
test can check), then drawn (:func:`render`). It is drawn at twice its size and reduced, so
that its lines are smooth (Pillow draws lines without anti-aliasing).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COLORS", "Panel", "Series", "log_ticks", "render", "tick_labels", "ticks"]

Color = tuple[int, int, int]
#: The phases' colours (matplotlib's first three, as the plot had them).
COLORS: dict[str, Color] = {"train": (31, 119, 180), "test": (255, 127, 14),
                            "val": (44, 160, 44)}
_BLACK, _WHITE, _GRID, _FRAME = (0, 0, 0), (255, 255, 255), (222, 222, 222), (204, 204, 204)

# Sizes at 100 dots per inch, as the matplotlib figure had them: 4.7 × 4 inches a panel,
# lines 1.5 points, markers 3 points, text 10 points (titles 12).
PANEL_SIZE = (470, 400)
_LINE, _MARKER, _TEXT, _TITLE = 2.1, 4.2, 14, 17
_DASH = (7.7, 3.3)  # on, off: matplotlib's "--" for that line width


@dataclass(frozen=True)
class Series:
    """One curve of a panel: points in data coordinates, drawn as a line with or without
    markers (``"o"`` circles, ``"s"`` squares), dashed or not; with ``steps``, a staircase
    whose value ``ys[i]`` holds from ``xs[i - 1]`` to ``xs[i]`` (matplotlib's
    ``steps-pre``)."""

    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    color: Color
    marker: str = ""
    dashed: bool = False
    steps: bool = False

    def path(self) -> list[tuple[float, float]]:
        """The vertices of the line: the points, or for a staircase ``2n - 1`` vertices,
        flat runs joined by vertical jumps."""
        points = list(zip(self.xs, self.ys, strict=True))
        if not self.steps or len(points) < 2:
            return points
        out = [points[0]]
        for (x0, _), (x1, y1) in itertools.pairwise(points):
            out += [(x0, y1), (x1, y1)]
        return out


@dataclass
class Panel:
    """One set of axes: its title and labels, its curves, and how its y axis is drawn: on a
    log scale, within ``ylim`` (else the data's range with a margin), labelled as
    percentages."""

    title: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    log: bool = False
    ylim: tuple[float, float] | None = None
    percent: bool = False
    xlabel: str = "step"

    def xlim(self) -> tuple[float, float]:
        return _limits([x for s in self.series for x in s.xs], False)

    def ylimits(self) -> tuple[float, float]:
        if self.ylim is not None:
            return self.ylim
        return _limits([y for s in self.series for y in s.ys], self.log)


def _limits(values: Sequence[float], log: bool) -> tuple[float, float]:
    """The data's range with a margin of 5 % each side (on the log scale: of its decades);
    a single value gets a range around it, no data ``(0, 1)``."""
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return (0.1, 1.0) if log else (0.0, 1.0)
    lo, hi = min(finite), max(finite)
    if log:
        a, b = math.log10(lo), math.log10(hi)
        pad = (b - a) * 0.05 if b > a else 0.5
        return 10 ** (a - pad), 10 ** (b + pad)
    if hi == lo:
        pad = abs(lo) * 0.05 or 0.05
        return lo - pad, hi + pad
    pad = (hi - lo) * 0.05
    return lo - pad, hi + pad


def _nice_step(span: float, most: int) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that cuts ``span`` into at most
    ``most`` intervals."""
    raw = span / most
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if m * power >= raw * (1 - 1e-9):
            return m * power
    return 10.0 * power


def ticks(lo: float, hi: float, most: int = 6) -> tuple[list[float], float]:
    """Round values within ``[lo, hi]``, at most ``most`` intervals apart in number, and
    their spacing."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo], 1.0
    step = _nice_step(hi - lo, most)
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [round(k * step, 12) + 0.0 for k in range(first, last + 1)], step


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log axis within ``[lo, hi]``: the powers of ten, with 2× and 5× them when
    fewer than two powers fall inside, and round values when even those are fewer."""
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    decades = [10.0 ** e for e in range(e0, e1 + 1) if lo <= 10.0 ** e <= hi]
    if len(decades) >= 2:
        return decades
    more = sorted(m * 10.0 ** e for e in range(e0, e1 + 1) for m in (1, 2, 5)
                  if lo <= m * 10.0 ** e <= hi)
    return more if len(more) >= 2 else ticks(lo, hi, 4)[0]


def tick_labels(values: Sequence[float], step: float | None, percent: bool = False
                ) -> list[str]:
    """The ticks' labels: with the decimals their spacing needs (as percentages, of the
    values × 100); ticks of a log axis (``step`` None) in their shortest form."""
    if step is None:
        return [f"{v:g}" for v in values]
    scale = 100.0 if percent else 1.0
    spacing = step * scale
    decimals = max(0, -math.floor(math.log10(spacing) + 1e-9))
    if abs(spacing / 10.0 ** -decimals - round(spacing / 10.0 ** -decimals)) > 1e-6:
        decimals += 1  # 2.5, 0.25: one digit more
    suffix = "%" if percent else ""
    return [f"{v * scale + 0.0:.{decimals}f}{suffix}" for v in values]  # + 0.0: never "-0"


# -- drawing ------------------------------------------------------------------------------------


def render(panels: Sequence[Panel], title: str) -> Any:
    """The figure as a Pillow image (RGB): the panels side by side under ``title``. Each
    panel is drawn at twice its size on an image of its own and reduced (so that the
    largest image held is a panel's, not the figure's).

    Raises:
        ImportError: Pillow is not installed.
    """
    from PIL import Image, ImageDraw, ImageFont

    probe = ImageFont.load_default(size=_TEXT)
    scale = 2 if isinstance(probe, ImageFont.FreeTypeFont) else 1  # a bitmap font: as is
    fonts = {"text": ImageFont.load_default(size=_TEXT * scale),
             "title": ImageFont.load_default(size=_TITLE * scale)}
    w, h = PANEL_SIZE
    figure = Image.new("RGB", (w * max(1, len(panels)), h), _WHITE)
    for i, panel in enumerate(panels):
        image = Image.new("RGB", (w * scale, h * scale), _WHITE)
        _Axes(image, ImageDraw.Draw(image), panel, scale, fonts).draw()
        figure.paste(image.reduce(scale) if scale > 1 else image, (i * w, 0))
    _text(ImageDraw.Draw(figure), (figure.width / 2, 6), title,
          ImageFont.load_default(size=_TITLE), "mt")
    return figure


def _text(draw: Any, xy: tuple[float, float], text: str, font: Any, anchor: str,
          fill: Color = _BLACK) -> tuple[float, float]:
    """Draw ``text`` placed by ``anchor`` (horizontal ``l``/``m``/``r``, vertical
    ``t``/``m``/``b``) at ``xy``; its size. By its bounding box, so that bitmap fonts (which
    take no anchor) are placed alike."""
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    w, h = right - left, bottom - top
    x = xy[0] - {"l": 0, "m": w / 2, "r": w}[anchor[0]] - left
    y = xy[1] - {"t": 0, "m": h / 2, "b": h}[anchor[1]] - top
    draw.text((x, y), text, font=font, fill=fill)
    return w, h


class _Axes:
    """One panel, drawn on an image of its own: title, frame, ticks and their labels, axis
    labels, grid, curves and legend."""

    def __init__(self, image: Any, draw: Any, panel: Panel, scale: int,
                 fonts: dict[str, Any]) -> None:
        self.image, self.d, self.panel, self.s, self.fonts = image, draw, panel, scale, fonts
        self.xlo, self.xhi = panel.xlim()
        self.ylo, self.yhi = panel.ylimits()
        self.xticks, xstep = ticks(self.xlo, self.xhi)
        self.xlabels = tick_labels(self.xticks, xstep)
        if panel.log:
            self.yticks = log_ticks(self.ylo, self.yhi)
            self.ylabels = tick_labels(self.yticks, None)
        else:
            self.yticks, ystep = ticks(self.ylo, self.yhi)
            self.ylabels = tick_labels(self.yticks, ystep, panel.percent)
        font = fonts["text"]
        label_w = max((draw.textbbox((0, 0), t, font=font)[2] for t in self.ylabels),
                      default=0)
        text_h = draw.textbbox((0, 0), "0", font=font)[3]
        s = scale
        self.left = 8 * s + text_h + 8 * s + label_w + 6 * s
        self.right = (PANEL_SIZE[0] - 12) * s
        self.top = 58 * s
        self.bottom = (PANEL_SIZE[1] - 14) * s - 2 * text_h - 8 * s
        self.text_h = text_h

    def x(self, v: float) -> float:
        return self.left + (v - self.xlo) / (self.xhi - self.xlo) * (self.right - self.left)

    def y(self, v: float) -> float:
        if self.panel.log:
            t = (math.log10(v) - math.log10(self.ylo)) / (math.log10(self.yhi)
                                                          - math.log10(self.ylo))
        else:
            t = (v - self.ylo) / (self.yhi - self.ylo)
        return self.bottom - t * (self.bottom - self.top)

    def draw(self) -> None:
        from PIL import Image, ImageDraw

        d, s, font = self.d, self.s, self.fonts["text"]
        # The plot area on an image of its own: what is drawn there is cut at its edges.
        size = (int(self.right - self.left), int(self.bottom - self.top))
        area = Image.new("RGB", size, _WHITE)
        ad = ImageDraw.Draw(area)
        dx, dy = -self.left, -self.top
        for v in self.xticks:
            ad.line([(self.x(v) + dx, 0), (self.x(v) + dx, size[1])], fill=_GRID, width=s)
        for v in self.yticks:
            ad.line([(0, self.y(v) + dy), (size[0], self.y(v) + dy)], fill=_GRID, width=s)
        for series in self.panel.series:
            self._curve(ad, series, dx, dy)
        self._legend(ad, size)
        self.image.paste(area, (int(self.left), int(self.top)))
        d.rectangle([self.left, self.top, self.left + size[0], self.top + size[1]],
                    outline=_BLACK, width=s)
        tick = 4 * s
        for v, label in zip(self.xticks, self.xlabels, strict=True):
            x = self.x(v)
            d.line([(x, self.bottom), (x, self.bottom + tick)], fill=_BLACK, width=s)
            _text(d, (x, self.bottom + tick + 3 * s), label, font, "mt")
        for v, label in zip(self.yticks, self.ylabels, strict=True):
            y = self.y(v)
            d.line([(self.left - tick, y), (self.left, y)], fill=_BLACK, width=s)
            _text(d, (self.left - tick - 3 * s, y), label, font, "rm")
        _text(d, ((self.left + self.right) / 2, self.bottom + tick + 6 * s + self.text_h
                  + 6 * s), self.panel.xlabel, font, "mt")
        _text(d, ((self.left + self.right) / 2, self.top - 7 * s), self.panel.title,
              self.fonts["title"], "mb")
        self._ylabel()

    def _ylabel(self) -> None:
        from PIL import Image, ImageDraw

        font = self.fonts["text"]
        left, top, right, bottom = self.d.textbbox((0, 0), self.panel.ylabel, font=font)
        label = Image.new("RGB", (right - left + 2, bottom - top + 2), _WHITE)
        ImageDraw.Draw(label).text((-left + 1, -top + 1), self.panel.ylabel, font=font,
                                   fill=_BLACK)
        label = label.rotate(90, expand=True)
        self.image.paste(label, (8 * self.s,
                                 int((self.top + self.bottom - label.height) / 2)))

    def _pixels(self, series: Series, dx: float, dy: float) -> list[tuple[float, float]]:
        """The vertices of ``series``' line, in pixels of the plot area (moved by ``dx``,
        ``dy``); points that cannot be drawn (NaN, not positive on a log axis) left out."""
        return [(self.x(x) + dx, self.y(y) + dy) for x, y in series.path()
                if math.isfinite(x) and math.isfinite(y) and (y > 0 or not self.panel.log)]

    def _curve(self, d: Any, series: Series, dx: float, dy: float) -> None:
        points = self._pixels(series, dx, dy)
        width = max(1, round(_LINE * self.s))
        if len(points) > 1:
            if series.dashed:
                for run in _dashes(points, _DASH[0] * self.s, _DASH[1] * self.s):
                    d.line(run, fill=series.color, width=width)
            else:
                d.line(points, fill=series.color, width=width, joint="curve")
        if series.marker:
            for x, y in (p for p, keep in zip(points, _marked(series)) if keep):
                _marker(d, series.marker, x, y, _MARKER * self.s / 2, series.color)

    def _legend(self, d: Any, size: tuple[int, int]) -> None:
        """The curves' labels in a box at the corner of the plot area that hides the least
        of their lines."""
        labelled = [sr for sr in self.panel.series if sr.label]
        if not labelled:
            return
        s, font = self.s, self.fonts["text"]
        line_w, pad, gap = 24 * s, 5 * s, 3 * s
        text_w = max(d.textbbox((0, 0), sr.label, font=font)[2] for sr in labelled)
        row = self.text_h + gap
        w = pad + line_w + 6 * s + text_w + pad
        h = pad + len(labelled) * row - gap + pad
        margin = 6 * s
        corners = [(size[0] - margin - w, margin), (margin, margin),
                   (margin, size[1] - margin - h), (size[0] - margin - w, size[1] - margin - h)]
        points = [p for sr in self.panel.series
                  for p in _along(self._pixels(sr, -self.left, -self.top), 4 * s)]

        def hidden(corner: tuple[float, float]) -> int:
            cx, cy = corner
            return sum(cx <= px <= cx + w and cy <= py <= cy + h for px, py in points)

        cx, cy = min(corners, key=hidden)  # ties: the first, the upper right
        d.rounded_rectangle([cx, cy, cx + w, cy + h], radius=3 * s, fill=_WHITE,
                            outline=_FRAME, width=s)
        for i, sr in enumerate(labelled):
            ym = cy + pad + i * row + self.text_h / 2
            x1, x2 = cx + pad, cx + pad + line_w
            if sr.dashed:
                for run in _dashes([(x1, ym), (x2, ym)], _DASH[0] * s, _DASH[1] * s):
                    d.line(run, fill=sr.color, width=max(1, round(_LINE * s)))
            else:
                d.line([(x1, ym), (x2, ym)], fill=sr.color, width=max(1, round(_LINE * s)))
            if sr.marker:
                _marker(d, sr.marker, (x1 + x2) / 2, ym, _MARKER * s / 2, sr.color)
            _text(d, (x2 + 6 * s, ym), sr.label, font, "lm")


def _along(points: Sequence[tuple[float, float]], spacing: float
           ) -> list[tuple[float, float]]:
    """Points along a polyline, at most ``spacing`` apart, its vertices among them: where
    the line runs (a legend must not hide it between its data points either)."""
    out = list(points[:1])
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        n = max(1, math.ceil(math.hypot(x1 - x0, y1 - y0) / spacing))
        out += [(x0 + (x1 - x0) * i / n, y0 + (y1 - y0) * i / n) for i in range(1, n + 1)]
    return out


def _marked(series: Series) -> list[bool]:
    """Which vertices of the drawn path are data points (a staircase's corners are not)."""
    if not series.steps or len(series.xs) < 2:
        return [True] * len(series.xs)
    return [True] + [False, True] * (len(series.xs) - 1)


def _marker(d: Any, kind: str, x: float, y: float, r: float, color: Color) -> None:
    box = [x - r, y - r, x + r, y + r]
    if kind == "s":
        d.rectangle(box, fill=color)
    else:
        d.ellipse(box, fill=color)


def _dashes(points: Sequence[tuple[float, float]], on: float, off: float
            ) -> list[list[tuple[float, float]]]:
    """The drawn runs of a dashed polyline: ``on`` long, ``off`` apart, the pattern carried
    across its vertices."""
    runs: list[list[tuple[float, float]]] = []
    drawing, left = True, on
    current: list[tuple[float, float]] = [points[0]]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        length = math.hypot(x1 - x0, y1 - y0)
        done = 0.0
        while length - done > left:
            done += left
            t = done / length
            p = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t)
            if drawing:
                current.append(p)
                runs.append(current)
            current = [p]
            drawing, left = not drawing, off if drawing else on
        left -= length - done
        if drawing:
            current.append((x1, y1))
        else:
            current = [(x1, y1)]
    if drawing and len(current) > 1:
        runs.append(current)
    return runs
