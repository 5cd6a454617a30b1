"""DNS rebinding cannot make a web page the owner (issue 41, part 1), in a real Chromium.

A page the owner visits can rebind its own host name to 127.0.0.1; the owner's browser then talks
to this app over loopback, and to the browser it is the page's own origin, so Streamlit's origin
checks pass. Chromium's ``--host-resolver-rules`` stands in for that DNS (``MAP rebind.example
127.0.0.1``): Streamlit sees a loopback peer and ``Host: rebind.example:PORT``, as it would. One app
server, started with ``PETMODEL_ALLOWED_HOSTS=allowed.example``, answers all four names:
``localhost`` and ``127.0.0.1`` get the owner's Train page (its Launch button), ``allowed.example``
too (the user allowed it), and ``rebind.example`` the visitor's page with the sentence that names
the setting.

The mapped Chromium is a second browser launched through the session ``browser`` fixture's
Playwright (``browser.browser_type``): resolver rules are per browser process, and Playwright's
sync API runs one instance per thread.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

OWNER_HOSTS = ("localhost", "127.0.0.1", "allowed.example")  # in this order: the first load warms the server
REBOUND = "rebind.example"
RESOLVER_RULES = f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1, MAP allowed.example 127.0.0.1"
LAUNCH = 'button:has-text("Launch")'
REFUSED = "which is not a local name"


def _train_page(context, url: str, marker: str, timeout_ms: float) -> dict:
    """Open ``url``'s Train page in a new tab; once ``marker`` shows and the run settled, what it offers."""
    from test_browser import settle

    page = context.new_page()
    try:
        page.goto(url + "/train")
        try:
            page.locator(marker).first.wait_for(timeout=timeout_ms)
        except Exception as err:  # the page as it stands, for the failure message
            raise AssertionError(f"{url}: no {marker!r} in {page.inner_text('body')[-1500:]!r}") from err
        settle(page)
        return {"launch": page.locator(LAUNCH).count(), "text": page.inner_text("body")}
    finally:
        page.close()


def test_a_rebound_name_gets_the_visitor_page_and_local_names_the_owners(browser, tmp_path: Path):
    from benchmarks._common import running_app
    from test_browser import CHROMIUM, CHROMIUM_ARGS

    env = {**os.environ, "PETMODEL_STORE": str(tmp_path / "store"), "WANDB_MODE": "disabled",
           "PETMODEL_WARMUP": "0", "PETMODEL_ALLOWED_HOSTS": "allowed.example"}
    for name in ("PETMODEL_ADMIN_PASSWORD", "PETMODEL_DATA", "PETMODEL_LOOPBACK_IS_OWNER"):
        env.pop(name, None)
    mapped = browser.browser_type.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, RESOLVER_RULES])
    try:
        with running_app(env, tmp_path / "streamlit.log") as url:
            port = url.rsplit(":", 1)[1]
            context = mapped.new_context(viewport={"width": 1440, "height": 1000})
            seen = {host: _train_page(context, f"http://{host}:{port}", LAUNCH, 90_000 if i == 0 else 30_000)
                    for i, host in enumerate(OWNER_HOSTS)}
            rebound = _train_page(context, f"http://{REBOUND}:{port}", f"text={REFUSED}", 30_000)
            context.close()
    finally:
        mapped.close()
    for host in OWNER_HOSTS:
        assert seen[host]["launch"] == 1 and REFUSED not in seen[host]["text"], (host, seen[host]["text"][-800:])
    assert rebound["launch"] == 0, rebound["text"][-800:]
    assert f"opened as {REBOUND}" in rebound["text"], rebound["text"][-800:]
    assert f"add {REBOUND} to PETMODEL_ALLOWED_HOSTS" in rebound["text"], rebound["text"][-800:]
