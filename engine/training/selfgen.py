"""Self-generated training data at scale: a prompt set assembled from local text (no download)
and the target's own continuations, generated in batches into resumable shards.

Prompts (:func:`build_prompts`, deterministic for a seed and a Python installation): open chat
requests from templates x topics, and input-grounded requests over text found on this machine
(functions of the Python standard library to document, type, explain, convert or fix; module
docstrings to summarise, simplify or query; synthetic records to convert or extract). The held-out
prompt sets (assets/heldout/) are handwritten and never enter this set, nor does any of their
instructions (tests/unit/test_selfgen.py checks the shipped set).

Continuations (:func:`generate_shards`): per prompt the target's greedy continuation plus
`samples` hybrid sampled ones (the first tokens greedy, then T = 1; LLM-QAT), batched with left
padding (a batch of 32 costs far less per token than 32 single runs). Shard k holds prompts
[k S, (k + 1) S) as JSON lines ``{"ids", "start", "kind"}``; an existing shard is skipped, so an
interrupted run resumes where it stopped.

Synthesised prompts (:func:`synth_prompts`, Magpie: Xu et al. 2024): the target itself writes
user requests when given only its chat template's text up to the user's turn (sampled at
T = 1, top-p 0.95), so open chat requests come in the target's own variety. Requests that
share any 6-word shingle with a held-out prompt (assets/heldout/) are dropped.

Beam sequences (``beams`` > 0): a share of the prompts also get the target's top-``beam_width``
beams (kind "beam"; AtSpeed's D' = TopK(M_p(x)) for beam-aligned drafters).

``python -m engine.training.selfgen prompts --out FILE`` writes the prompt set;
``python -m engine.training.selfgen synth --out FILE --n N`` writes synthesised prompts;
``python -m engine.training.selfgen generate --prompts FILE --out DIR`` fills the shards.
Every command takes ``--device`` (cuda: batches of 1024 cost about one batch-1 step each).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import random
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

TOPICS = """photosynthesis; the water cycle; volcanoes; black holes; the moon landing; the Roman
empire; ancient Egypt; the printing press; the steam engine; electricity; magnets; rainbows;
earthquakes; tides; the immune system; vaccines; sleep; exercise; healthy breakfast; coffee; tea;
chocolate; bread baking; composting; recycling; solar panels; wind turbines; electric cars;
bicycles; trains; airplanes; submarines; the internet; email; passwords; cloud computing;
databases; spreadsheets; machine learning; robots; video games; chess; football; tennis;
swimming; running a marathon; yoga; meditation; gardening; houseplants; bees; ants; dolphins;
elephants; penguins; owls; cats; dogs; horses; sharks; coral reefs; rainforests; deserts;
glaciers; mountains; rivers; oceans; the solar system; Mars; Jupiter; stars; comets; time
zones; calendars; money; saving money; budgeting; taxes; banks; interest rates; inflation;
job interviews; writing a resume; public speaking; teamwork; leadership; learning a language;
reading habits; libraries; museums; music; the piano; the guitar; painting; photography;
cooking pasta; making soup; pizza; salads; spices; food safety; first aid; fire safety;
camping; hiking; travel packing; maps; compasses; weather forecasts; clouds; snow; lightning;
climate; pollution; clean water; bridges; skyscrapers; roads; cities; villages; farming;
tractors; wheat; rice; potatoes; apples; bananas; honey; cheese; milk; eggs; friendship;
kindness; birthdays; holidays; weddings; moving house; cleaning a room; laundry; sewing;
knitting; woodworking; pottery; origami; kites; board games; puzzles; mathematics; fractions;
prime numbers; geometry; statistics; probability; algebra; physics; gravity; friction; sound;
light; heat; atoms; molecules; chemistry; acids and bases; plastics; glass; metals; paper;
the alphabet; poetry; novels; fairy tales; newspapers; radio; television; smartphones;
batteries; light bulbs; clocks; refrigerators; washing machines""".replace("\n", " ")

CHAT_TEMPLATES = [
    "Explain {t} in simple terms.", "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t}.", "What is the history of {t}? Keep it short.",
    "Write a haiku about {t}.", "Write a short poem about {t}.",
    "List five questions a child might ask about {t}.", "Why is {t} important?",
    "Describe {t} to someone who has never heard of it.",
    "Write a short story that involves {t}.", "What are common misconceptions about {t}?",
    "Give me a quick tip related to {t}.", "Summarize what you know about {t} in two sentences.",
    "Write a tweet about {t}.", "Write a short email to a friend about {t}.",
    "How would you teach {t} to a ten-year-old?", "What are the pros and cons of {t}?",
    "Compare {t} and {u}.", "What do {t} and {u} have in common?",
    "Write a dialogue between two people talking about {t}.",
    "Give me a fun quiz question about {t} with the answer.",
    "Write a product description for something related to {t}.",
    "What would happen in a world without {t}?", "Explain {t} in one sentence.",
    "Write a limerick about {t}.", "Give step-by-step advice for getting started with {t}.",
    "What careers are connected to {t}?", "Write a short motivational message about {t}.",
    "Tell me a joke about {t}.", "Create a short lesson plan about {t}.",
    "What are three safety tips related to {t}?", "Write a news headline about {t}.",
    "Describe a day in the life of someone who works with {t}.",
    "What are the main parts of {t}?", "How has {t} changed over the last hundred years?",
]

CODE_TASKS = [
    "Write a docstring for the following Python function and show the function with it:",
    "Add type hints to this Python function and return the whole function:",
    "Explain what this Python function does:",
    "Rewrite this Python function with a comment on each step:",
    "Convert this Python function to JavaScript:",
    "Rename the variables in this Python function to clearer names and return the function:",
    "Write two unit tests for this Python function:",
    "Is there a possible bug in this Python function? Explain briefly.",
    "Simplify this Python function and return it:",
]

TEXT_TASKS = [
    "Summarize the following text in two sentences:",
    "Rewrite this text in simpler words:",
    "Turn this text into a bulleted list of its main points:",
    "List the technical terms used in this text:",
    "Read the passage and answer: what is it about?",
    "Write a title for this text:",
    "Translate this text into French:",
    "Rewrite this text in a friendly tone:",
    "Correct any grammar or spelling mistakes in this text and return it:",
]

NAMES = ("Ana Silva; Ben Okafor; Chen Wei; Dana Levi; Elif Kaya; Farid Haddad; Greta Olsen; "
         "Hiro Tanaka; Ines Duarte; Jonas Berg; Kofi Mensah; Lena Novak; Mateo Cruz; Nadia Petrov; "
         "Omar Aziz; Priya Nair; Quinn Walsh; Rosa Marin; Sami Laine; Tara Singh").split("; ")
PLACES = ("Porto; Accra; Osaka; Tallinn; Cusco; Perth; Bergen; Izmir; Quito; Graz; Hanoi; "
          "Malmo; Recife; Kyoto; Dakar; Leeds; Turin; Cork").split("; ")
ITEMS = ("laptop; desk lamp; backpack; kettle; headphones; bicycle helmet; notebook; "
         "water bottle; office chair; phone case; printer paper; coffee beans").split("; ")

DATA_TASKS = [
    "Express this Python dict as JSON text:", "Express this Python dict as YAML:",
    "Turn this Python dictionary into a Markdown table:",
    "Write one sentence describing this record:",
]
MESSAGE_TASKS = [
    "Extract the name, the city, the item and the amount from this message as JSON:",
    "Extract the date and the amount from this message:",
    "Rewrite this message as a formal letter:",
    "Reply politely to this message:",
]


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))


@functools.lru_cache(maxsize=1)
def _material() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The code and text material of this Python's standard library (``_functions``,
    ``_docstrings``), each file parsed once per process."""
    funcs: list[str] = []
    docs: list[str] = []
    for path in _stdlib_files():
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        funcs += _functions(src, tree)
        docs += _docstrings(tree)
    return tuple(funcs), tuple(docs)


