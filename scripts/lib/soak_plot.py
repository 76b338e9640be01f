"""The SVG of scripts/soak: the samples over time in stacked panels sharing the time axis
(gateway RSS with the +-5% band around the mark, requests in flight, KV reserved, each tenant's
lowest bucket level, open files), with the RSS mark and the start of the drain marked. Python
standard library only.
"""

import math
from xml.sax.saxutils import escape

WIDTH = 960
PANEL_H = 150
TOP = 40
GAP = 46
LEFT = 70
RIGHT = 190
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a"]


def nice_step(v):
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above v."""
    if v <= 0:
        return 1.0
    k = 10.0 ** math.floor(math.log10(v))
    return next(m * k for m in (1, 2, 2.5, 5, 10) if m * k >= v * (1 - 1e-12))


def axis(v):
    """(step, max) of an axis from 0 showing v in about 5 steps."""
    step = nice_step(v / 5)
    return step, step * max(1, math.ceil(v / step - 1e-9))


def fmt(v):
    return f"{v:g}" if abs(v) < 1e4 else f"{v:,.0f}"


class Panel:
    def __init__(self, index, title, x_max, y_top):
        self.top = TOP + index * (PANEL_H + GAP)
        self.title, self.x_max = title, x_max
        self.y_step, self.y_max = axis(y_top)
        self.w = WIDTH - LEFT - RIGHT
        self.parts = []
        self.legend = []

    def x(self, v):
        return LEFT + self.w * v / self.x_max

    def y(self, v):
        return self.top + PANEL_H * (1 - v / self.y_max)

    def line(self, xs, ys, label, color, dash=""):
        pts = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in zip(xs, ys) if b is not None)
        self.parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                          f'stroke-dasharray="{dash}" points="{pts}"/>')
        self.legend.append((label, color, dash))

    def band(self, lo, hi, label):
        self.parts.append(f'<rect x="{LEFT}" y="{self.y(hi):.1f}" width="{self.w}" '
                          f'height="{self.y(lo) - self.y(hi):.1f}" fill="#2ca02c" opacity="0.12"/>')
        self.legend.append((label, "#b7dfb7", ""))

    def vline(self, x, color):
        self.parts.append(f'<line x1="{self.x(x):.1f}" x2="{self.x(x):.1f}" y1="{self.top}" '
                          f'y2="{self.top + PANEL_H}" stroke="{color}" stroke-dasharray="4 3"/>')

    def render(self):
        out = [f'<text x="{LEFT}" y="{self.top - 8}" font-weight="bold">{escape(self.title)}</text>',
               f'<rect x="{LEFT}" y="{self.top}" width="{self.w}" height="{PANEL_H}" '
               f'fill="none" stroke="#444"/>']
        for i in range(round(self.y_max / self.y_step) + 1):
            v = i * self.y_step
            y = self.y(v)
            out.append(f'<line x1="{LEFT}" x2="{LEFT + self.w}" y1="{y:.1f}" y2="{y:.1f}" '
                       f'stroke="#ddd"/>')
            out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
        step = nice_step(self.x_max / 8)
        for i in range(math.floor(self.x_max / step + 1e-9) + 1):
            out.append(f'<text x="{self.x(i * step):.1f}" y="{self.top + PANEL_H + 14}" '
                       f'text-anchor="middle">{fmt(round(i * step, 6))}</text>')
        out += self.parts
        for i, (label, color, dash) in enumerate(self.legend):
            y = self.top + 10 + 16 * i
            x = LEFT + self.w + 12
            out.append(f'<line x1="{x}" x2="{x + 22}" y1="{y}" y2="{y}" stroke="{color}" '
                       f'stroke-width="3" stroke-dasharray="{dash}"/>')
            out.append(f'<text x="{x + 28}" y="{y + 4}">{escape(label)}</text>')
        return out


def svg(rows, mark_s, load_s, memory):
    """The plot of `rows` (scripts/soak's samples); `mark_s` the RSS mark, `load_s` the planned
    load, `memory` the RSS figures (or None)."""
    xs = [r["t_s"] / 60 for r in rows]
    x_max = max(xs + [load_s / 60]) or 1.0
    drain = next((r["t_s"] / 60 for r in rows if r["phase"] != "load"), None)
    panels = []

    rss = [r["rss_kib"] / 1024 for r in rows]
    p = Panel(0, "gateway RSS, MiB", x_max, max(rss) * 1.1)
    if memory:
        m = memory["mark_rss_kib"] / 1024
        p.band(m * 0.95, m * 1.05, f"mark {m:.1f} +-5%")
        p.line(xs, rss, f"RSS, {memory['end_rss_kib'] / 1024:.1f} at the end", COLORS[0])
    else:
        p.line(xs, rss, "RSS", COLORS[0])
    panels.append(p)

    keys = [("inflight", "in flight (gateway)"), ("queued", "waiting for KV"),
            ("sim_running", "running (sim)"), ("sim_waiting", "waiting (sim)")]
    top = max(max(r[k] for r in rows) for k, _ in keys)
    p = Panel(1, "requests", x_max, top * 1.1)
    for i, (k, label) in enumerate(keys):
        p.line(xs, [r[k] for r in rows], label, COLORS[i])
    panels.append(p)

    cap = max(r["kv_capacity_bytes"] for r in rows) / 1e9
    p = Panel(2, "KV reserved, GB", x_max, cap)
    p.line(xs, [r["kv_reserved_bytes"] / 1e9 for r in rows], "reserved", COLORS[0])
    p.line([0, x_max], [cap, cap], "capacity", "#444", "4 3")
    panels.append(p)

    # The fullest picture is in the CSV; here each tenant's lowest bucket, the one that binds.
    p = Panel(3, "each tenant's lowest bucket, % of capacity", x_max, 100)
    series = [k for k in rows[0] if k.endswith("_pct")]
    tenants = list(dict.fromkeys(k.split("_")[0] for k in series))
    for i, tenant in enumerate(tenants):
        mine = [k for k in series if k.startswith(f"{tenant}_")]
        p.line(xs, [min(r[k] for k in mine) for r in rows], tenant, COLORS[i % len(COLORS)])
    panels.append(p)

    fds = [r["fds"] for r in rows]
    p = Panel(4, "gateway open files", x_max, max(fds) * 1.1)
    p.line(xs, fds, "file descriptors", COLORS[0])
    panels.append(p)

    height = TOP + len(panels) * (PANEL_H + GAP) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="18" font-size="13">tokengate soak: {load_s / 60:g} min of load, '
           f'then the drain (minutes on the x axis; dashed: the RSS mark at {mark_s:.0f} s, '
           f'the start of the drain)</text>']
    for p in panels:
        p.vline(mark_s / 60, "#2ca02c")
        if drain is not None:
            p.vline(drain, "#d62728")
        out += p.render()
    out.append("</svg>")
    return "\n".join(out) + "\n"
