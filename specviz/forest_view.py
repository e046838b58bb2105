"""Forest view: one round's draft forest as a networkx graph drawn by plotly.

Layout is a tidy tree: leaves on consecutive slots, each parent centred over its first and
last child, one tree per beam side by side. Node colour = NodeTrace.status; hover joins the
node with the TestRecord of the same (tree, node id). Beam methods ring each drafted node of a
verified step: blue with its rank when it is one of the target's top-K beams at that step,
brown when it is not (RoundTrace.beam_steps). Big forests are collapsed (labels of unexamined
nodes hidden, not_reached subtrees folded, depth cut) with a note on the figure.
"""

from __future__ import annotations

import networkx as nx
import plotly.graph_objects as go

from engine.analysis.diagnosis_views import empty_figure
from engine.contract.trace import (
    ACCEPTED,
    AUTO_REJECTED,
    BONUS,
    NOT_REACHED,
    REJECTED,
    RESAMPLED,
    SKIPPED,
    STATUSES,
    TARGET,
    DraftMatch,
    RoundTrace,
    RunTrace,
)
from specviz.figures import round_counts

STATUS_COLORS = {
    ACCEPTED: "#2e9e4f",
    REJECTED: "#d64545",
    AUTO_REJECTED: "#f08c8c",
    SKIPPED: "#b9b9b9",
    RESAMPLED: "#f28e2b",
    BONUS: "#3b7dd8",
    TARGET: "#8e5cc9",
    NOT_REACHED: "#e6e6e6",
}
ON_PATH = (ACCEPTED, RESAMPLED, BONUS, TARGET)
LABEL_SLOTS = 36  # wider forests label only the examined nodes
DENSE_HIDDEN = (SKIPPED, NOT_REACHED)
NODE_LIMIT = 300  # collapse beyond this many nodes
HEIGHT = 430  # the figure's height, grown for deep forests (DEPTH_PX a depth level)
DEPTH_PX = 48  # a node, its label below it and a gap: deeper forests get a taller figure
MIN_SLOTS = 9  # narrowest x range, in leaf slots
IN_TOP_K = "#1f4e9c"  # ring of a drafted beam that is one of the target's top-K
NOT_IN_TOP_K = "#9a5b13"  # ring of a drafted beam the target did not rank in its top-K


def token_label(text: str) -> str:
    """Visible form of a token: spaces and newlines made explicit, long tokens cut."""
    t = text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣")
    return t if len(t) <= 10 else t[:9] + "…"


def _fmt(x) -> str:
    if x is None:
        return "—"
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)


def _root(tree: int) -> tuple[str, int]:
    return ("root", tree)


def _key(tree: int, node: int) -> tuple[str, int, int]:
    return ("n", tree, node)


def forest_graph(r: RoundTrace) -> nx.DiGraph:
    """Directed graph of the round: ("root", tree) -> ("n", tree, id) edges (node ids are
    unique within a tree), node attributes copied from NodeTrace; rounds without a forest
    (baselines) get their committed tokens as a chain."""
    g = nx.DiGraph()
    trees = sorted({n.tree for n in r.nodes} | set(range(max(len(r.beams_before), 1))))
    for t in trees:
        g.add_node(_root(t), kind="root", tree=t, depth=0)
    tests = {}
    for t in r.tests:
        tests.setdefault((t.tree, t.node), []).append(t)
    matches = {(m.tree, m.node): m for s in r.beam_steps for m in s.drafted}
    single = len(trees) == 1  # committed node ids are unambiguous only with one tree
    committed = {c.node for c in r.committed if c.node >= 0} if single else set()
    for n in r.nodes:
        g.add_node(_key(n.tree, n.id), kind="node", node=n,
                   tests=tests.get((n.tree, n.id), []), depth=n.depth,
                   committed=n.id in committed or n.status in ON_PATH,
                   match=matches.get((n.tree, n.id)))
    for n in r.nodes:
        parent = _root(n.tree) if n.parent < 0 else _key(n.tree, n.parent)
        if parent not in g:  # a parent outside the record: hang it from its root
            parent = _root(n.tree)
        g.add_edge(parent, _key(n.tree, n.id))
    if not r.nodes:
        _add_committed_chain(g, r)
    return g


def _add_committed_chain(g: nx.DiGraph, r: RoundTrace) -> None:
    """Rounds without a forest (baselines): the committed tokens as target-chosen nodes."""
    from engine.contract.trace import NodeTrace

    prev = _root(0)
    for i, c in enumerate(r.committed):
        status = c.origin if c.origin in STATUSES else TARGET
        node = NodeTrace(-1 - i, -1, 0, i + 1, c.token_id, c.text, None, None, status)
        key = _key(0, node.id)
        g.add_node(key, kind="node", node=node, tests=[], depth=i + 1, committed=True)
        g.add_edge(prev, key)
        prev = key


