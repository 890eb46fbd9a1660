"""The labelling page through Flask's test client: model outputs shown as text (no tag from a response reaches the
page as HTML, and the Content-Security-Policy allows no inline script), a resubmitted form never records twice,
undo, the summary, the token beyond loopback, no route that serves another file; the command's bad input."""

import json

import pytest

pytest.importorskip("flask", reason="the labelling page needs flask: pip install 'lrlhf[label]'")

from lrlhf.labelling.app import Server, create_app
from lrlhf.labelling.command import main
from lrlhf.labelling.store import LabelStore

HOSTILE = "Try <script>window.pwned = 1</script> and <img src=x onerror=\"window.pwned = 2\">\n\n```\n<b>code</b>\n```"


def pairs_file(tmp_path, n=3):
    rows = [{"id": i, "prompt": [{"role": "user", "content": f"question **{i}**"}],
             "chosen": [{"role": "assistant", "content": HOSTILE if i == 0 else f"good {i}"}],
             "rejected": [{"role": "assistant", "content": f"bad {i}"}], "label": None} for i in range(n)]
    path = tmp_path / "round_1.to_label.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_responses_render_as_text_and_the_page_sends_a_strict_policy(tmp_path):
    client = create_app(LabelStore(pairs_file(tmp_path))).test_client()
    assert "Who is labelling?" in client.get("/").get_data(as_text=True)
    assert client.get("/?annotator=ann").headers["Location"] == "/label/ann"
    page = client.get("/label/ann")
    html = page.get_data(as_text=True)
    assert page.status_code == 200 and "1 / 3" in html
    assert "<script>window" not in html and "<img" not in html and "<b>code</b>" not in html
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in html and "&lt;b&gt;code&lt;/b&gt;" in html
    assert "question **0**" in html  # as written: no markup hides a character
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "default-src 'none'" in policy
    assert client.get("/static/label.js").status_code == 200


def test_a_resubmitted_form_is_recorded_once_and_undo_takes_the_last_back(tmp_path):
    store = LabelStore(pairs_file(tmp_path))
    client = create_app(store).test_client()
    assert client.post("/label/ann", data={"key": "0", "choice": "left", "comment": "ok"}).status_code == 303
    assert client.post("/label/ann", data={"key": "0", "choice": "right"}).status_code == 303  # stale: ignored
    assert list(store.logs["ann"].decisions) == ["0"] and store.logs["ann"].decisions["0"]["comment"] == "ok"
    assert client.post("/label/ann", data={"key": "1", "choice": "sideways"}).status_code == 400
    assert client.get("/api/state/ann").get_json() == {"annotator": "ann", "current": "1", "done": 1, "total": 3,
                                                       "last": "0", "complete": False, "skipped": False}
    client.post("/undo/ann", data={"key": "0"})
    client.post("/undo/ann", data={"key": "0"})  # stale: nothing left to undo
    assert store.logs["ann"].decisions == {}
    events = [json.loads(line) for line in (store.log_dir / "ann.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["label", "undo"]
    for key in "012":
        client.post("/label/ann", data={"key": key, "choice": "tie"})
    assert "All 3 items decided" in client.get("/label/ann").get_data(as_text=True) and store.out.is_file()
    summary = client.get("/summary").get_data(as_text=True)
    assert "<td>ann</td><td>3</td><td>3</td><td>0</td>" in summary
    assert client.get("/label/a%20b!").status_code == 400  # an annotator name is checked before anything


def test_no_route_serves_another_file(tmp_path):
    client = create_app(LabelStore(pairs_file(tmp_path))).test_client()
    (tmp_path / "secret.txt").write_text("secret")
    for url in ("/static/../store.py", "/static/..%2fstore.py", "/round_1.to_label.jsonl", "/secret.txt",
                f"/static/{tmp_path}/secret.txt"):
        response = client.get(url, follow_redirects=True)
        assert response.status_code == 404 and b"secret" not in response.data, url


def test_a_token_is_required_beyond_loopback(tmp_path):
    store = LabelStore(pairs_file(tmp_path))
    client = create_app(store, token="s3cret").test_client()
    assert client.get("/label/ann").status_code == 403
    assert client.get("/label/ann?token=wrong").status_code == 403
    assert client.get("/label/ann?token=s3cret").status_code == 200  # (a test client: Server refuses short ones)
    assert client.get("/label/ann").status_code == 200  # the cookie the first visit set
    with pytest.raises(ValueError, match="give a token"):
        Server(store, host="0.0.0.0", port=0)


def test_the_command_names_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q"}\n')
    assert main(["label", str(bad)]) == 2
    assert f"{bad}:1: cannot detect the preference format" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ fidelity
class _TextOf(__import__("html.parser").parser.HTMLParser):
    """The text content of the element with ``id`` (what a person reads there, tags gone, entities decoded)."""

    def __init__(self, element_id: str):
        super().__init__(convert_charrefs=True)
        self.element_id, self.depth, self.parts = element_id, 0, []

    def handle_starttag(self, tag, attrs):
        if self.depth:
            self.depth += 1
        elif dict(attrs).get("id") == self.element_id:
            self.depth = 1

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.parts.append(data)


def text_of(html: str, element_id: str) -> str:
    parser = _TextOf(element_id)
    parser.feed(html)
    return "".join(parser.parts)


CONSTRUCTS = {  # issue #49: each hid, joined or changed characters under markdown rendering
    "single line breaks": "Mercury\nVenus\nEarth",
    "escapes": 'JSON: {"a": "say \\"hi\\""} and \\* \\_ \\#',
    "entities": "Tom &amp; Jerry &lt;b&gt; &#169; &nbsp;",
    "link targets": "See [the docs](https://example.org/docs) and <https://example.org/auto>",
    "reference definitions": "Read [this][1].\n\n[1]: https://example.org/hidden \"title\"",
    "setext heading and rule": "Title\n---\n\n***\n\n___",
    "emphasis and headings": "# not a heading\n2*3*4 = 24, __init__, ~~struck~~",
    "lists renumbered": "1. one\n1. two\n7) seven\n- dash\n+ plus",
    "block quote and html": "> quoted\n<div>raw</div> <!-- comment -->",
    "code fences and spaces": "```python\nx  =  1\t# tab\n```\n    indented   code\ntrailing   \n",
    "a 64k-character line": "x" * 65536,
}


@pytest.mark.parametrize("construct", sorted(CONSTRUCTS))
def test_the_page_shows_every_character_of_an_answer_as_written(tmp_path, construct):
    answer = CONSTRUCTS[construct]
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"id": 0, "prompt": answer, "chosen": answer, "rejected": "other"}) + "\n")
    store = LabelStore(path)
    html = create_app(store).test_client().get("/label/ann").get_data(as_text=True)
    side = "a" if not store.swapped("ann", "0") else "b"
    assert text_of(html, f"text-{side}") == answer
    assert json.loads(text_of(html, f"raw-{side}")) == answer  # the raw view: the JSON string, as a file holds it
    assert text_of(html, "turn-0") == answer  # the prompt too


