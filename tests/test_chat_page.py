"""The chat page at / (ggflow/serving/static), in a real headless browser (Debian's chromium driven by selenium):
a typed message gets a streamed reply equal to what the API answers for the same conversation and settings,
Stop ends a generation (and the server's slot with it), and what the model writes is shown, never run."""
from __future__ import annotations

import os
import re
import shutil
import time

import httpx
import pytest

pytest.importorskip("fastapi")
import openai  # noqa: E402

from ggflow.api import default_model_path  # noqa: E402
from ggflow.serving.app import ServerState  # noqa: E402
from ggflow.serving.chat_page import STATIC  # noqa: E402
from ggflow.serving.engine import Engine  # noqa: E402
from tests.test_serving_http import serving  # noqa: E402

KEY = "page-key"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/lib/chromium/chromedriver"
                                                if os.path.exists("/usr/lib/chromium/chromedriver") else None)


@pytest.fixture(scope="module")
def server():
    engine = Engine.load(default_model_path(), n_ctx=2048, n_slots=2, n_threads=1)
    engine.start()
    with serving(ServerState(model_name="smollm2", api_key=KEY, engine=engine)) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def wait_for(condition, timeout=120.0, every=0.02, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def open_page(browser, server, system="", temperature="0", max_tokens="32"):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    browser.execute_script("localStorage.clear()")
    browser.get(server + "/")
    fields = {"api-key": KEY, "system": system, "temperature": temperature, "max-tokens": max_tokens}
    for field, value in fields.items():
        element = browser.find_element(By.ID, field)
        element.clear()
        element.send_keys(value)
    browser.execute_script("document.getElementById('api-key').dispatchEvent(new Event('change'))")
    wait_for(lambda: browser.execute_script("return document.getElementById('model').value") == "smollm2",
             what="the model list")


def assistant_state(browser) -> tuple[str | None, str]:
    return tuple(browser.execute_script(
        "const m = [...document.querySelectorAll('.message.assistant')].pop();"
        "return m ? [m.dataset.state, m.querySelector('.content').textContent] : [null, ''];"))


def rendered_text(browser, text: str) -> str:
    """What the page shows for ``text`` (code fences become blocks, so the fence marks are not shown)."""
    return browser.execute_script("const d = document.createElement('div'); GGFlowRender.renderInto(d, arguments[0]);"
                                  "return d.textContent;", text)


def test_a_typed_message_gets_the_streamed_reply_the_api_gives(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    system, question = "You are a terse assistant.", "Name three <b>colours</b>."
    open_page(browser, server, system=system, temperature="0", max_tokens="32")
    browser.find_element(By.ID, "input").send_keys(question, Keys.ENTER)
    partial_lengths = set()

    def finished():
        state, text = assistant_state(browser)
        if state == "streaming" and text:
            partial_lengths.add(len(text))
        return state not in (None, "streaming")
    wait_for(finished, what="the reply")
    state, shown = assistant_state(browser)
    assert state == "done"
    assert len(partial_lengths) >= 2, "the reply was not rendered as it streamed"
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)
    expected = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=32, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": question}]).choices[0].message.content
    assert shown == rendered_text(browser, expected)
    user = browser.find_elements(By.CSS_SELECTOR, ".message.user .content")[-1]
    assert user.text == question and not user.find_elements(By.TAG_NAME, "b")   # shown as text, not HTML


def test_stop_ends_the_generation_and_frees_the_slot(browser, server):
    from selenium.webdriver.common.by import By

    open_page(browser, server, temperature="0", max_tokens="1500")
    browser.find_element(By.ID, "input").send_keys("Count from 1 to 1000, one number per line.")
    browser.find_element(By.ID, "send").click()
    wait_for(lambda: len(assistant_state(browser)[1]) > 10, what="the first tokens")
    browser.find_element(By.ID, "stop").click()
    wait_for(lambda: assistant_state(browser)[0] == "stopped", timeout=10, what="the stop")
    stopped_at = assistant_state(browser)[1]
    time.sleep(1.0)
    assert assistant_state(browser)[1] == stopped_at, "text kept arriving after Stop"
    assert browser.find_element(By.ID, "send").is_enabled() and not browser.find_element(By.ID, "stop").is_enabled()
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as h:
        wait_for(lambda: not any(s["is_processing"] for s in h.get("/slots").json()), timeout=15,
                 what="the server to cancel the request")


def test_code_blocks_render_and_model_html_is_never_run(browser, server):
    open_page(browser, server)
    reply = ("Here:\n```html\n<script>window.pwned = 1</script><img src=x onerror=\"window.pwned=2\">\n```\n"
             "and `<i>inline</i>` plus <img src=y onerror=\"window.pwned=3\">\n```python\nprint('open fence')")
    html = browser.execute_script(
        "const d = document.createElement('div'); document.body.appendChild(d);"
        "GGFlowRender.renderInto(d, arguments[0]); return d.innerHTML;", reply)
    time.sleep(0.2)
    assert browser.execute_script("return window.pwned === undefined")
    blocks = re.findall(r'<pre><code class="language-(\w+)">', html)
    assert blocks == ["html", "python"]                   # the unclosed fence renders too (as while streaming)
    assert "&lt;script&gt;" in html and "<script" not in html and "<img" not in html and "<i>" not in html
    assert "<code>&lt;i&gt;inline&lt;/i&gt;</code>" in html


def test_the_page_and_its_files_come_from_the_package_without_a_key(server):
    with httpx.Client(base_url=server, timeout=30) as h:
        page = h.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for name in ("chat.js", "render.js", "chat.css"):
            r = h.get(f"/static/{name}")
            assert r.status_code == 200 and r.text == (STATIC / name).read_text()
        assert h.get("/static/nothing.js").status_code == 404
        assert h.get("/static/../app.py").status_code == 404
        assert h.get("/v1/models").status_code == 401     # the API still needs the key
    for path in STATIC.iterdir():   # nothing from elsewhere: no CDN, no remote fonts
        assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", path.read_text()), path.name


def test_a_refused_request_shows_the_servers_message(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_page(browser, server)
    key = browser.find_element(By.ID, "api-key")
    key.clear()
    key.send_keys("wrong-key")
    browser.find_element(By.ID, "input").send_keys("Hello", Keys.ENTER)
    error = browser.find_element(By.ID, "error")
    wait_for(lambda: error.is_displayed() and "Invalid API Key" in error.text, timeout=30, what="the error")
    assert not browser.find_elements(By.CSS_SELECTOR, ".message.assistant")   # no empty reply left behind
    assert browser.find_element(By.ID, "send").is_enabled()