def _collapse(g: nx.DiGraph) -> tuple[nx.DiGraph, list[str]]:
    """Fold not_reached subtrees, then cut depth, until the graph fits NODE_LIMIT."""
    notes = []
    if g.number_of_nodes() <= NODE_LIMIT:
        return g, notes
    hidden = [k for k, d in g.nodes(data=True) if d.get("kind") == "node"
              and d["node"].status == NOT_REACHED
              and g.nodes[next(iter(g.predecessors(k)))].get("kind") == "node"
              and g.nodes[next(iter(g.predecessors(k)))]["node"].status == NOT_REACHED]
    if hidden:
        g = g.copy()
        g.remove_nodes_from(hidden)
        notes.append(f"{len(hidden)} nodes below not_reached nodes folded")
    depth = max((d["depth"] for _, d in g.nodes(data=True)), default=0)
    while g.number_of_nodes() > NODE_LIMIT and depth > 1:
        deep = [k for k, d in g.nodes(data=True) if d["depth"] >= depth]
        g = g.copy()
        g.remove_nodes_from(deep)
        notes.append(f"{len(deep)} nodes at depth >= {depth} cut")
        depth -= 1
    return g, notes


def tidy_layout(g: nx.DiGraph) -> dict:
    """Positions {node: (x, -depth)}: leaves on consecutive slots, parents centred over
    their first and last child, trees side by side with one free slot between them."""
    pos: dict = {}
    slot = 0.0

    def place(k) -> float:
        nonlocal slot
        kids = sorted(g.successors(k), key=lambda c: abs(c[-1]))
        if not kids:
            x, slot = slot, slot + 1.0
        else:
            xs = [place(c) for c in kids]
            x = (xs[0] + xs[-1]) / 2.0
        pos[k] = (x, -g.nodes[k]["depth"])
        return x

    roots = sorted((k for k, d in g.nodes(data=True) if d.get("kind") == "root"),
                   key=lambda k: k[1])
    for root in roots:
        place(root)
        slot += 1.0
    return pos


def _hover(d: dict) -> str:
    n = d["node"]
    lines = [f"<b>{token_label(n.text)}</b> (id {n.token_id}) · <b>{n.status}</b>",
             f"tree {n.tree}, depth {n.depth}, node {n.id}",
             f"p (target) = {_fmt(n.p)}   q (draft) = {_fmt(n.q)}"]
    for t in d["tests"]:
        lines.append(f"ratio min(1, p/q) = {_fmt(t.ratio)}   uniform u = {_fmt(t.uniform)}")
        lines.append(f"decision: <b>{t.decision}</b>"
                     + (f"   residual mass = {_fmt(t.residual_mass)}"
                        if t.residual_mass is not None else "")
                     + (f"   ({t.note})" if t.note else ""))
    if not d["tests"]:
        lines.append("not tested")
    if d.get("match") is not None:
        lines.append(match_label(d["match"]))
    return "<br>".join(lines)


def match_label(m: DraftMatch) -> str:
    """One line: where the target ranks a drafted beam at its step."""
    score = ("its parent is not a target beam" if m.score is None
             else f"target score {m.score:.4g}")
    if m.rank:
        return f"<b>target top-K #{m.rank}</b> ({score})"
    return f"<b>not in the target's top-K</b> ({score})"


def _match_traces(g: nx.DiGraph, pos: dict) -> list[go.Scatter]:
    """Rings over the drafted nodes of verified beam steps: in the target's top-K (with its
    rank) or not. Hover stays on the node itself (its text has the match line)."""
    keys = [k for k, d in g.nodes(data=True) if d.get("match") is not None]
    out = []
    for hit, name, color, symbol in ((True, "ring: in target's top-K (#rank)", IN_TOP_K,
                                      "circle-open"),
                                     (False, "ring: drafted, not in target's top-K",
                                      NOT_IN_TOP_K, "square-open")):
        ks = [k for k in keys if bool(g.nodes[k]["match"].rank) == hit]
        if not ks:
            continue
        out.append(go.Scatter(
            x=[pos[k][0] for k in ks], y=[pos[k][1] for k in ks],
            mode="markers+text" if hit else "markers", name=name, hoverinfo="skip",
            text=[f"#{g.nodes[k]['match'].rank}" for k in ks], textposition="top right",
            textfont=dict(size=11, color=IN_TOP_K),
            marker=dict(size=22, symbol=symbol, color=color, line=dict(width=2, color=color))))
    return out


def _root_hover(r: RoundTrace, tree: int, vocab: dict[int, str]) -> str:
    if tree < len(r.beams_before):
        b = r.beams_before[tree]
        tail = "".join(vocab.get(t, f"<{t}>") for t in b.token_ids[-8:])
        return f"<b>beam {tree}</b> score {b.score:.4g}<br>…{tail!r}"
    return f"<b>root of tree {tree}</b> (committed prefix)"