def test_requests_from_another_site_are_refused_on_loopback(tmp_path):
    store = LabelStore(pairs_file(tmp_path))
    client = create_app(store).test_client()
    forged = client.post("/label/ann", data={"key": "0", "choice": "left"},
                         headers={"Origin": "https://evil.example"})
    assert forged.status_code == 403
    assert client.post("/label/ann", data={"key": "0", "choice": "left"},
                       headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert client.post("/undo/ann", data={"key": "0"}, headers={"Origin": "null"}).status_code == 403
    assert "ann" not in store.logs or not store.logs["ann"].decisions  # nothing recorded
    # DNS rebinding: a page of evil.example whose name resolves to 127.0.0.1 reads nothing
    assert client.get("/label/ann", headers={"Host": "evil.example:8765"}).status_code == 403
    assert client.get("/summary", headers={"Host": "evil.example"}).status_code == 403
    for host in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765"):
        assert client.get("/label/ann", headers={"Host": host}).status_code == 200, host
    same = client.post("/label/ann", data={"key": "0", "choice": "left"},
                       headers={"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"})
    assert same.status_code == 303 and list(store.logs["ann"].decisions) == ["0"]
    behind_tls = client.post("/label/ann", data={"key": "1", "choice": "left"},  # a proxy: https outside, http here
                             headers={"Origin": "https://localhost"})
    assert behind_tls.status_code == 303 and list(store.logs["ann"].decisions) == ["0", "1"]
    assert client.post("/label/ann", data={"key": "2", "choice": "left"},
                       headers={"Origin": "http://localhost.evil.example"}).status_code == 403


def test_the_command_checks_its_options_and_says_what_it_serves(tmp_path, capsys, monkeypatch):
    path = pairs_file(tmp_path)
    assert main(["label", str(path), "--host", "0.0.0.0", "--token", "short"]) == 2
    assert "the token has 5 characters: give at least 16" in capsys.readouterr().err
    server = Server(LabelStore(path), host="0.0.0.0", port=0, token="t" * 16)
    try:
        import logging
        import socket

        assert server.url.startswith(f"http://{socket.gethostname()}:{server.port}/?token=")  # not 0.0.0.0
        assert logging.getLogger("werkzeug").level == logging.WARNING  # no access log line per request
    finally:
        server.stop()
    bad = tmp_path / "unknown.jsonl"
    bad.write_text('{"question": "q"}\n')
    assert main(["label", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "Pass --format to choose one" in err and "format=" not in err.replace("--format", "")
    import lrlhf.labelling.app as app

    def no_flask():
        raise ImportError("the labelling page needs flask (No module named 'flask'): pip install 'lrlhf[label]'")

    monkeypatch.setattr(app, "need_web", no_flask)
    assert main(["label", str(path)]) == 2
    assert capsys.readouterr().err.startswith("lrlhf label: the labelling page needs flask")


def test_export_writes_the_labelled_pairs_only_and_they_train(tmp_path, capsys):
    from lrlhf.data.formats import load_records

    path = pairs_file(tmp_path, n=4)
    store = LabelStore(path)
    store.decide("ann", "0", "rejected")
    store.decide("ann", "1", "both_bad")
    store.decide("ann", "2", "skip")
    store.decide("ann", "3", "tie")
    out = tmp_path / "export.jsonl"
    assert main(["label", str(path), "--export", str(out)]) == 0
    assert "2 labelled pairs of 4" in capsys.readouterr().out
    pairs, summary = load_records(out, "preference", verbose=False)
    assert [(p.chosen[0]["content"], p.target) for p in pairs] == [("bad 0", 1.0), ("good 3", 0.5)]
    assert summary.labelled == 2


def test_instructions_lengths_and_roles_on_the_page(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"id": 0, "prompt": [{"role": "user", "content": "q"},
                                                     {"role": "assistant", "content": "earlier"},
                                                     {"role": "user", "content": "and?"}],
                                "chosen": "two words", "rejected": "three words here"}) + "\n")
    html = create_app(LabelStore(path), instructions="Prefer <the> shorter\nanswer.").test_client().get(
        "/label/ann").get_data(as_text=True)
    assert text_of(html, "instructions").endswith("Prefer <the> shorter\nanswer.")
    assert "9 characters, 2 words" in html and "16 characters, 3 words" in html
    assert html.count('class="turn role-user"') == 2 and html.count('class="turn role-assistant"') == 1
