"""Sibling products: the packed linears of a block that read one input run as one product.

A stock decoder layer calls its attention's q, k and v projections on the same normed hidden
state, and its MLP's gate and up projections on the same input: five of a layer's seven
products, 150 of the embedded model's 210 calls a step, each paying its call, its activation
quantisation and its own pass over the activations. :func:`fuse_siblings` stacks each set's
Q4_1 tiles into one weight (qmm's layout is tile-major, so each member's buffers become row
slices of the stacked ones: views, no copy kept) and points every member at a
:class:`SiblingProduct`. A member's forward then takes its columns of the one product:

- eagerly, the product is computed once per input: the group keeps its last input (the same
  tensor object, unchanged since: its version counter; the same width, padding and weights)
  and the columns its members have not taken, each member taking its own once (an input it
  has not seen, or a member asking twice, computes afresh: never a stale or shared output);
- under ``torch.compile`` every member calls the op on the stacked weight (a traced graph
  keeps no state between calls), and :class:`SiblingCSE`, an inductor pass over the
  post-grad graph, merges those identical calls into one where nothing writes their inputs
  in between.

Every output column is qmm.c's product of its own weight row with the row's quantised
activations, whatever else the product computes (the kernel's tiles are independent), so a
member gives the bits it gave alone (tested). The stock modeling code is not touched: only
which module computes a product changes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass

from engine.kernels import qmm

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # sets read one input


class SiblingProduct:
    """The stacked Q4_1 weight of sibling layers (qw, dw, mw in qmm's layout, ``n`` rows) and,
    eagerly, the columns of the last product its members have not taken yet."""

    def __init__(self, layers: list[nn.Module]):
        self.qw = torch.cat([m.qw for m in layers])  # (sum of out / 16 * in / G * 256,)
        self.dw = torch.cat([m.dw for m in layers])  # (sum of out / 16, in / G, 16)
        self.mw = torch.cat([m.mw for m in layers])
        self.n = sum(m.out_features for m in layers)
        self.spans: list[tuple[int, int]] = []  # (first column, width) of each member
        self._last: tuple | None = None  # (input, its key, {first column: columns untaken})
        start = 0
        for m in layers:  # each member's buffers: its rows of the stacked ones (views)
            tiles, size = m.out_features // qmm.TILE, m.qw.numel()
            t0, q0 = start // qmm.TILE, start // qmm.TILE * (size // tiles)
            m.qw, m.dw, m.mw = (self.qw[q0:q0 + size], self.dw[t0:t0 + tiles],
                                self.mw[t0:t0 + tiles])
            m.siblings, m.sibling_start = self, start
            m._sibling_views = (m.qw, m.dw, m.mw)  # a buffer assigned anew leaves the set
            self.spans.append((start, m.out_features))
            start += m.out_features

    @staticmethod
    def holds(m: nn.Module) -> bool:
        """Whether member `m` still computes from the stack (its buffers are the views it was
        given: a buffer assigned anew, e.g. ``load_state_dict(assign=True)``, is its own)."""
        views = m._sibling_views
        return m.qw is views[0] and m.dw is views[1] and m.mw is views[2]

    def columns(self, m: nn.Module, x: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """(R, out) member `m`'s columns of the stacked product of ``flat`` (x as (R, in)).
        Eagerly each product serves each member once: a member takes its columns (a tensor of
        its own where R > 1, disjoint views where R = 1), and a product is reused only for the
        same input object with the same key (x's version, the activation width, this thread's
        padding, the stacked weights' versions); an inference tensor, which keeps no version,
        computes alone."""
        a, w = m.sibling_start, m.out_features
        if torch.compiler.is_compiling():  # merged by SiblingCSE
            return qmm.matmul(flat, self.qw, self.dw, self.mw, self.n, m.bits)[:, a:a + w]
        if x.is_inference():
            return qmm.matmul(flat, m.qw, m.dw, m.mw, w, m.bits)  # (R, out)
        key = (x._version, m.bits, qmm.padding(), self.qw._version, self.dw._version,
               self.mw._version)
        last = self._last  # one read: another thread may replace it
        out = None
        if last is not None and last[0] is x and last[1] == key:
            out = last[2].pop(a, None)
            if not last[2] and self._last is last:
                self._last = None  # every member served: the input and product let go
        if out is None:
            y = qmm.matmul(flat, self.qw, self.dw, self.mw, self.n, m.bits)  # (R, n)
            many = y.shape[0] > 1
            cols = {s: (y[:, s:s + n].contiguous() if many else y[:, s:s + n])
                    for s, n in self.spans}  # (R, width) each
            out = cols.pop(a)
            self._last = (x, key, cols)
        return out


def fuse_siblings(model: nn.Module, layer_type: type) -> int:
    """Point each set of SIBLINGS inside `model` that are `layer_type` layers (packed4's
    Packed4Linear: its caller names it, as packed4 imports this module) of one input width,
    activation width and device, with no bias and in no set yet, at one
    :class:`SiblingProduct`; return how many sets."""
    fused = 0
    for parent in model.modules():
        for names in SIBLINGS:
            layers = [parent._modules.get(name) for name in names]  # its children
            if not all(isinstance(m, layer_type) and m.bias is None and m.siblings is None
                       for m in layers):
                continue
            if len({(m.in_features, m.bits, m.qw.device) for m in layers}) != 1:
                continue
            SiblingProduct(layers)
            fused += 1
    return fused


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose memory `node` views (itself where it is not a view)."""
    while node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and \
            node.args and isinstance(node.args[0], torch.fx.Node) and \
            any(r.alias_info is not None for r in node.target._schema.returns):
        node = node.args[0]
    return node


def _written(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The bases of the arguments `node` writes in place."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return []
    out = []
    for i, arg in enumerate(target._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if isinstance(value, torch.fx.Node):
                out.append(_base(value))
    return out


class SiblingCSE(CustomGraphPass):
    """Inductor's post-grad custom pass (``post_grad_custom_post_pass``): merges identical
    ``specviz::qmm`` calls (the same argument nodes, none of whose memory is written between
    them) and the identical views they read, so a traced layer's sibling products run once.
    A CustomGraphPass: ``uuid`` keys inductor's cache, ``repr`` the step store's."""

    VERSION = 1

    def __call__(self, graph: torch.fx.Graph) -> None:
        views = {torch.ops.aten.view.default, torch.ops.aten.reshape.default,
                 torch.ops.aten._unsafe_view.default}
        op = torch.ops.specviz.qmm.default
        writes: dict[torch.fx.Node, int] = {}  # base -> writes so far
        seen: dict[tuple, tuple[torch.fx.Node, tuple]] = {}
        for node in list(graph.nodes):
            for base in _written(node):
                writes[base] = writes.get(base, 0) + 1
            if node.op != "call_function" or node.target not in views | {op}:
                continue
            key = (node.target, node.args, tuple(sorted(node.kwargs.items())))
            try:
                hash(key)
            except TypeError:  # an argument FX keeps unhashable: left alone
                continue
            state = tuple(writes.get(_base(a), 0) for a in node.args
                          if isinstance(a, torch.fx.Node))
            first = seen.get(key)
            if first is not None and (node.target is not op or first[1] == state):
                node.replace_all_uses_with(first[0])
                graph.erase_node(node)
            else:
                seen[key] = (node, state)

    def uuid(self) -> str:
        return f"specviz-sibling-cse-{self.VERSION}"

    def __repr__(self) -> str:
        return f"SiblingCSE({self.VERSION})"
