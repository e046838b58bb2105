"""Shared fixtures: tiny seeded model pairs on the CPU and the embedded model (loaded once)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections import Counter

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# one thread, and no thread measurement (engine.kernels.threads): tiny models gain nothing from
# OpenMP and lose a lot when the two pytest workers of make test share the cores
os.environ.setdefault("SPECVIZ_THREADS", "1")
# a tune stored on this machine never changes what the tests run (engine.run.tuned)
os.environ["SPECVIZ_TUNED"] = tempfile.mkdtemp(prefix="specviz-tuned-")
# nor do cost profiles stored by earlier runs: every test's switch measures its own
# (engine.run.profile_store; tests/unit/test_profile_store.py turns the store on)
os.environ["SPECVIZ_PROFILES"] = "off"
# compiled steps start from an empty store of this process's own: a test compiles each step
# shape once and later tests load it, never a step stored by an earlier run
# (engine.execution.step_store; tests/model/test_step_store.py)
os.environ["SPECVIZ_STEPS"] = tempfile.mkdtemp(prefix="specviz-steps-")
atexit.register(shutil.rmtree, os.environ["SPECVIZ_STEPS"], True)  # ~4 MB a step
torch.set_num_threads(1)


def tiny_pair(family="llama", vocab_size=64, layers=4, draft=None, early_exit_layers=2,
              seed=0, **kw):
    """A tiny random target (and drafter) built from a config: fast, deterministic."""
    import engine
    from engine.run.models import model_from_config, tiny_config

    target = model_from_config(tiny_config(family, vocab_size=vocab_size, layers=layers, **kw),
                               seed=seed)
    return engine.load_pair(target=target, draft=draft, device="cpu",
                            early_exit_layers=early_exit_layers)


def counting_tokenizer(vocab_size: int):
    """An IdTokenizer that lists in ``calls`` each id it decodes alone."""
    from engine.run.inputs import IdTokenizer

    class Counting(IdTokenizer):
        def __init__(self, size: int):
            super().__init__(size)
            self.calls: list[int] = []

        def decode(self, ids):
            if len(ids) == 1:
                self.calls.append(int(ids[0]))
            return super().decode(ids)

    return Counting(vocab_size)


def perturbed_exit_layer(target, n_layers, seed=0, scale=0.05):
    """An early-exit extra layer that differs from the target's last one (a stand-in for a
    trained Transformer^e): its init plus scale * N(0, 1) noise from a seeded generator."""
    from engine.drafters.early_exit import init_extra_layer

    layer = init_extra_layer(target, n_layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return layer


@pytest.fixture(scope="session")
def embedded_pair():
    """The default target (on a CPU the embedded GGUF as shipped, embedded-q4:a8) with its
    early-exit drafter (the shipped trained one), named explicitly: the target's default
    drafter is another (default_draft)."""
    import engine

    return engine.load_pair(draft="early-exit", device="cpu")


@pytest.fixture(scope="session")
def fp32_pair():
    """The fp32 embedded model (the GGUF's weights dequantised) with its early-exit drafter:
    the reference the packed targets are bounded against."""
    import engine

    return engine.load_pair("embedded", draft="early-exit", device="cpu")


def pytest_collection_modifyitems(config, items):
    """Files with statistical (``slow``) tests first, the most such tests first, the others
    in collection order. make test hands whole files to two workers as each frees up
    (scripts/test.sh); xdist's own order (most tests first) put the law files, a few tests of
    30-50 s each, last, where one worker ran them while the other had nothing left."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    rank = {path: i for i, path in enumerate(sorted(slow, key=lambda p: (-slow[p], str(p))))}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))  # stable: a file's own order


STATS_SUMMARY: list[str] = []  # sample sizes and powers of the statistical tests (tests/stats.py)


class _StatsLines:
    """A test's summary lines, kept as its report's user properties: a report reaches the
    process that prints the summary, whether or not the tests ran in worker processes."""

    def __init__(self, node) -> None:
        self.node = node

    def append(self, line: str) -> None:
        self.node.user_properties.append(("stats", line))


@pytest.fixture
def stats_summary(request) -> _StatsLines:
    """Lines a statistical test adds (its N and power); printed at the end of the run."""
    return _StatsLines(request.node)


def pytest_runtest_logreport(report):
    if report.when == "call":
        STATS_SUMMARY.extend(v for k, v in report.user_properties if k == "stats")


def pytest_terminal_summary(terminalreporter):
    if STATS_SUMMARY:
        terminalreporter.section("statistical tests: sample size N and power")
        for line in STATS_SUMMARY:
            terminalreporter.write_line(line)


def near_perfect_feature_parts(target, eps=0.0, seed=0):
    """Feature-drafter parts that copy a ONE-layer target: fc = [I | eps * N(0, 1)] (so
    x_j = e(t_j) + eps * R f_{j-1}) and the target's own layer. With eps = 0 the draft state
    is the target's pre-norm state, whose argmax under the head is the target's (an RMSNorm
    with unit weight only rescales): every greedy draft is accepted. eps > 0 lets the
    (true or predicted) feature move the draft: some drafts fail."""
    from engine.drafters.feature import FeatureParts

    parts = FeatureParts(target)
    d = int(target.config.hidden_size)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        parts.fc.weight.zero_()
        parts.fc.weight[:, :d] = torch.eye(d)
        parts.fc.weight[:, d:] = eps * torch.randn((d, d), generator=gen)
        parts.layer.load_state_dict(target.model.layers[-1].state_dict())
    return parts
