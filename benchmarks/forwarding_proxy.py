"""A real same-host reverse proxy for the browser tests and bench_load: it adds ``X-Forwarded-For`` to every request.

A visitor behind a proxy on the app's own host reaches Streamlit from loopback; only the proxy's
header tells it apart from the owner (``petmodel.app.access``). Browsers' "extra headers" cannot
stand in for it: Chromium 150 no longer sends them on the websocket upgrade, which is the request
Streamlit reads ``st.context.headers`` from. So the tests put this proxy between browser and app,
as nginx or Caddy would sit: it copies bytes both ways and writes the header into each request head
it sees on a connection (a websocket connection carries exactly one).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024


def _pipe(src: socket.socket, dst: socket.socket, inject: bytes | None) -> None:
    """Copy ``src`` to ``dst`` until either side closes; with ``inject``, add it to each request head.

    A request's body (its Content-Length) passes untouched; after a websocket upgrade every byte does.
    """
    buf, body_left = b"", 0
    try:
        while True:
            chunk = src.recv(65536)
            if not chunk:
                break
            if inject is None:
                dst.sendall(chunk)
                continue
            buf += chunk
            out = b""
            while buf:
                if body_left:
                    part = buf[:body_left]
                    out, buf, body_left = out + part, buf[len(part):], body_left - len(part)
                    continue
                end = buf.find(_HEAD_END)
                if end < 0:
                    if len(buf) > _MAX_HEAD:  # not HTTP as we know it: pass it on as it is
                        out, buf, inject = out + buf, b"", None
                    break
                head, buf = buf[:end], buf[end + len(_HEAD_END):]
                out += head + b"\r\n" + inject + _HEAD_END
                lines = [line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line]
                fields = {name.strip().lower(): value.strip() for name, value in lines}
                if fields.get(b"upgrade", b"").lower() == b"websocket":  # frames follow, never heads
                    out, buf, inject = out + buf, b"", None
                    break
                body_left = int(fields.get(b"content-length", b"0") or 0)
            if out:
                dst.sendall(out)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def forwarding_proxy(url: str, forwarded_for: str = "203.0.113.9") -> Iterator[str]:
    """A proxy on a free loopback port in front of ``url`` (``http://127.0.0.1:PORT``); yields its URL."""
    target = urlsplit(url)
    inject = f"X-Forwarded-For: {forwarded_for}".encode()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((target.hostname, target.port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            threading.Thread(target=_pipe, args=(client, upstream, inject), daemon=True).start()
            threading.Thread(target=_pipe, args=(upstream, client, None), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        listener.close()