def _functions(src: str, tree: ast.Module) -> list[str]:
    """Top-level functions and methods of 5-22 lines, without their docstrings' bulk."""
    out = []
    lines = src.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.end_lineno:
            body = lines[node.lineno - 1: node.end_lineno]
            if 5 <= len(body) <= 22 and max(len(b) for b in body) <= 100:
                indent = len(body[0]) - len(body[0].lstrip())
                out.append("\n".join(b[indent:] for b in body))
    return out


def _docstrings(tree: ast.Module) -> list[str]:
    """First paragraphs (200-900 characters) of module and class docstrings."""
    out = []
    for node in [tree] + [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        doc = ast.get_docstring(node) or ""
        for para in doc.split("\n\n"):
            para = " ".join(para.split())
            if 200 <= len(para) <= 900 and ">>>" not in para:
                out.append(para)
    return out


def _record(rng: random.Random) -> dict:
    return {"name": rng.choice(NAMES), "city": rng.choice(PLACES),
            "order": rng.randint(1000, 99999), "item": rng.choice(ITEMS),
            "quantity": rng.randint(1, 9), "price": round(rng.uniform(3, 900), 2)}


def _message(rng: random.Random) -> str:
    r = _record(rng)
    day, month = rng.randint(1, 28), rng.choice(["March", "June", "October", "December"])
    return (f"Hi, this is {r['name']} from {r['city']}. On {month} {day} I ordered a "
            f"{r['item']} (order {r['order']}) and paid {r['price']} euros, but it has not "
            f"arrived yet. Could you check what happened?")


def build_prompts(seed: int = 0, chat: int = 2500, code: int = 1500, text: int = 1200,
                  data: int = 600) -> list[str]:
    """A deterministic prompt set (for one seed and one Python installation), shuffled."""
    rng = random.Random(seed)
    topics = [t.strip() for t in TOPICS.split(";") if t.strip()]
    prompts = set()
    while len(prompts) < chat:
        t, u = rng.sample(topics, 2)
        prompts.add(rng.choice(CHAT_TEMPLATES).format(t=t, u=u))
    funcs, docs = map(list, _material())
    rng.shuffle(funcs)
    rng.shuffle(docs)
    out = sorted(prompts)
    out += [f"{rng.choice(CODE_TASKS)}\n\n{f}" for f in funcs[:code]]
    out += [f"{rng.choice(TEXT_TASKS)}\n\n{d}" for d in docs[:text]]
    for i in range(data):
        if i % 2:
            out.append(f"{rng.choice(DATA_TASKS)}\n\n{_record(rng)}")
        else:
            out.append(f"{rng.choice(MESSAGE_TASKS)}\n\n{_message(rng)}")
    rng.shuffle(out)
    return out


def shingles(text: str, n: int = 6) -> set[tuple[str, ...]]:
    """The word n-grams of a text (lower case, letters and digits only)."""
    words = "".join(c.lower() if c.isalnum() else " " for c in text).split()
    return {tuple(words[i: i + n]) for i in range(max(0, len(words) - n + 1))} or {tuple(words)}


def heldout_texts(directory: Path | None = None) -> list[str]:
    """Every prompt of the held-out sets (assets/heldout/*.jsonl)."""
    from engine.core.paths import ASSETS

    d = Path(directory) if directory else ASSETS / "heldout"
    return [json.loads(ln) for f in sorted(d.glob("*.jsonl"))
            for ln in f.read_text().splitlines() if ln.strip()]


def keep_request(text: str, held: set, seen: set) -> bool:
    """A synthesised request is kept when it is 12..600 characters, new (case and spacing
    ignored) and shares no 6-word shingle with a held-out prompt."""
    key = " ".join(text.lower().split())
    if not 12 <= len(key) <= 600 or key in seen or shingles(text) & held:
        return False
    seen.add(key)
    return True


def query_prefix(tok) -> str:
    """The chat template's text up to where the user's request starts."""
    marker = "\x00MAGPIE\x00"
    text = tok.apply_chat_template([{"role": "user", "content": marker}], tokenize=False,
                                   add_generation_prompt=False)
    return text[: text.index(marker)]


def synth_prompts(n: int, *, target: str = "embedded", device: str = "cpu", batch: int = 256,
                  max_tokens: int = 96, seed: int = 0, log=print) -> tuple[list[str], dict]:
    """n user requests written by the target from its bare pre-query template (Magpie), and
    counts of what was dropped."""
    import torch

    from engine.core.eos import eos_ids
    from engine.training.data import hf_generate
    from engine.training.run import TrainDraftConfig, load_frozen_target

    pair = load_frozen_target(TrainDraftConfig(target=target, device=device))
    tok, eos = pair.tokenizer, eos_ids(pair.target)
    prefix = tok(query_prefix(tok), add_special_tokens=False)["input_ids"]
    held = set().union(*(shingles(t) for t in heldout_texts()))
    seen: set = set()
    out: list[str] = []
    drop = {"unfinished": 0, "rejected": 0}
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    while len(out) < n:
        news, _ = hf_generate(pair.target, [prefix] * batch, eos, min(eos), None,
                              do_sample=True, temperature=1.0, top_p=0.95, top_k=0,
                              max_new_tokens=max_tokens)
        for row in news:
            if not row or row[-1] not in eos:
                drop["unfinished"] += 1
                continue
            text = tok.decode(row[:-1], skip_special_tokens=True).strip()
            if keep_request(text, held, seen):
                out.append(text)
            else:
                drop["rejected"] += 1
        log(f"{len(out)}/{n} requests ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out[:n], drop


def sampled_prompts(prompts: list, share: float) -> list:
    """The prompts that also get a sampled continuation: a share in [0, 1] of them, evenly
    spread (prompt i when floor((i + 1) share) steps up)."""
    s = min(max(share, 0.0), 1.0)
    return [p for i, p in enumerate(prompts) if int((i + 1) * s) > int(i * s)]


@dataclass(frozen=True)
class SelfGenConfig:
    """One self-generation run."""

    prompts: str
    out: str
    target: str = "embedded"
    shard_prompts: int = 64  # prompts per shard (one shard = one resumable unit)
    batch: int = 32  # prompts per generate() call
    max_new_tokens: int = 160
    max_prompt_tokens: int = 384  # longer prompts are skipped
    samples: float = 0.5  # share of prompts that also get one sampled continuation (<= 1)
    greedy_prefix: int = 4
    seed: int = 0
    threads: int = 1  # torch threads (0 = leave as configured)
    device: str = "cpu"
    beams: float = 0.0  # share of prompts that also get the target's top-beam_width beams
    beam_width: int = 4


def generate_shards(cfg: SelfGenConfig, *, log=print) -> dict:
    """Fill cfg.out with shard-NNNNN.jsonl files; returns token counts of this run."""
    import torch

    from engine.core.eos import eos_ids
    from engine.run.api import encode_prompt
    from engine.training.data import generate_examples
    from engine.training.run import TrainDraftConfig, load_frozen_target

    if cfg.threads:  # 0 = leave as configured
        torch.set_num_threads(cfg.threads)
    texts = [json.loads(ln) for ln in Path(cfg.prompts).read_text().splitlines() if ln.strip()]
    pair = load_frozen_target(TrainDraftConfig(target=cfg.target, device=cfg.device))
    eos = eos_ids(pair.target)
    pad = pair.target.generation_config.pad_token_id
    pad = pad if pad is not None else min(eos)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.__dict__, indent=1) + "\n")
    shards = (len(texts) + cfg.shard_prompts - 1) // cfg.shard_prompts
    made = {"shards": 0, "sequences": 0, "generated_tokens": 0}
    t0 = time.perf_counter()
    for k in range(shards):
        path = out / f"shard-{k:05d}.jsonl"
        if path.is_file():
            continue
        chunk = texts[k * cfg.shard_prompts: (k + 1) * cfg.shard_prompts]
        ids = [encode_prompt(pair, t) for t in chunk]
        ids = [p for p in ids if len(p) <= cfg.max_prompt_tokens]
        kw = dict(batch=cfg.batch, eos=eos, pad=pad)
        with torch.no_grad():
            exs = generate_examples(pair.target, ids, "greedy", cfg.max_new_tokens, **kw)
            chosen = sampled_prompts(ids, cfg.samples)
            torch.manual_seed(cfg.seed * 100003 + k)
            exs += generate_examples(pair.target, chosen, "sample", cfg.max_new_tokens,
                                     greedy_prefix=cfg.greedy_prefix, **kw)
            if cfg.beams > 0:
                kw["batch"] = max(1, cfg.batch // cfg.beam_width)  # rows = prompts x width
                exs += generate_examples(pair.target, sampled_prompts(ids, cfg.beams), "beam",
                                         cfg.max_new_tokens, beams=cfg.beam_width, **kw)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps({"ids": e.ids, "start": e.start, "kind": e.kind}) + "\n"
                               for e in exs))
        os.replace(tmp, path)
        new = sum(len(e.ids) - e.start for e in exs)
        made["shards"] += 1
        made["sequences"] += len(exs)
        made["generated_tokens"] += new
        rate = made["generated_tokens"] / (time.perf_counter() - t0)
        log(f"shard {k + 1}/{shards}: {len(exs)} sequences, {new} tokens; "
            f"this run {made['generated_tokens']} tokens at {rate:.0f} tokens/s", flush=True)
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.training.selfgen")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="write the prompt set (JSON lines)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("synth", help="write requests the target writes itself (Magpie)")
    s.add_argument("--out", required=True)
    s.add_argument("--n", type=int, required=True)
    s.add_argument("--target", default="embedded")
    s.add_argument("--device", default="cpu")
    s.add_argument("--batch", type=int, default=256)
    s.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("generate", help="fill the shards (resumes)")
    for f in SelfGenConfig.__dataclass_fields__.values():
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("prompts", "out"):
            g.add_argument(flag, required=True)
        else:
            g.add_argument(flag, type=type(f.default), default=f.default)
    a = ap.parse_args(argv)
    if a.cmd == "prompts":
        prompts = build_prompts(a.seed)
        Path(a.out).write_text("".join(json.dumps(t) + "\n" for t in prompts))
        print(f"{len(prompts)} prompts -> {a.out}")
        return 0
    if a.cmd == "synth":
        texts, drop = synth_prompts(a.n, target=a.target, device=a.device, batch=a.batch,
                                    seed=a.seed)
        Path(a.out).write_text("".join(json.dumps(t) + "\n" for t in texts))
        print(json.dumps({"requests": len(texts), **drop, "out": a.out}))
        return 0
    cfg = SelfGenConfig(**{k: v for k, v in vars(a).items() if k != "cmd"})
    print(json.dumps(generate_shards(cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
