"""report.html: a page a person reads. Verdict first, then findings, per-group
tables and four plots drawn with matplotlib (PNG, inlined: the page is one file)."""

from __future__ import annotations

import base64
import html
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory only
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

_CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px}
.verdict{font-size:1.6em;padding:.6em 1em;border-radius:6px;color:#fff}
.pass{background:#2e7d32}.fail{background:#c62828}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;
padding:3px 8px;font-size:.9em;text-align:left}tr.violation td{background:#fdecea}
figure.plot{margin:1em 0}figure.plot img{max-width:100%}"""
_FINDING_COLS = ("severity", "kind", "node", "group", "index", "term", "detail")
_LOG_COLS = ("node", "first", "last", "commit", "hs_term", "survivors", "superseded",
             "copies", "conf_changes", "checked", "snapshot", "unavailable", "conf")
_FINDINGS_SHOWN = 500


def _cell(v: Any) -> str:
    if v is None or v == []:
        return ""
    if isinstance(v, list | tuple):
        return html.escape(", ".join(
            f"{r[0]}..{r[1]}" if isinstance(r, list | tuple) else str(r) for r in v)
            if v and isinstance(v[0], list | tuple) else f"{v[0]}..{v[1]}")
    return html.escape(str(v))


def _table(cols: tuple[str, ...], rows: list[dict[str, Any]], cls_key: str = "") -> str:
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = "".join(
        f"<tr class='{html.escape(str(r.get(cls_key, '')))}'>"
        + "".join(f"<td>{_cell(r.get(c))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _png(fig: Any, title: str) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode()
    return (f"<figure class='plot'><img alt='{html.escape(title)}' "
            f"src='data:image/png;base64,{data}'><figcaption>{html.escape(title)}"
            "</figcaption></figure>")


def plot_entries(groups: dict[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.2))
    width = 0.8 / max(1, len(groups))
    for k, (grp, g) in enumerate(groups.items()):
        pts = g["entries_per_term"]
        ax.bar([t - 0.4 + (k + 0.5) * width for t, _ in pts], [n for _, n in pts], width,
               label=grp)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="term (Raft's logical clock)", ylabel="committed entries",
           title="Entries per group over time")
    _legend(ax, groups)
    return _png(fig, "Committed entries per group in each term")


def plot_terms(groups: dict[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.2))
    for grp, g in groups.items():
        starts = _with_first_term(g)
        if starts:
            ax.step([i for i, _ in starts], [t for _, t in starts], where="post", marker="o",
                    label=grp)
            for i, t in starts:
                who = g["leaders"].get(str(t))
                if who is not None:
                    ax.annotate(f"n{who}", (i, t), fontsize=7, xytext=(2, 2),
                                textcoords="offset points")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="log index where the term starts", ylabel="term",
           title="Term and leader changes (label: candidate most nodes voted for)")
    _legend(ax, groups)
    return _png(fig, "Term and leader changes along the log")


def _with_first_term(g: dict[str, Any]) -> list[tuple[int, int]]:
    """Term starts, plus the oldest term at the first index any log still holds."""
    starts = [tuple(x) for x in g["term_starts"]]
    firsts = [c["first"] for c in g["logs"] if c["first"] is not None]
    terms = [t for t, _ in g["entries_per_term"]]
    if firsts and terms and min(terms) not in {t for _, t in starts}:
        starts.insert(0, (min(firsts), min(terms)))
    return starts


def plot_lag(groups: dict[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.2))
    labels, lag_last, lag_commit = [], [], []
    for grp, g in groups.items():
        ends = {c["node"]: max(c["last"] or 0, c["snapshot"][1] if c["snapshot"] else 0)
                for c in g["logs"]}  # a log that is only a snapshot ends where it does
        top_last = max(ends.values())
        top_commit = max(c["commit"] for c in g["logs"])
        for c in g["logs"]:
            labels.append(f"{grp}\n{c['node']}")
            lag_last.append(top_last - ends[c["node"]])
            lag_commit.append(top_commit - c["commit"])
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], lag_last, width=0.4, label="behind the longest log")
    ax.bar([x + 0.2 for x in xs], lag_commit, width=0.4, label="behind the highest commit")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set(ylabel="entries", title="Replica lag at the end of each log")
    ax.legend(fontsize=8)
    return _png(fig, "Replica lag at log end")


def plot_divergence(report: dict[str, Any]) -> str:
    fig, ax = plt.subplots(figsize=(10, 3.2))
    hits = [f for f in report["findings"] if f["severity"] == "violation" and "index" in f]
    kinds = sorted({f["kind"] for f in hits})
    groups = sorted({f.get("group", "?") for f in hits})
    for kind in kinds:
        mine = [f for f in hits if f["kind"] == kind]
        ax.scatter([f["index"] for f in mine], [groups.index(f.get("group", "?")) for f in mine],
                   label=kind, marker="x", s=60)
    ends = [c["last"] or 0 for g in report["groups"].values() for c in g["logs"]]
    if ends and max(ends) > 0:
        ax.set_xlim(0, max(ends) + 1)  # the whole log: divergence is seen where it sits
    if hits:
        ax.set_yticks(range(len(groups)), groups)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no divergence found", ha="center", va="center",
                transform=ax.transAxes, fontsize=14, color="#2e7d32")
    ax.set(xlabel="log index", title="Where the replicas diverge (violations with an index)")
    return _png(fig, "Where divergence sits")


def _legend(ax: Any, groups: dict[str, Any]) -> None:
    if 0 < len(groups) <= 12:
        ax.legend(fontsize=8)


def render(report: dict[str, Any]) -> str:
    v = report["verdict"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>jetraft audit</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<div id='verdict' class='verdict {'pass' if v['ok'] else 'fail'}'>"
             f"{html.escape(v['text'])}</div>",
             f"<p>{len(report['stats'].get('nodes', []))} nodes, "
             f"{report['stats'].get('records', 0)} records in "
             f"{report['stats'].get('segments', 0)} segments "
             f"({report['stats'].get('archived_segments', 0)} archived).</p>",
             "<h2>Findings</h2>",
             _table(_FINDING_COLS, report["findings"][:_FINDINGS_SHOWN], "severity")
             if report["findings"] else "<p>None.</p>"]
    for grp, g in report["groups"].items():
        parts.append(f"<h2>Group {html.escape(grp)}</h2>")
        parts.append(_table(_LOG_COLS, g["logs"]))
        if g["uncovered"]:
            parts.append(f"<p>Not checkable on any node: {_cell(g['uncovered'])}</p>")
    parts.append("<h2>Plots</h2>")
    groups = report["groups"]
    parts += [plot_entries(groups), plot_terms(groups), plot_lag(groups),
              plot_divergence(report)]
    parts.append("</body></html>")
    return "\n".join(parts)
