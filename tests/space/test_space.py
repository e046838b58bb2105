"""A Hugging Face Space, simulated: ``python app.py`` from a copy of the repository's files
with the variables a CPU Space sets, a fresh model cache and a free port; the page must answer
HTTP 200 and one Run on the default pair (the embedded GGUF as shipped, converted and its
kernels built on this first start into the fresh cache) must succeed through gradio_client. The
server is killed at the end. SPECVIZ_KV=dynamic keeps the app's steps eager here: a Space would
compile them in the background (tests/ui/test_model_thread.py tests that warm-up), minutes of a
core the suite does not spend twice.

A Space installs only ``pip install -r requirements.txt``. The app runs in the suite's own
environment (requirements-dev.txt: requirements.txt plus the test tools), and a thread beside it
writes the file of every module the process has held (``sys.modules``, at start and through the
Run); each file in site-packages must belong to a distribution that requirements.txt installs
(its lines, then each installed distribution's own requirements, markers and extras followed),
installed at a version every requirement on it allows. Until 2026-12-07 the suite built a fresh
environment from requirements.txt alone instead: 60-80 s of a 2-core machine's suite on each
clean machine. What that saw and this does not: the versions pip picks for requirements.txt
alone (here they are resolved beside the test tools), a venv's bundled pip installing the file
(setup.sh's newest pip installs it, through requirements-dev.txt: a line pip cannot install
fails there), and imports in the app's child processes (today only the C compiler).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from engine.run.specs import EMBEDDED_DEFAULT_DRAFT
from specviz.render import OUTPUTS
from tests.ui.helpers import free_port

pytestmark = [pytest.mark.space, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
REPO = Path(__file__).resolve().parents[2]
SPACE_ENV = {  # what a CPU Space's settings hold (README, "Host it on a Space")
    "GRADIO_SERVER_NAME": "0.0.0.0", "SPECVIZ_DEVICE": "cpu",  # no SPECVIZ_TARGET: the
    "SPECVIZ_PRESETS": "embedded-q4-a8,embedded,tiny", "SPECVIZ_ALLOW_CUSTOM_MODELS": "0",
    "SPECVIZ_KV": "dynamic",  # device's default target, embedded-q4:a8
}
START_S = 180  # imports, then the page; the model loads (and converts) on the first Run


def requirements(path: Path = REPO / "requirements.txt") -> list[Requirement]:
    """requirements.txt's requirements (comments and pip's per-line options dropped)."""
    lines = (line.split("#")[0].split(" --")[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def installed_closure(reqs: list[Requirement]) -> dict[str, list[Requirement]]:
    """Every distribution that installing reqs installs, by canonical name, with every
    requirement on it: reqs, then each installed distribution's own requirements
    (Requires-Dist), markers evaluated with the extras asked for."""
    seen: dict[str, list[Requirement]] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are in
    todo = [(r, "") for r in reqs]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        seen.setdefault(name, []).append(req)
        for ex in ["", *sorted(req.extras)]:  # its base requirements, then each extra's
            if (name, ex) not in done:
                done.add((name, ex))
                todo += [(Requirement(r), ex) for r in metadata.requires(req.name) or []]
    return seen


# app.py run as __main__, with a thread that writes to argv[1], every half second, the time and
# {module: file} of every module sys.modules has held so far (an import that failed is never
# there; a namespace package has no file)
WATCHED = """
import json, os, runpy, sys, threading, time, traceback
out = sys.argv.pop(1)
def watch():
    held = {}
    while True:
        time.sleep(0.5)
        try:
            for n, m in list(sys.modules.items()):
                held.setdefault(n, getattr(m, "__file__", None))
            with open(out + ".tmp", "w") as f:
                json.dump({"t": time.time(), "modules": held}, f, default=str)
            os.replace(out + ".tmp", out)
        except Exception:
            traceback.print_exc()
threading.Thread(target=watch, daemon=True).start()
sys.argv[0] = "app.py"
runpy.run_path("app.py", run_name="__main__")
"""


def installed_files() -> dict[str, str]:
    """Each installed file (its normalised path) -> its distribution's canonical name."""
    owner = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for f in dist.files or []:
            owner[os.path.normpath(dist.locate_file(f))] = name
    return owner


def in_site(loaded: dict[str, str | None], site: Path) -> dict[str, str]:
    """module -> its normalised file, for each loaded module whose file lies in site
    (site-packages; not the standard library's, the app's own, a built-in or a namespace)."""
    site_dir = os.path.normpath(site) + os.sep
    files = {m: os.path.normpath(f) for m, f in loaded.items() if f}
    return {m: f for m, f in files.items() if f.startswith(site_dir)}


