"""The labelling page: a Flask app over one :class:`~lrlhf.labelling.store.LabelStore`, served by Werkzeug.

Pages are rendered on the server (Jinja2, autoescaped); model outputs are untrusted, so answers and prompts go
through markdown-it with raw HTML off and images off (their HTML is shown as text, code as code), and every
response carries a Content-Security-Policy that allows no inline script and nothing from another origin. The one
script (``static/label.js``) maps the keys to the buttons. Routes take no file path: the app serves the file it was
given, its checks and its own static files, nothing else. With a ``token`` every request must carry it (``?token=``
once, then a cookie).
"""

from __future__ import annotations

import hmac
import threading
from pathlib import Path

from lrlhf.labelling.store import LabelStore, StaleAction

HERE = Path(__file__).resolve().parent
KEYS = {"left": "a", "right": "b", "tie": "t", "both_bad": "x", "skip": "s", "undo": "u"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")
TOKEN_COOKIE = "lrlhf_label_token"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def need_web():
    """flask and markdown-it, or an error naming the install command."""
    try:
        import flask
        import markdown_it
    except ImportError as err:
        raise ImportError(f"the labelling page needs flask and markdown-it-py ({err}): "
                          "pip install 'lrlhf[label]' (or pip install flask markdown-it-py)") from err
    return flask, markdown_it


def create_app(store: LabelStore, token: str | None = None):
    flask, markdown_it = need_web()
    from flask import abort, redirect, render_template, request, url_for
    from markupsafe import Markup

    app = flask.Flask("lrlhf.labelling", root_path=str(HERE), template_folder="templates", static_folder="static")
    md = markdown_it.MarkdownIt("commonmark", {"html": False}).disable("image")

    @app.template_filter("markdown")
    def markdown(text: str):
        return Markup(md.render(text))  # markdown-it escaped every raw tag: safe to insert

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
        response.headers["Referrer-Policy"] = "no-referrer"
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
        return render_template("label.html", store=store, name=name, item=item, left=left, right=right,
                               done=done, total=total, last=store.last(name), keys=KEYS)

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
                "last": store.last(name), "complete": store.complete.is_set()}

    @app.get("/summary")
    def summary():
        from lrlhf.labelling.agreement import summarise  # torch: imported when the summary is first asked for

        return render_template("summary.html", store=store, summary=summarise(store))

    return app


class Server:
    """The page served in a background thread (Werkzeug's threaded server): ``url``, ``stop()``."""

    def __init__(self, store: LabelStore, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        from werkzeug.serving import make_server

        if host not in LOOPBACK and not token:
            raise ValueError(f"host={host!r} serves the page beyond this machine: give a token")
        self.server = make_server(host, port, create_app(store, token), threaded=True)
        self.host, self.port = host, self.server.server_port
        query = f"?token={token}" if token else ""
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{self.port}/{query}"
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