def _edges(g: nx.DiGraph, pos: dict, on_path: bool) -> go.Scatter:
    xs, ys = [], []
    for a, b in g.edges():
        if bool(g.nodes[b].get("committed")) == on_path:
            xs += [pos[a][0], pos[b][0], None]
            ys += [pos[a][1], pos[b][1], None]
    style = dict(color="#e0a800", width=4) if on_path else dict(color="#9aa3ad", width=1)
    return go.Scatter(x=xs, y=ys, mode="lines", line=style, hoverinfo="skip",
                      name="committed path" if on_path else "edge", showlegend=on_path)


def _status_trace(g, pos, status: str, labels: bool, dense: bool) -> go.Scatter:
    keys = [k for k, d in g.nodes(data=True)
            if d.get("kind") == "node" and d["node"].status == status]
    ring = ["#e0a800" if g.nodes[k]["committed"] else "#5f6b78" for k in keys]
    return go.Scatter(
        x=[pos[k][0] for k in keys] or [None], y=[pos[k][1] for k in keys] or [None],
        mode="markers+text" if labels else "markers", name=status,
        text=[token_label(g.nodes[k]["node"].text) for k in keys],
        textposition="bottom center", textfont=dict(size=11),
        hovertext=[_hover(g.nodes[k]) for k in keys], hoverinfo="text",
        marker=dict(size=10 if dense else 16, color=STATUS_COLORS[status],
                    line=dict(color=ring, width=2)),
    )


def vocab_of(trace: RunTrace) -> dict[int, str]:
    """token id -> text for every token the trace decoded (nodes, committed, prompt)."""
    vocab = dict(zip(trace.prompt_ids, trace.prompt_text))
    for r in trace.rounds:
        for n in r.nodes:
            vocab.setdefault(n.token_id, n.text)
        for c in r.committed:
            vocab.setdefault(c.token_id, c.text)
    return vocab


def forest_figure(trace: RunTrace | None, index: int) -> go.Figure:
    """Plotly figure of round ``index`` of the trace (fixed height)."""
    if trace is None or not trace.rounds:
        return empty_figure("Run a method or import a trace to see its draft forest", HEIGHT)
    index = min(max(index, 0), len(trace.rounds) - 1)
    r = trace.rounds[index]
    g, notes = _collapse(forest_graph(r))
    pos = tidy_layout(g)
    xs = [x for x, _ in pos.values()]
    dense = max(xs) - min(xs) + 1 > LABEL_SLOTS
    if dense:
        notes.append("labels of skipped / not_reached nodes hidden (hover for tokens)")
    if not r.nodes:
        notes.append("no draft forest this round: the target chose the token(s)")
    vocab = vocab_of(trace)
    roots = [k for k, d in g.nodes(data=True) if d.get("kind") == "root"]
    fig = go.Figure([_edges(g, pos, False), _edges(g, pos, True)])
    fig.add_trace(go.Scatter(
        x=[pos[k][0] for k in roots], y=[pos[k][1] for k in roots], mode="markers+text",
        name="root (prefix)", text=[f"beam {k[1]}" if len(roots) > 1 else "prefix"
                                    for k in roots],
        textposition="top center", marker=dict(size=14, color="#2b3440", symbol="square"),
        hovertext=[_root_hover(r, k[1], vocab) for k in roots], hoverinfo="text"))
    for status in STATUSES:
        fig.add_trace(_status_trace(g, pos, status, not dense or status not in DENSE_HIDDEN,
                                    dense))
    fig.add_traces(_match_traces(g, pos))
    title = f"Round {r.index}: {round_counts(r).drafted_phrase}"
    if notes:
        title += "<br><span style='font-size:12px;color:#8a5a00'>" + "; ".join(notes) + "</span>"
    fig.update_layout(
        title=dict(text=title, font=dict(size=14), x=0.01), height=forest_height(pos),
        margin=dict(l=10, r=10, t=60 if notes else 40, b=10), plot_bgcolor="white",
        xaxis=dict(visible=False, range=_xrange(pos)),
        yaxis=dict(range=_yrange(pos), tickvals=_depths(pos), showgrid=False, zeroline=False,
                   ticktext=[f"depth {-d}" for d in _depths(pos)], tickfont=dict(size=10)),
        legend=dict(orientation="h", y=-0.02, yanchor="top", font=dict(size=11)),
        hoverlabel=dict(bgcolor="white", font=dict(size=12)),
    )
    return fig


def forest_height(pos: dict) -> int:
    """HEIGHT, or taller when the forest is deeper than it holds with labels apart."""
    return max(HEIGHT, 110 + DEPTH_PX * (len(_depths(pos)) - 1))


def _xrange(pos: dict) -> list[float]:
    """At least MIN_SLOTS wide, so a short chain is not stretched across the figure."""
    xs = [x for x, _ in pos.values()] or [0.0]
    mid, half = (min(xs) + max(xs)) / 2, max((max(xs) - min(xs)) / 2 + 0.7, MIN_SLOTS / 2)
    return [mid - half, mid + half]


def _depths(pos: dict) -> list[int]:
    return sorted({int(y) for _, y in pos.values()})


def _yrange(pos: dict) -> list[float]:
    deepest = min((y for _, y in pos.values()), default=0)
    return [deepest - 0.6, 0.5]
