"""Weight store fixtures: `store` starts a live service (in-process uvicorn) from keyword options."""

from __future__ import annotations

import pytest
from weights_helpers import ThreadServer, store_config


@pytest.fixture
def store(tmp_path):
    """store(http=None, **config) -> a started ThreadServer (http: a uvicorn protocol, default the service's) on tmp_path/root; all are stopped at the end."""
    started: list[ThreadServer] = []

    def make(http=None, **kw) -> ThreadServer:
        srv = ThreadServer(store_config(tmp_path / "root", **kw), http=http).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()
