"""Check exactness in the product: a method against its reference on the user's prompt and pair.

Temperature 0, or a method that ignores temperature (``MethodSpec.samples`` False: greedy, beam,
atspeed_strict): the method's output against its reference generate() call
(``MethodSpec.reference_call``: greedy, or beam search of the same width),
token by token, beams with their scores; the first divergence comes with the target's top-2
margin there.

Temperature > 0: N seeded runs (seeds 0..N-1) against the target's exact law, computed from
its logits with the run's warp. Token methods: the first emitted token, or the first two where
the warped support has at most PAIR_LIMIT pairs. Beam methods: after one step, the first token
of every output beam (a layer's beams are i.i.d. draws from the beam law, which is the warped
p at the first step). Pearson's chi-square, cells with expected count < 5 merged into one.
N is the smallest in [min_runs, max_runs] (a multiple of 10) whose test at ``alpha`` rejects
with probability >= ``power`` (noncentral chi-square) each of two wrong laws: the drafter's
warped q (a rule that ignores p; the drafter's model logits, for ``--draft feature`` its
logits with the target's true features, or for ``--draft ngram``
``engine.drafters.ngram.ngram_law`` over the prompt, p where it proposes nothing; for
``--draft ngram+feature`` the lookup's law where it matches, else the feature's) and the TV-0.1
mixture of p towards uniform. A token the law gives probability 0 fails the check outright.
Approximate methods (``MethodSpec.exact`` False) get the observed TV distance, not a verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.check.result import CheckConfig, CheckResult
from engine.check.stats import Progress
from engine.core.errors import ConfigError

if TYPE_CHECKING:
    from engine.run.inputs import Settings


def run_check(pair, prompt, method: str | Settings, *, raw: bool = False,
              config: CheckConfig = CheckConfig(), progress: Progress | None = None,
              **params: Any) -> CheckResult:
    """Check one method on one prompt and pair (see the module docstring).

    method, params: as for engine.generate: a name and its parameters (settled here; the
        pair's tuned settings fill the ones not given, as in a run), or settled Settings.
    """
    from engine.check.runs import check_identical, check_law
    from engine.run.api import encode_prompt, settings_of

    settings = settings_of(pair, method, params)
    full, spec = settings.params, settings.spec
    spec.make(full)  # cross-parameter checks (e.g. beam sampling needs temperature > 0)
    ids = encode_prompt(pair, prompt, raw)
    report = progress or (lambda done, total, message: None)
    if full["temperature"] == 0 or not spec.samples:
        return check_identical(pair, ids, spec, full, report)
    if config.alpha <= 0 or config.alpha >= 1:
        raise ConfigError(f"alpha must be in (0, 1), got {config.alpha}")
    if config.runs is not None and config.runs < 2:
        raise ConfigError(f"runs must be >= 2, got {config.runs}")
    return check_law(pair, ids, spec, full, config, report)
