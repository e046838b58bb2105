from __future__ import annotations

import pytest

from tests.ui.helpers import TINY, launch_app


@pytest.fixture(scope="module")
def app_url():
    demo, url = launch_app(target=TINY)
    yield url
    demo.close()


@pytest.fixture
def client(app_url):
    from gradio_client import Client

    return Client(app_url, verbose=False)
