"""`rlctl ui` as a person uses it: a real headless chromium (Debian's, through Selenium and chromedriver) drives a
running `rlctl ui` from the recipe to an export; and the plain CLI never loads a UI library."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
# the demo kept short: SFT then GRPO on exact match, a few steps each, a checkpoint every few
OVERRIDES = [
    "sft.max_steps=12",
    "sft.save_every=4",
    "sft.eval_samples=8",
    "rl.max_steps=2",
    "rl.save_every=1",
    "rl.prompts_per_step=4",
    "rl.group_size=4",
    "rl.eval_samples=8",
    "rl.rewards=[{name: exact_match, weight: 1.0}]",
]


@pytest.mark.parametrize("argv", [["--help"], ["ui", "--help"], ["plan", "--preset", "tiny-demo"]])
def test_cli_never_imports_a_ui_library(argv, tmp_path):
    code = (
        "import sys\nfrom rlctl.cli import main\nsys.argv = ['rlctl', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "ui = [m for m in ('gradio', 'fastapi', 'uvicorn', 'pandas', 'starlette') if m in sys.modules]\n"
        "print('UI', ui, file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert "UI []" in proc.stderr, proc.stderr


def test_ui_without_the_extra_says_how_to_install_it(tmp_path):
    code = "import sys\nsys.modules['gradio'] = None\nfrom rlctl.cli import main\nsys.argv = ['rlctl', 'ui']\nmain()\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'rlctl[ui]'" in proc.stderr and "Traceback" not in proc.stderr


def test_paths_typed_into_the_page_stay_in_the_served_folder_and_spare_the_users_files(tmp_path):
    from rlctl.cli.web import draft as views
    from rlctl.cli.web.paths import inside
    from rlctl.errors import UserError

    assert inside(tmp_path, "runs/a", "run directory") == Path("runs/a")
    for bad in ("../elsewhere", "/etc/passwd", ""):
        with pytest.raises(UserError):
            inside(tmp_path, bad, "run directory")
    (tmp_path / "mine.yaml").write_text("name: mine\n")
    ours: set[Path] = set()
    with pytest.raises(UserError, match="the page did not write it"):
        views.save(tmp_path, views.Draft("name: other\n", "mine.yaml"), ours)
    assert (tmp_path / "mine.yaml").read_text() == "name: mine\n"
    with pytest.raises(UserError, match="not a YAML file name"):  # text typed in the page never lands in a .py
        views.save(tmp_path, views.Draft("def reward(): ...\n", "plugin.py"), ours)
    views.save(tmp_path, views.Draft("name: page\n", "configs/p.yaml"), ours)
    views.save(tmp_path, views.Draft("name: page again\n", "configs/p.yaml"), ours)  # its own file: rewritten
    assert (tmp_path / "configs" / "p.yaml").read_text() == "name: page again\n"


def test_a_bad_key_gets_the_clis_message(tmp_path):
    from rlctl.cli.web import draft as views
    from rlctl.config import presets

    text = presets.get("tiny-demo").path.read_text()
    good = views.check(tmp_path, views.Draft(text, "configs/tiny-demo.yaml"))
    assert good.config is not None and good.message.startswith("Valid: tiny-demo")
    bad = views.check(tmp_path, views.Draft("sft_steps: 3\n" + text, "configs/tiny-demo.yaml"))
    assert bad.config is None and "unknown key 'sft_steps'" in bad.message
    broken = views.check(tmp_path, views.Draft("sft: [\n", "configs/x.yaml"))
    assert broken.config is None and "Malformed YAML in configs/x.yaml" in broken.message
    draft = views.Draft(text, "configs/t.yaml", stages=("sft",), sets=("sft.max_steps=3",))
    assert draft.train_command("runs/t") == (
        "rlctl train --config configs/t.yaml --stages sft --set sft.max_steps=3 --run-dir runs/t"
    )


# ---------------------------------------------------------------------------------------------------- the server
def start_ui(folder: Path, *args: str):
    """`rlctl ui ARGS` serving `folder`: (process, the URL it printed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlctl.cli", "ui", *args],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = proc.stdout.readline()
    found = re.search(r"http://\S+", line)
    assert found, line + (proc.stdout.read() if proc.poll() is not None else "")
    return proc, found.group(0)


def stop_ui(proc) -> None:
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the server stops, and with it any run still going, at a checkpoint
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def server(tmp_path):
    """`rlctl ui` in a fresh folder, on the free port it picks: (url, folder)."""
    proc, url = start_ui(tmp_path)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url
    yield url, tmp_path
    stop_ui(proc)


def test_another_host_needs_the_token_the_url_carries(tmp_path):
    """Without the token, or with a wrong one of any text (non-ASCII, bytes that are not UTF-8, in the query or the
    cookie), every request is refused with 403, never a 500; the printed URL's token is kept in a cookie."""
    import http.client
    import urllib.error
    import urllib.request
    from http.cookiejar import CookieJar

    proc, url = start_ui(tmp_path, "--host", "127.0.0.2")  # a loopback address that is not localhost's
    try:
        token = re.search(r"\?token=(\S+)$", url).group(1)
        bare = url.split("?")[0]
        host, port = re.search(r"//([^:/]+):(\d+)/", url).groups()
        wrong_queries = ["", f"?token=x{token}", "?token=%C3%A9t%C3%A9", f"?token={token}%E2%82%AC", "?token=%FF%FE"]
        wrong_queries += ["?token=", f"?token={token[:-1]}", "?token=%00"]
        wrong_cookies = [b"rlctl_ui_token=\xe9t\xe9", b"rlctl_ui_token=\xe2\x82\xac", b"rlctl_ui_token=" + b"\xff" * 9]
        wrong_cookies += [f"rlctl_ui_token={token}x".encode(), b'rlctl_ui_token="\\\xe9"; a=\x80']
        asked = [(f"/{q}", None) for q in wrong_queries] + [("/config", c) for c in wrong_cookies]
        asked += [("/gradio_api/info", None)]
        for path, cookie in asked:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.putrequest("GET", path, skip_accept_encoding=True)
            if cookie is not None:
                conn.putheader("Cookie", cookie)
            conn.endheaders()
            answer = conn.getresponse()
            assert answer.status == 403, (path, cookie, answer.status)
            conn.close()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        assert browser.open(url, timeout=30).status == 200
        assert browser.open(f"{bare}config", timeout=30).status == 200  # the page's own requests: the cookie
        (tmp_path.parent / "outside.txt").write_text("not the page's\n")
        (tmp_path / "inside.txt").write_text("the folder's, but no component's\n")
        for path in ("/etc/passwd", str(tmp_path.parent / "outside.txt"), "../outside.txt", "inside.txt"):
            with pytest.raises(urllib.error.HTTPError) as refused:  # Gradio serves no file the page did not make
                browser.open(f"{bare}gradio_api/file={path}", timeout=30)
            assert refused.value.code in (403, 404), path
    finally:
        stop_ui(proc)
    console = proc.stdout.read()
    assert "Traceback" not in console and "Exception" not in console, console


# ---------------------------------------------------------------------------------------------------- the browser


@pytest.fixture
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (make install-ui)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, read at the end
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


class Page:
    """The page as a person sees it: clicks, typing, and waiting for what they would wait to read."""

    def __init__(self, driver, shots: Path):
        self.d, self.shots, self.n, self.started = driver, shots, 0, time.monotonic()
        self.console: list[dict] = []
        shots.mkdir(parents=True, exist_ok=True)

    def el(self, css: str):
        from selenium.webdriver.common.by import By

        return self.d.find_element(By.CSS_SELECTOR, css)

    def text(self, css: str) -> str:
        """What an element shows: a text box's value, a code editor's text, else its text."""
        from selenium.webdriver.common.by import By

        found = self.d.find_elements(By.CSS_SELECTOR, f"{css} textarea, {css} .cm-content, {css} input")
        if found:
            return found[0].get_attribute("value") or found[0].text
        return self.el(css).text

    def wait(self, css: str, pattern: str, timeout: float = 60, whole: bool = False) -> str:
        """Wait until the element shows `pattern` (`whole`: in its text, not in a box inside it)."""
        deadline = time.monotonic() + timeout
        shown = ""
        while time.monotonic() < deadline:
            try:
                shown = self.el(css).text if whole else self.text(css)
            except Exception:  # not rendered yet
                shown = ""
            if re.search(pattern, shown):
                return shown
            time.sleep(0.5)
        self.shot("timeout")
        raise AssertionError(f"{css} never showed /{pattern}/ in {timeout:.0f} s; it shows:\n{shown}")

    def click(self, css: str) -> None:
        self.el(css).click()

    def tab(self, label: str) -> None:
        from selenium.webdriver.common.by import By

        tabs = self.d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
        next(t for t in tabs if t.text.strip() == label).click()
        time.sleep(0.5)

    def type(self, css: str, text: str) -> None:
        from selenium.webdriver.common.keys import Keys

        box = self.el(f"{css} textarea, {css} input")
        box.click()
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(Keys.DELETE)
        box.send_keys(text)
        box.send_keys(Keys.TAB)  # leave the box: Gradio takes the value

    def choose(self, css: str, value: str) -> None:
        """Pick `value` in a dropdown (typed, then its option clicked)."""
        box = self.el(f"{css} input")
        box.click()
        box.send_keys(value)
        self.wait("ul.options, ul.option-list", re.escape(value), whole=True)
        from selenium.webdriver.common.by import By

        options = self.d.find_elements(By.CSS_SELECTOR, "ul.options li, ul.option-list li")
        next(o for o in options if o.text.strip().startswith(value)).click()

    def scrolled_to_end(self, css: str) -> bool:
        return self.d.execute_script(
            f"const b = document.querySelector('{css} textarea');"
            "return b !== null && b.scrollHeight - b.scrollTop - b.clientHeight < 4;"
        )

    def read_console(self) -> None:
        self.console += self.d.get_log("browser")

    def shot(self, name: str) -> None:
        """A screenshot of the screen as it is now, numbered in order, into the test's output folder."""
        self.n += 1
        print(f"{time.monotonic() - self.started:5.0f} s  {self.n:02d}-{name}")
        self.d.save_screenshot(str(self.shots / f"{self.n:02d}-{name}.png"))


def _step(headline: str) -> int:
    found = re.search(r"step (\d+)/", headline)
    return int(found.group(1)) if found else 0


def checksums(folder: Path) -> dict[str, str]:
    import hashlib

    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


TABS = ["1 Recipe & config", "2 Data", "3 Plan", "4 Run", "5 Runs", "6 Chat", "7 Evaluate", "8 Export"]
TABS_ZH = ["1 配方与配置", "2 数据", "3 规划", "4 运行", "5 运行记录", "6 对话", "7 评测", "8 导出"]


@pytest.mark.slow
def test_the_tiny_demo_from_the_page_to_an_export(server, browser, tmp_path):
    """The whole flow with the page left open from Start to the end: Start without a recipe is refused on the Plan
    tab; pick tiny-demo, a bad key shows the CLI's message, the form writes --set items, a missing data file is
    red, a data file pages; plan, start, watch the curves grow, stop at a checkpoint (exit 143), resume, finish:
    the RL series appear without a reload, Stop is disabled, the log follows its end; a second Start into the
    finished run is refused beside Start and leaves its files byte-identical; export with the card and its result
    beside the button; evaluate with its table; the chat answers as `rlctl eval` did on the same row; compare with
    the final metrics; a second tab sees the same run; each tab in English and Chinese; no console error."""
    from selenium.webdriver.common.keys import Keys

    url, folder = server
    (folder / "mydata.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n"
                                                 for i in range(25)))  # fmt: skip
    page = Page(browser, Path(os.environ.get("RLCTL_UI_SHOTS", tmp_path / "screens")))
    browser.get(url)
    page.wait("button[role=tab]", "Recipe", whole=True)
    page.shot("load")

    page.tab("3 Plan")  # Start before any recipe: said on the Plan tab, naming what is missing
    page.click("#start")
    page.wait("#start-state", "pick a recipe on tab 1")
    page.tab("1 Recipe & config")

    page.choose("#recipe", "tiny-demo")
    page.wait("#check", "Valid: tiny-demo")
    page.wait("#form--sft--max-steps", "600")  # the form shows the recipe's values
    page.shot("recipe")

    editor = page.el("#yaml .cm-content")
    editor.click()
    editor.send_keys(Keys.CONTROL, Keys.HOME)
    editor.send_keys("sft_steps: 3\n")
    message = page.wait("#check", "unknown key 'sft_steps'")
    assert "Invalid config" in message
    page.shot("bad-key")
    editor.send_keys(Keys.CONTROL, Keys.HOME)
    editor.send_keys(Keys.SHIFT, Keys.DOWN)
    editor.send_keys(Keys.BACK_SPACE)
    page.wait("#check", "Valid: tiny-demo")

    for label in browser.find_elements("css selector", "#stages label"):
        if label.text.strip() == "rm":
            label.click()
    # 300 SFT steps, a checkpoint every 25: long enough for Stop to land mid-run on a fast machine too
    sets = [o for o in OVERRIDES if not o.startswith(("sft.max_steps", "sft.save_every"))] + ["sft.save_every=25"]
    page.type("#sets", "\n".join(sets))
    page.type("#form--sft--max-steps", "300")  # the form writes the same --set item the CLI takes
    page.wait("#sets", r"sft\.max_steps=300")
    page.wait("#check", "Valid: tiny-demo: .*stages sft, rl")

    page.tab("2 Data")
    page.type("#data-path", "missing.jsonl")
    page.click("#use-data")
    page.wait("#data-state", "no such file")
    assert "missing.jsonl" not in page.text("#sets")
    page.click("#list-data")
    page.type("#data-path", "mydata.jsonl")
    page.wait("#preview-state", "rows 1–10 of 25")
    page.click("#preview-next")
    page.wait("#preview-state", "rows 11–20 of 25")
    page.wait("#data-preview", r"11\+1=", whole=True)
    page.click("#read-data")
    data = page.wait("#data-text", r"prompt_completion", timeout=120)
    assert "Lengths sft" in data
    page.wait("#data-rows", r"prompt")
    page.shot("data")

    page.tab("3 Plan")
    page.click("#plan-btn")
    plan = page.wait("#plan-text", r"accelerate launch", timeout=120)
    assert "rl (grpo)" in plan and "rm" not in re.findall(r"^(\w+)\s", plan, re.M)
    command = page.wait("#command", "rlctl train --config configs/tiny-demo.yaml --stages sft,rl")
    assert "--set sft.max_steps=300" in command
    run_dir = re.search(r"--run-dir (\S+)", command).group(1)
    page.shot("plan")

    page.click("#start")
    first = _step(page.wait("#headline", r"sft step [1-9]|rl step", timeout=180))
    page.wait("#loss-plot", r"sft loss", whole=True)
    page.shot("run")
    later = "|".join(str(n) for n in range(first + 1, 301))
    headline = page.wait("#headline", rf"sft step ({later})/|rl step", 120)  # the curve grew (a fast machine: RL)
    assert _step(headline) > first or headline.startswith("rl")
    page.wait("#device", r"cpu: \d+ processes", whole=True)  # the run's processes, beside the plan's budget
    page.shot("run-later")

    page.wait("#headline", r"sft step (2[6-9]|[3-9]\d|[12]\d\d)/", timeout=120)  # past the first checkpoint
    page.click("#stop")
    page.wait("#job-state", r"rlctl train: stopped at a checkpoint \(exit 143\)", timeout=120)
    assert list((folder / run_dir / "sft" / "checkpoints").glob("checkpoint-*"))
    page.shot("stopped")

    page.click("#resume")
    page.wait("#job-state", r"rlctl resume: done \(exit 0\)", timeout=300)
    summary = json.loads((folder / run_dir / "summary.json").read_text())
    assert summary["completed"] == ["sft", "rl"]
    page.wait("#headline", r"rl step 2/2")
    page.wait("#reward-plot", r"rl reward", whole=True)  # series the first draw did not have, without a reload
    page.wait("#accuracy-plot", r"rl eval_accuracy", whole=True)
    assert "rl eval_accuracy" not in page.el("#scores-plot").text  # accuracies apart from margins and losses
    page.wait("#rl-samples", r"best 1[\s\S]*worst 1", whole=True)  # the latest RL step's best and worst
    time.sleep(2 * 2.5)  # a refresh or two after the end
    assert page.el("#stop button, button#stop").get_attribute("disabled") is not None  # nothing to stop
    assert page.scrolled_to_end("#log")
    page.shot("finished")

    before = checksums(folder / run_dir)  # a second Start into the finished run: refused, nothing changed
    page.tab("3 Plan")
    page.click("#start")
    page.wait("#start-state", "already holds a run")
    time.sleep(2.5)
    assert checksums(folder / run_dir) == before
    page.tab("4 Run")
    page.wait("#job-state", r"rlctl resume: done \(exit 0\)")  # the run is not marked failed

    page.tab("8 Export")
    page.click("#export-btn")
    page.wait("#card", "tiny-demo")
    page.wait("#export-state", r"rlctl export: done \(exit 0\)", timeout=180)
    assert (folder / run_dir / "export" / "config.json").is_file()
    assert "tiny-demo" in (folder / run_dir / "export" / "README.md").read_text()
    page.shot("export")

    page.tab("7 Evaluate")
    page.type("#eval-limit", "8")
    page.click("#eval-btn")
    page.wait("#eval-state", r"rlctl eval: done \(exit 0\)", timeout=180)
    page.wait("#eval-table", r"accuracy", whole=True)
    samples = [
        json.loads(x) for x in next((folder / run_dir / "eval").glob("*.samples.jsonl")).read_text().splitlines()
    ]
    page.wait("#eval-rows", re.escape(samples[0]["prompt"]), whole=True)
    page.shot("eval")

    page.tab("6 Chat")
    page.click("#list-models")
    page.wait("#model-pick", "rl/final")
    page.wait("#chat-note", "plain-text prompts", whole=True)
    asked = next(s for s in samples if s["completions"][0].strip())
    page.type("#prompt", asked["prompt"])
    page.click("#send")
    answer = page.wait("#chat", re.escape(asked["prompt"]) + r"\s*\S+", timeout=120, whole=True)
    assert answer.strip().splitlines()[-1].strip() == asked["completions"][0].strip(), (answer, asked)
    page.shot("chat")

    page.tab("5 Runs")
    page.click("#list-runs")
    page.wait("#runs-table", re.escape(run_dir), whole=True)
    for side in ("#run-a", "#run-b"):
        box = page.el(f"{side} input")
        box.click()
        box.send_keys(run_dir, Keys.ENTER)
    page.click("#compare")
    page.wait("#compare-plot", "A: sft loss", whole=True)
    page.wait("#final-table", "eval_accuracy", whole=True)
    page.shot("runs")

    for label in TABS:  # each tab in English, then in Chinese: the pictures of docs/ui.md
        page.tab(label)
        page.shot(f"en-{label.split()[0]}")
    page.click("#lang label:nth-of-type(2)")
    page.wait("button[role=tab]", TABS_ZH[0], whole=True)
    for label in TABS_ZH:
        page.tab(label)
        page.shot(f"zh-{label.split()[0]}")
    page.read_console()

    browser.switch_to.new_window("tab")  # a second tab: the same run, read from its run directory
    browser.get(url)
    page.wait("button[role=tab]", "Recipe", whole=True)
    page.tab("4 Run")
    page.wait("#watched", re.escape(run_dir))
    page.wait("#headline", r"rl step 2/2")
    page.read_console()
    errors = [e for e in page.console if e["level"] == "SEVERE" and "favicon" not in e["message"]]
    assert not errors, errors