def modules_outside(loaded: dict[str, str | None], closure: dict, site: Path) -> dict[str, str]:
    """module -> the distribution its file belongs to ("?": none), for each loaded module
    whose file lies in site and is not a file of a distribution in closure."""
    owner = installed_files()
    return {m: owner.get(f, "?") for m, f in in_site(loaded, site).items()
            if owner.get(f) not in closure}


def test_the_closure_follows_requirements_their_extras_and_markers():
    """The closure walk: requests brings in its dependencies, a marker false here drops one,
    an extra brings in its own (safetensors[torch]: torch), and a loaded module of a
    distribution outside it (pytest, from requirements-dev.txt) is named, a standard or local
    module is not."""
    import _pytest
    import requests
    import urllib3

    import engine

    closure = installed_closure([Requirement("requests"),
                                 Requirement('numpy; python_version < "3"')])
    assert {"requests", "urllib3", "idna", "certifi"} <= set(closure)
    assert "numpy" not in closure
    assert "torch" in installed_closure([Requirement("safetensors[torch]")])
    assert "torch" not in installed_closure([Requirement("safetensors")])
    loaded = {m.__name__: m.__file__ for m in (requests, urllib3, json, _pytest, engine)}
    loaded["backports"] = None  # a namespace package
    site = Path(requests.__file__).parents[1]
    assert modules_outside(loaded, closure, site) == {"_pytest": "pytest"}


def test_the_suites_environment_holds_versions_every_requirement_allows():
    """Each distribution of requirements.txt's closure is installed here at a version that
    each requirement on it allows (requirements.txt's own line and every other's)."""
    closure = installed_closure(requirements())
    assert "torch==2.13.0" in map(str, closure["torch"])  # the file's own line among them
    for name, reqs in closure.items():
        version = metadata.version(name)
        for req in reqs:
            assert req.specifier.contains(version, prereleases=True), (name, version, str(req))


def copy_repo(dest: Path) -> Path:
    """The repository's files as a Space holds them: tracked and new, not ignored ones."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def wait_for_page(url: str, proc: subprocess.Popen, log: Path) -> int:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"app.py exited:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status
        except OSError:
            time.sleep(1)
    raise AssertionError(f"no page after {START_S} s:\n{log.read_text()[-3000:]}")


def test_a_space_serves_the_app_runs_the_default_pair_and_loads_only_requirements_txt(
        tmp_path):
    from gradio_client import Client

    app_dir = copy_repo(tmp_path / "space")
    port, log, modules_file = free_port(), tmp_path / "app.log", tmp_path / "modules.json"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "HOME": str(tmp_path / "home"), "SPECVIZ_CACHE": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "GRADIO_SERVER_PORT": str(port),
           **SPACE_ENV}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", WATCHED, str(modules_file)],
                                cwd=app_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        assert wait_for_page(url, proc, log) == 200
        client = Client(url, verbose=False)
        out = client.predict(prompt="What is the capital of France?", method="sd",
                             target="embedded-q4:a8", draft=EMBEDDED_DEFAULT_DRAFT,  # Draft
                             p_max_new_tokens=8,  # box's value: the host's default drafter
                             api_name="/run")
        run_md = dict(zip(OUTPUTS, out))["run_md"]
        assert run_md.startswith("**sd**") and "8 tokens in" in run_md, run_md
        ran = time.time()
        held = {"t": 0.0}
        for _ in range(40):  # the watcher's first write after the Run holds what it imported
            time.sleep(0.25)
            if modules_file.exists():
                held = json.loads(modules_file.read_text())
                if held["t"] > ran:
                    break
        assert held["t"] > ran, f"no list of modules after the Run:\n{log.read_text()[-3000:]}"
        loaded = held["modules"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert {"gradio", "transformers", "torch", "engine", "specviz"} <= set(loaded)
    site = Path(metadata.distribution("gradio").locate_file(""))
    checked = in_site(loaded, site)
    assert "gradio" in checked and "torch" in checked and len(checked) > 500, len(checked)
    outside = modules_outside(loaded, installed_closure(requirements()), site)
    by_dist = {d: sorted(m for m in outside if outside[m] == d)[:3] for d in set(outside.values())}
    assert not outside, f"loaded, not installed by requirements.txt: {by_dist}"
