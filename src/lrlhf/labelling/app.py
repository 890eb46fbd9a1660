"""The labelling page: a Flask app over one :class:`~lrlhf.labelling.store.LabelStore`, served by Werkzeug.

Pages are rendered on the server (Jinja2, autoescaped). Model outputs are untrusted and people label what they see,
so prompts and answers are shown as their exact characters (:mod:`lrlhf.labelling.render`: line breaks kept,
escapes, entities and link targets literal, code fences in a monospace box), with a raw view (the JSON string) one
key away; every response carries a Content-Security-Policy that allows no inline script and nothing from another
origin. The one script (``static/label.js``) maps the keys to the buttons. Routes take no file path: the app serves
the file it was given, its checks and its own static files, nothing else. Requests from another site are refused:
a POST whose ``Origin`` names another host (or that the browser marks cross-site), and, on a loopback address, a
``Host`` that is not a loopback name (DNS rebinding). With a ``token`` every request must carry it (``?token=``
once, then a cookie).
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

from lrlhf.labelling.render import raw_html, text_html
from lrlhf.labelling.store import LabelStore, StaleAction

HERE = Path(__file__).resolve().parent
KEYS = {"left": "a", "right": "b", "tie": "t", "both_bad": "x", "skip": "s", "undo": "u", "raw": "r"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")
TOKEN_COOKIE = "lrlhf_label_token"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "[::1]", "::1"}  # the Host a browser sends to a loopback server
UNSPECIFIED = {"0.0.0.0", "::", ""}
MIN_TOKEN = 16  # characters: a token guessed in few tries protects nothing


def need_web():
    """flask, or an error naming the install command."""
    try:
        import flask
    except ImportError as err:
        raise ImportError(f"the labelling page needs flask ({err}): pip install 'lrlhf[label]' (or pip install "
                          "flask)") from err
    return flask


def _hostname(host_header: str) -> str:
    """``127.0.0.1:8765`` -> ``127.0.0.1``; ``[::1]:8765`` -> ``[::1]``."""
    if host_header.startswith("["):
        return host_header[: host_header.find("]") + 1]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


def create_app(store: LabelStore, token: str | None = None, loopback: bool | None = None,
               instructions: str | None = None):
    """The page for ``store``. ``loopback`` (default: no ``token``): served on a loopback address only, so a
    request must name a loopback ``Host``. ``instructions``: the labelling guidelines, shown above every pair."""
    flask = need_web()
    from flask import abort, redirect, render_template, request, url_for

    loopback = token is None if loopback is None else loopback
    app = flask.Flask("lrlhf.labelling", root_path=str(HERE), template_folder="templates", static_folder="static")
    from markupsafe import Markup  # flask's: the renderers escaped every character, the page inserts them as HTML

    app.jinja_env.filters["text"] = lambda text: Markup(text_html(text))
    app.jinja_env.filters["raw"] = lambda text: Markup(raw_html(text))
    app.jinja_env.globals["instructions"] = instructions

    @app.before_request
    def check_site():
        """DNS rebinding (a page of another site whose name resolves to this machine) and cross-site forms."""
        if loopback and _hostname(request.host) not in LOOPBACK_NAMES:
            abort(403, f"Host {request.host!r} is not this machine's loopback address")
        if request.method != "GET":
            origin = request.headers.get("Origin")
            fetch_site = request.headers.get("Sec-Fetch-Site")
            if origin == "null":  # an opaque origin (a sandboxed frame...): only the browser's own word will do
                if fetch_site != "same-origin":
                    abort(403, "a request from an opaque origin")
            elif origin is not None and urlsplit(origin).netloc != request.host:  # (a TLS proxy changes the scheme)
                abort(403, f"a request from {origin!r}, another site")
            if fetch_site not in (None, "same-origin", "none"):
                abort(403, "a cross-site request")
        return None

    @app.before_request
    def check_token():
        if token is None:
            return None
        given = request.args.get("token") or request.cookies.get(TOKEN_COOKIE) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            abort(403)
        return None

    @app.after_request
    def headers(response):
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"  # no-referrer would make the page's own Origin "null"
        response.headers["Cache-Control"] = "no-store"
        if token is not None and request.args.get("token") == token:
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict")
        return response

    def _name(name: str) -> str:
        try:
            store.annotator(name)
        except ValueError as err:
            abort(400, str(err))
        return name

    @app.get("/")
    def index():
        name = request.args.get("annotator", "").strip()
        if name:
            return redirect(url_for("label", name=_name(name)), code=303)
        return render_template("index.html", store=store, names=sorted(store.logs))

    @app.get("/label/<name>")
    def label(name: str):
        item = store.current(_name(name))
        done, total = store.progress(name)
        if item is None:
            return render_template("done.html", store=store, name=name, done=done, total=total,
                                   last=store.last(name), keys=KEYS)
        swapped = store.swapped(name, item.key)
        left, right = (item.rejected, item.chosen) if swapped else (item.chosen, item.rejected)
        skipped = item.key in store.annotator(name).decisions  # a pair skipped earlier, shown again
        return render_template("label.html", store=store, name=name, item=item, left=left, right=right,
                               done=done, total=total, last=store.last(name), keys=KEYS, skipped=skipped)

    @app.post("/label/<name>")
    def decide(name: str):
        try:
            store.decide(_name(name), request.form.get("key", ""), request.form.get("choice", ""),
                         request.form.get("comment", ""))
        except StaleAction:
            pass  # a resubmitted or outdated page: nothing recorded, the current item is shown
        except ValueError as err:
            abort(400, str(err))
        return redirect(url_for("label", name=name), code=303)

    @app.post("/undo/<name>")
    def undo(name: str):
        try:
            store.undo(_name(name), request.form.get("key", ""))
        except StaleAction:
            pass
        return redirect(url_for("label", name=name), code=303)

    @app.get("/api/state/<name>")
    def state(name: str):
        item = store.current(_name(name))
        done, total = store.progress(name)
        return {"annotator": name, "current": None if item is None else item.key, "done": done, "total": total,
                "last": store.last(name), "complete": store.complete.is_set(),
                "skipped": item is not None and item.key in store.annotator(name).decisions}

    @app.get("/summary")
    def summary():
        from lrlhf.labelling.agreement import summarise  # torch: imported when the summary is first asked for

        return render_template("summary.html", store=store, summary=summarise(store))

    return app


class Server:
    """The page served in a background thread (Werkzeug's threaded server, its access log off): ``url`` (one a
    browser can open: this machine's name when bound to every address), ``stop()``."""

    def __init__(self, store: LabelStore, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 instructions: str | None = None):
        from werkzeug.serving import make_server

        if host not in LOOPBACK and not token:
            raise ValueError(f"host={host!r} serves the page beyond this machine: give a token")
        if token is not None and len(token) < MIN_TOKEN:
            raise ValueError(f"the token has {len(token)} characters: give at least {MIN_TOKEN} (or none: one is "
                             "drawn)")
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request in the labeller's terminal
        self.server = make_server(host, port, create_app(store, token, loopback=host in LOOPBACK,
                                                         instructions=instructions), threaded=True)
        self.host, self.port = host, self.server.server_port
        query = f"?token={token}" if token else ""
        shown = socket.gethostname() if host in UNSPECIFIED else host  # 0.0.0.0 is no address to open
        self.url = f"http://{'[' + shown + ']' if ':' in shown else shown}:{self.port}/{query}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="lrlhf-label", daemon=True)

    def start(self) -> Server:
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()


__all__ = ["KEYS", "Server", "create_app", "need_web"]
