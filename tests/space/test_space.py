"""A Hugging Face Space, simulated: ``python app.py`` from a copy of the repository's files
with the variables a CPU Space sets, a fresh model cache and a free port; the page must answer
HTTP 200 and one Run on the default pair (the embedded GGUF as shipped, converted and its
kernels built on this first start into the fresh cache) must succeed through gradio_client. The
server is killed at the end. SPECVIZ_KV=dynamic keeps the app's steps eager here: a Space would
compile them in the background (tests/ui/test_model_thread.py tests that warm-up), minutes of a
core the suite does not spend twice.

A Space installs only ``pip install -r requirements.txt``. The app runs in the suite's own
environment (requirements-dev.txt: requirements.txt plus the test tools), under ``python -X
importtime``, which logs every module the process imports, at start and during the Run; each
one must be the standard library's, the repository's, or a module of a distribution that
requirements.txt installs (its lines, then each installed distribution's own requirements,
markers evaluated), at a version its line allows. The suite built a fresh environment from
requirements.txt alone before (2026-12-07): 60-80 s of a 2-core machine's suite on each clean
machine, for what these two checks see, save a requirement pip cannot install alone (setup.sh
installs requirements.txt through requirements-dev.txt, so it fails there first).
"""

from __future__ import annotations

import importlib.util
import os
import re
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
VENV_OWN = {"pip", "setuptools"}  # what `python -m venv` puts in every environment


def requirements(path: Path = REPO / "requirements.txt") -> list[Requirement]:
    """requirements.txt's requirements (comments and pip's per-line options dropped)."""
    lines = (line.split("#")[0].split(" --")[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def installed_closure(reqs: list[Requirement]) -> dict[str, Requirement]:
    """Every distribution that installing reqs installs, by canonical name, with the
    requirement that brought it in: reqs, then each installed distribution's own
    requirements (Requires-Dist), markers evaluated with the extras asked for."""
    seen: dict[str, Requirement] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are in
    todo = [(r, "") for r in reqs]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        seen.setdefault(name, req)
        for ex in ["", *sorted(req.extras)]:  # its base requirements, then each extra's
            if (name, ex) not in done:
                done.add((name, ex))
                todo += [(Requirement(r), ex) for r in metadata.requires(req.name) or []]
    return seen


def imported_top_levels(importtime_log: str) -> set[str]:
    """The top-level names of the modules a `python -X importtime` process logged."""
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$", importtime_log,
                       re.MULTILINE)
    return {name.split(".")[0] for name in names}


def distributions_outside(modules: set[str], closure: dict[str, Requirement],
                          local: set[str]) -> dict[str, set[str]]:
    """module -> the distributions providing it, for each module of modules that is installed
    here (an import tried and failed is logged too: an optional one) and is neither the
    standard library's, nor local, nor a module of a distribution in closure."""
    providers = metadata.packages_distributions()
    outside = {}
    for module in modules - set(sys.stdlib_module_names) - local:
        if importlib.util.find_spec(module) is None:
            continue
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        if not dists & (set(closure) | VENV_OWN):
            outside[module] = dists
    return outside


def test_the_closure_follows_requirements_their_extras_and_markers():
    """The closure walk: requests brings in its dependencies, a marker false here drops one,
    a module no listed distribution provides (pytest, from requirements-dev.txt) is named as
    outside, and an import that failed (an optional one) is not."""
    closure = installed_closure([Requirement("requests"),
                                 Requirement('numpy; python_version < "3"')])
    assert {"requests", "urllib3", "idna", "certifi"} <= set(closure)
    assert "numpy" not in closure
    outside = distributions_outside({"requests", "urllib3", "json", "pytest", "engine",
                                     "no_such_module"}, closure, local={"engine"})
    assert outside == {"pytest": {"pytest"}}


def test_requirements_txt_covers_the_suites_own_environment_at_allowed_versions():
    for name, req in installed_closure(requirements()).items():
        version = metadata.version(name)
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


def test_a_space_serves_the_app_and_runs_the_default_pair_on_requirements_txt_alone(tmp_path):
    from gradio_client import Client

    app_dir = copy_repo(tmp_path / "space")
    port, log = free_port(), tmp_path / "app.log"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "HOME": str(tmp_path / "home"), "SPECVIZ_CACHE": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "GRADIO_SERVER_PORT": str(port),
           **SPACE_ENV}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-X", "importtime", "app.py"], cwd=app_dir,
                                env=env, stdout=out, stderr=subprocess.STDOUT,
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
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    modules = imported_top_levels(log.read_text())
    assert {"gradio", "transformers", "torch", "engine", "specviz"} <= modules
    local = {p.stem for p in app_dir.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    outside = distributions_outside(modules, installed_closure(requirements()), local)
    assert not outside, f"imported, not installed by requirements.txt: {outside}"
