"""The labelling page driven in a real Chromium (Selenium, headless; .ci/run installs Debian's chromium and
chromium-driver): 10 pairs labelled by keyboard and mouse, one label undone, a reload and a server restart mid-way;
the labelled file holds exactly the 10 labels with annotator, order and time; a response holding ``<script>`` and
``<img onerror=...>`` renders as text and runs nothing. The screenshot in docs/labelling.md is this test's
(``LRLHF_SCREENSHOT=docs/labelling.png``). Without a browser it skips, unless ``LRLHF_REQUIRE_BROWSER=1`` (CI)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import write_pairs

pytest.importorskip("flask", reason="the labelling page needs flask: pip install 'lrlhf[label]'")


def _browser_or_skip():
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing or importlib_missing("selenium"):
        reason = f"no browser to drive ({', '.join(missing) or 'selenium'} missing: apt-get install chromium " \
                 "chromium-driver; pip install selenium)"
        if os.environ.get("LRLHF_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


HOSTILE = 'Hi <script>window.pwned = 1</script> there <img src=x onerror="window.pwned = 2">'
CODE = ("Sort with a key:\n\n```python\nsorted(words, key=len)\n```\n\nThis keeps equal lengths in input order "
        "(Python's sort is **stable**).")


LONG = "x = [" + ", ".join(str(n) for n in range(12000)) + "]"  # one 64k-character code line


def answers(i: int) -> tuple[str, str]:
    if i == 0:
        return CODE, "Use `words.sort()`; it sorts by length."
    if i == 3:
        return HOSTILE, "A plain answer."
    if i == 5:
        return f"```python\n{LONG}\n```", "A short answer beside a very long line."
    return f"Answer {i}, the careful one.", f"Answer {i}, the hasty one."


@pytest.fixture
def driver():
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,860"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    browser.set_page_load_timeout(60)
    yield browser
    browser.quit()


@pytest.mark.slow
def test_label_ten_pairs_in_chromium_with_undo_reload_and_restart(tmp_path, driver, label_server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    path = tmp_path / "round_1.to_label.jsonl"
    write_pairs(path, 10, answers)
    server = label_server(path)

    def progress() -> str | None:
        return driver.execute_script("var e = document.getElementById('progress'); "
                                     "return e ? e.textContent : (document.getElementById('done') ? 'done' : null)")

    def wait_for(text: str) -> None:
        from selenium.common.exceptions import WebDriverException

        # the page may be changing under the check (a stale node, a script run between two documents): look again
        WebDriverWait(driver, 30, ignored_exceptions=(WebDriverException,)).until(
            lambda d: progress() == text, message=f"waiting for {text}")

    driver.get(server.url)
    driver.find_element(By.ID, "annotator").send_keys("alice")
    driver.find_element(By.ID, "start").click()
    wait_for("1 / 10")
    shot = os.environ.get("LRLHF_SCREENSHOT")
    driver.save_screenshot(shot or str(tmp_path / "labelling.png"))

    keys, buttons = "abt", ("choose-a", "choose-b", "choose-tie")
    step, undone = 0, False
    while step < 10:
        assert progress() == f"{step + 1} / 10"
        answer_texts = [driver.find_element(By.ID, f"answer-{x}").text for x in "ab"]
        if HOSTILE.split(" there")[0] in " ".join(answer_texts):  # the hostile pair: shown as text, nothing ran
            assert "<script>window.pwned = 1</script>" in " ".join(answer_texts)
            assert '<img src=x onerror="window.pwned = 2">' in " ".join(answer_texts)
            assert driver.find_elements(By.CSS_SELECTOR, ".answer script, .answer img, .turn script") == []
            assert driver.execute_script("return window.pwned === undefined")
        if any(LONG in text for text in answer_texts):  # issue #49: the page was 344,514 px wide (B off screen)
            width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
            assert width[0] <= width[1], width
            box = driver.find_element(By.ID, "answer-b").rect
            assert box["x"] + box["width"] <= width[1], box  # answer B in the window, beside A
        if step % 2 == 0:  # by keyboard
            driver.find_element(By.TAG_NAME, "body").send_keys(keys[step % 3])
        else:  # by mouse, with a comment
            driver.find_element(By.ID, "comment").send_keys(f"note {step}")
            driver.find_element(By.ID, buttons[step % 3]).click()
        step += 1
        wait_for(f"{step + 1} / 10" if step < 10 else "done")
        if step == 4 and not undone:  # undo the last label (by key), then give it again
            driver.find_element(By.TAG_NAME, "body").send_keys("u")
            step, undone = step - 1, True
            wait_for(f"{step + 1} / 10")
        elif step == 6:
            driver.refresh()
            wait_for("7 / 10")
        elif step == 8:
            server.restart()
            driver.refresh()
            wait_for("9 / 10")
    assert driver.find_elements(By.ID, "done")

    rows = [json.loads(line) for line in (tmp_path / "round_1.labelled.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(10)) and all(r["label"] in (0.0, 0.5, 1.0) for r in rows)
    for row in rows:
        (note,) = row["annotations"]
        assert note["annotator"] == "alice" and note["left"] in ("chosen", "rejected") and note["time"]
    log = [json.loads(line) for line in (tmp_path / "round_1.labels" / "alice.jsonl").read_text().splitlines()]
    assert [e["event"] for e in log].count("undo") == 1 and len(log) == 12  # 11 decisions (one undone) + the undo
    comments = [e["comment"] for e in log if e["event"] == "label" and e["comment"]]
    assert comments == [f"note {i}" for i in (1, 3, 3, 5, 7, 9)]  # item 4's label (step 3) undone and given again
    driver.get(server.url + "summary")
    assert "alice" in driver.find_element(By.ID, "annotators").text
    if shot:
        assert Path(shot).is_file()


def _labelled_world_seed(rows: list[dict]) -> int:
    """The first world seed whose split of these prompts leaves no file of the world empty (10 pairs over six
    splits: found with the world's own split function, not by hand)."""
    from lrlhf.data.records import PreferencePair
    from lrlhf.data.splits import split_by_prompt
    from lrlhf.data.worlds import FilesWorld

    fractions = FilesWorld(preferences="x.jsonl", fractions=SPLIT_SHARES).fractions
    pairs = [PreferencePair([{"role": "user", "content": r["prompt"]}], [], []) for r in rows]
    for seed in range(200):
        if all(split_by_prompt(pairs, fractions, seed=seed).values()):
            return seed
    raise AssertionError("no seed splits 10 pairs into six non-empty splits")


SPLIT_SHARES = {"pref_train": 0.3, "pref_val": 0.1, "pref_test": 0.15, "judge_train": 0.15, "judge_val": 0.15,
                "eval": 0.15}


@pytest.mark.slow
def test_labels_given_on_the_page_are_what_the_reward_model_trains_on(tmp_path, driver, label_server,
                                                                        tiny_real_model):
    """Issue #49: 10 pairs labelled in the browser against the file's order (the `rejected` answer preferred each
    time), then `recipe=rm world=files world.preferences=<the labelled file>`: every pair reaches the world's splits
    the way the person labelled it, and the data summaries count 10 pairs labelled by people."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from test_cli import _train

    rows = [{"prompt": f"Which planet is number {i} from the sun, in one line?",
             "chosen": f"Planet {i} is the one you asked about.\nIt is far.",
             "rejected": f"Planet {i}:\n- far\n- cold\n\n`{i}` \\\" &amp; [link]: https://example.org/{i}"}
            for i in range(10)]  # no ids: labels bound to the pairs' content
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rejected = {r["rejected"] for r in rows}
    server = label_server(path)
    driver.get(server.url)
    driver.find_element(By.ID, "annotator").send_keys("bob")
    driver.find_element(By.ID, "start").click()
    for step in range(10):
        WebDriverWait(driver, 30).until(
            lambda d, s=step: d.execute_script("var e = document.getElementById('progress'); "
                                               "return e && e.textContent") == f"{s + 1} / 10")
        shown = [driver.execute_script(f"return document.getElementById('text-{x}').textContent") for x in "ab"]
        assert all(text in rejected or text in {r["chosen"] for r in rows} for text in shown), shown  # exact
        driver.find_element(By.TAG_NAME, "body").send_keys("a" if shown[0] in rejected else "b")
    WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.ID, "done"))
    labelled = tmp_path / "pairs.labelled.jsonl"
    assert [json.loads(line)["label"] for line in labelled.read_text().splitlines()] == [0.0] * 10

    seed = _labelled_world_seed(rows)
    shares = [f"world.fractions.{name}={share}" for name, share in SPLIT_SHARES.items()]
    _train(tmp_path, "recipe=rm", "world=files", f"world.preferences={labelled}", f"world.seed={seed}", *shares,
           "model=hf", f"model.name_or_path={tiny_real_model}", "hparams=smollm2", "logger=none",
           f"hydra.run.dir={tmp_path / 'run'}", 'stage_overrides.sft=["trainer.max_steps=2","data.batch_size=2"]',
           "trainer.max_steps=2", "data.batch_size=2")
    [world] = (tmp_path / "cache" / "worlds").iterdir()
    report = json.loads((world / "world.json").read_text())["sources"]["preferences"]
    assert report["read"] == report["kept"] == report["labelled"] == 10, report
    pairs = [json.loads(line) for name in ("pref_train", "pref_val", "pref_test", "judge_train", "judge_val")
             for line in (world / f"{name}.jsonl").read_text().splitlines()]
    assert pairs and all(p["chosen"][0]["content"] in rejected and p["label"] == 1.0 for p in pairs)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    train = summary["data"]["train"]
    assert train["labelled"] == train["records"] == sum(1 for _ in (world / "pref_train.jsonl").open()), train
