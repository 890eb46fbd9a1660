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
    assert "<strong>0</strong>" in html  # markdown still renders
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
                                                       "last": "0", "complete": False}
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
    assert client.get("/label/ann?token=s3cret").status_code == 200
    assert client.get("/label/ann").status_code == 200  # the cookie the first visit set
    with pytest.raises(ValueError, match="give a token"):
        Server(store, host="0.0.0.0", port=0)


def test_the_command_names_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q"}\n')
    assert main(["label", str(bad)]) == 2
    assert f"{bad}:1: cannot detect the preference format" in capsys.readouterr().err
