"""Typed, frozen configuration of a drafter training run (``python -m engine train-draft``).

The defaults are the command line's; :mod:`engine.cli.train_draft` maps each flag to one field.
This module imports no torch, so the CLI can build its parser cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.errors import ConfigError
from engine.core.paths import ASSETS

OBJECTIVES = ("ce", "wordkd", "tvdkd", "seqkd", "atspeed_s", "atspeed_r")
BEAM_OBJECTIVES = ("seqkd", "atspeed_s", "atspeed_r")  # trained on the target's top-K beams
TEACHER_OBJECTIVES = ("wordkd", "tvdkd", "atspeed_s", "atspeed_r")  # need the target's p
FEATURES = ("paper", "confidence")  # predictor: hidden states only (EESD Eq. 5), or + confidence


@dataclass(frozen=True)
class DataConfig:
    """Which target-generated sequences the drafter trains and is evaluated on.

    Every `heldout_every`-th prompt is held out (greedy continuations only); each training
    prompt gets a greedy continuation plus `samples` hybrid sampled ones (the first
    `greedy_prefix` tokens greedy, LLM-QAT), or the target's top-`beams` beams for the beam
    objectives (AtSpeed §3.2, D' = TopK(M_p(x))). With `shards` the sequences come from token
    shards already generated (``selfgen``, the feature trainer's data) instead: every
    `heldout_every`-th prompt is held out with all its sequences (its greedy ones evaluated).
    """

    prompts: str = str(ASSETS / "train_prompts.txt")  # one prompt per line
    limit_prompts: int = 0  # use the first n (0 = all)
    heldout_every: int = 10
    max_new_tokens: int = 96
    samples: float = 1.0  # sampled continuations per prompt (0.5: for the first half)
    greedy_prefix: int = 4
    sample_temperature: float = 1.0
    beams: int = 4
    gen_batch: int = 16  # prompts per generate() call
    shards: str = ""  # a directory of token shards (train-feature's format) instead of prompts
    limit_tokens: int = 0  # with shards: sequences in shard order up to this many tokens (0 = all)

    def __post_init__(self) -> None:
        if self.heldout_every < 2:
            raise ConfigError("heldout_every must be >= 2 (one held-out prompt in n)")
        if self.limit_tokens < 0:
            raise ConfigError(f"limit_tokens must be >= 0, got {self.limit_tokens}")
        if self.limit_tokens and not self.shards:
            raise ConfigError("limit_tokens applies to token shards: give shards too")


@dataclass(frozen=True)
class DrafterTrainConfig:
    """Transformer^e training (EESD §3.1-3.2): objective, optimiser and held-out evaluation."""

    layers: int = 4  # N shared first layers
    objective: str = "ce"
    alpha: float = 0.5  # weight of the alignment term (AtSpeed Eq. 5 / 9)
    topk: int = 8  # K of the AtSpeed losses and of the top-K metrics
    epochs: int = 4
    lr: float = 3e-4
    batch_tokens: int = 2048  # padded tokens per optimiser step
    train_norm: bool = False  # train a copy of the final norm too
    shortlist: int = 8192  # head tokens (0 = the full vocabulary)
    eval_gamma: int = 4  # draft length of the greedy chain-SD replay

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"unknown objective '{self.objective}' "
                              f"(choose from {', '.join(OBJECTIVES)})")
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")

    @property
    def beam(self) -> bool:
        """Trained on the target's top-K beams."""
        return self.objective in BEAM_OBJECTIVES

    @property
    def teacher(self) -> bool:
        """Needs the target's distribution p at every training position."""
        return self.objective in TEACHER_OBJECTIVES


@dataclass(frozen=True)
class PredictorTrainConfig:
    """The Cali-TS predictor theta_M (EESD §3.3, Eq. 5) trained for one drafter."""

    epochs: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.1
    batch: int = 512
    prompts: str = str(ASSETS / "predictor_prompts.txt")  # '' = the drafter's training data
    features: str = "confidence"  # paper: hidden states only; confidence: + draft confidence

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"predictor epochs must be >= 1, got {self.epochs}")
        if self.features not in FEATURES:
            raise ConfigError(f"unknown predictor features '{self.features}' "
                              f"(choose from {', '.join(FEATURES)})")


@dataclass(frozen=True)
class TrainDraftConfig:
    """A whole run: the target, the three parts, where results go and what runs."""

    target: str = "embedded"
    device: str = "cpu"
    seed: int = 0
    threads: int = 0  # torch threads (0 = leave as configured)
    out: str = str(ASSETS / "drafter")  # weights, predictor and recipe.json
    work_dir: str = ""  # checkpoints and the token cache ('' = the model cache)
    no_progress: bool = False
    predictor_only: bool = False  # train only the predictor of the drafter already in out
    no_predictor: bool = False
    data: DataConfig = field(default_factory=DataConfig)
    drafter: DrafterTrainConfig = field(default_factory=DrafterTrainConfig)
    predictor: PredictorTrainConfig = field(default_factory=PredictorTrainConfig)

    def __post_init__(self) -> None:
        if self.predictor_only and self.no_predictor:
            raise ConfigError("predictor_only and no_predictor exclude each other")


WEIGHT_DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class FeatureTrainConfig:
    """A feature (EAGLE-style) drafter run (``python -m engine train-feature``): token shards
    in, fc + one decoder layer out (engine/training/feature.py)."""

    data: str = "/work/data/selfgen"  # a directory of *.jsonl token shards
    target: str = "embedded"
    device: str = "cpu"
    seed: int = 0
    threads: int = 1  # torch threads (0 = leave as configured)
    limit_tokens: int = 0  # use shards (in name order) up to about this many tokens (0 = all)
    heldout_every: int = 20  # every n-th prompt is held out with all its sequences
    epochs: int = 6
    lr: float = 5e-4
    weight_decay: float = 0.0
    batch_tokens: int = 2048  # padded tokens per optimiser step
    w_cls: float = 0.1  # weight of the token term (EAGLE: 0.1; regression: 1)
    objective: str = "ce"  # token term: ce (EAGLE), or an alignment mix (engine/training/losses)
    alpha: float = 0.5  # weight of the alignment term in the token term (AtSpeed Eq. 5 / 9)
    topk: int = 8  # K of the AtSpeed alignment losses
    noise: float = 0.1  # U(-noise, noise) x the features' RMS added to input features
    grad_clip: float = 0.5
    shortlist: int = 8192  # head tokens (0 = the full vocabulary)
    eval_steps: int = 4  # draft steps ahead in the held-out evaluation (= replay gamma)
    eval_sequences: int = 0  # held-out sequences evaluated (0 = all)
    weight_dtype: str = "float16"
    out: str = str(ASSETS / "feature_drafter")  # feature.safetensors + recipe.json
    work_dir: str = ""  # feature cache and checkpoints ('' = the model cache)
    no_progress: bool = False
    fresh: bool = False  # ignore a checkpoint of the same run
    init: str = ""  # a feature.safetensors to start from (its fc, layer and shortlist kept)

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if self.heldout_every < 2:
            raise ConfigError("heldout_every must be >= 2 (one held-out prompt in n)")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ConfigError(f"unknown weight dtype '{self.weight_dtype}' "
                              f"(choose from {', '.join(WEIGHT_DTYPES)})")
        if not 1 <= self.eval_steps <= 8:
            raise ConfigError(f"eval_steps must be in [1, 8], got {self.eval_steps}")
        if self.objective not in OBJECTIVES or self.objective == "seqkd":
            ok = ", ".join(o for o in OBJECTIVES if o != "seqkd")
            raise ConfigError(f"unknown feature objective '{self.objective}' (choose from {ok})")
        if self.topk < 1:
            raise ConfigError(f"topk must be >= 1, got {self.topk}")
