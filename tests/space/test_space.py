"""A Hugging Face Space, simulated: a fresh virtual environment built ONLY with
``pip install -r requirements.txt`` (no scripts/setup.sh), then ``python app.py`` from a copy
of the repository's files with the variables a CPU Space sets, on a free port; the page must
answer HTTP 200 and one Run on the default pair (the embedded GGUF as shipped, converted and its
kernels built on this first start into a fresh cache) must succeed through gradio_client. The
server is killed at the end. SPECVIZ_KV=dynamic keeps the app's steps eager here: a Space would
compile them in the background (tests/ui/test_model_thread.py tests that warm-up), minutes of a
core the suite does not spend twice.

The environment is built once and reused while requirements.txt (and the Python version) are
unchanged: it lives in $SPECVIZ_CACHE/space-venv/<sha256 of both>, marked complete only after
pip succeeded. pip runs with --no-compile: the app compiles only the modules it imports (pip
compiling every installed file took 26 of 57 s here). Building it takes 30 s to minutes
(torch, gradio, the 98 MB model package, from pip's cache or not); a run with it cached takes
about a minute. Here pip's global config points torch==2.13.0 at the local CPU
wheel; on a machine without that, pip fetches the (much larger) CUDA build from PyPI.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from engine.run.models import cache_root
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


def space_venv() -> Path:
    """The cached environment for this requirements.txt, built on first use."""
    reqs = (REPO / "requirements.txt").read_bytes()
    digest = hashlib.sha256(reqs + sys.version.encode()).hexdigest()[:16]
    root = cache_root() / "space-venv" / digest
    if (root / "complete").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    pip = subprocess.run([str(root / "bin" / "python"), "-m", "pip", "install", "-q",
                          "--no-compile", "-r", str(REPO / "requirements.txt")],
                         capture_output=True, text=True, timeout=1500)
    assert pip.returncode == 0, f"pip install -r requirements.txt failed:\n{pip.stderr[-3000:]}"
    (root / "complete").write_text(digest)
    return root


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


def test_a_fresh_requirements_txt_env_serves_the_app_and_runs_the_default_pair(tmp_path):
    from gradio_client import Client

    venv = space_venv()
    app_dir = copy_repo(tmp_path / "space")
    port, log = free_port(), tmp_path / "app.log"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "SPECVIZ_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "GRADIO_SERVER_PORT": str(port), **SPACE_ENV}
    with open(log, "w") as out:
        proc = subprocess.Popen([str(venv / "bin" / "python"), "app.py"], cwd=app_dir, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
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
