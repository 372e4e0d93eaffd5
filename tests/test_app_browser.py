"""End-to-end test of ``trainfit app`` in headless Chromium (Debian's ``chromium`` via Playwright).

Starts the app on a free 127.0.0.1 port, drives it like a student — change track, strategy and batch,
make a prediction, switch on the physical model, walk the frontier, plan and free-mode views,
download the report — and checks that every number on screen equals the library's for the same
inputs (:mod:`trainfit.labs`, :func:`trainfit.estimate`), within the precision it is printed with.
A few figures are also anchored to the upstream lab's worked results
(MLSys·im reference notes, upstream.md §4.5), so a library regression cannot hide behind "app == library".
The page must not fetch anything from outside 127.0.0.1 (the app works offline).

Needs: ``chromium`` on PATH (``.ci/install-browser.sh`` installs Debian's; ``TRAINFIT_CHROMIUM``
overrides the path), ``playwright`` and ``marimo`` (the ``test`` extra). Without a browser (or playwright)
the test is SKIPPED with a one-line reason, so a clone runs its suite anywhere; with
``TRAINFIT_REQUIRE_BROWSER=1`` (set by ``.ci/run``) the same condition FAILS it, so CI cannot pass
without having run it.

Set ``TRAINFIT_APP_SCREENSHOTS=DIR`` to save one screenshot per view (used for ``docs/app-*.png``).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, NoReturn

import pytest

import trainfit
from trainfit.app import views
from trainfit.labs import lab_report, load_training_profile
from trainfit.planner import plan as layout_plan
from trainfit.report.labs import lab_report_markdown

REPO = Path(__file__).resolve().parents[1]
SCREENSHOTS = os.environ.get("TRAINFIT_APP_SCREENSHOTS")
TIMEOUT_MS = 30_000
#: set (to anything but "" or "0") where the browser test must run: a missing browser then fails it
REQUIRE_BROWSER = os.environ.get("TRAINFIT_REQUIRE_BROWSER", "") not in ("", "0")

pytestmark = pytest.mark.slow


def _unavailable(reason: str) -> NoReturn:
    """Skip (one line) where the browser test cannot run, or fail where it is required."""
    if REQUIRE_BROWSER:
        pytest.fail(f"{reason} (TRAINFIT_REQUIRE_BROWSER is set, so this test must run)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Path of the Chromium to drive: ``TRAINFIT_CHROMIUM`` if set, else ``chromium`` on PATH. Checked
    before the app server starts, so a skip costs nothing."""
    override = os.environ.get("TRAINFIT_CHROMIUM")
    if override:
        path = shutil.which(override)  # a path or a command name; None unless it is an executable
        if not path:
            _unavailable(f"TRAINFIT_CHROMIUM={override} is not an executable Chromium")
    else:
        path = shutil.which("chromium") or shutil.which("chromium-browser")
        if not path:
            _unavailable("Chromium not found on PATH: install Debian's chromium (bash .ci/install-browser.sh) "
                         "or point TRAINFIT_CHROMIUM at a Chromium binary")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _unavailable("playwright is not installed (the browser itself is Debian's chromium): "
                     "pip install -e '.[test]'")
    return path


@pytest.fixture(scope="module")
def app_url(chromium: str):
    """``trainfit app --port 0 --headless`` in a subprocess; yields a function that waits for and
    returns its URL (so the browser can start while the server boots), stops it afterwards. Needs
    ``chromium`` only so that the server is not started when the test is skipped."""
    proc = subprocess.Popen([sys.executable, "-m", "trainfit", "app", "--port", "0", "--headless"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    found = threading.Event()

    def pump() -> None:  # keep draining the pipe so the server never blocks on a full buffer
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "http://" in line:
                found.set()

    def url() -> str:
        if not found.wait(60):
            pytest.fail("trainfit app printed no URL within 60 s:\n" + "".join(lines), pytrace=False)
        hit = re.search(r"http://127\.0\.0\.1:\d+/", "".join(lines))
        assert hit, "".join(lines)
        return hit.group(0)

    threading.Thread(target=pump, daemon=True).start()
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _num(text: str) -> float:
    return float(text.replace(",", "").replace("%", "").strip())


def _close(shown: str, expected: float, digits: int) -> bool:
    """Does ``shown`` print ``expected`` with ``digits`` decimals (2 significant digits below 10^-digits,
    the report's rule for tiny values)?"""
    value = _num(shown)
    if expected != 0 and abs(expected) < 10 ** -digits:
        return abs(value - expected) <= 0.05 * abs(expected)
    return abs(value - expected) <= 0.5 * 10 ** -digits + 1e-9


def _table(page: Any, testid: str) -> dict[str, dict[str, str]]:
    """A displayed table as ``{data-row: {data-col: text}}``."""
    return page.get_by_test_id(testid).first.evaluate(  # an accordion keeps a hidden copy
        """t => Object.fromEntries([...t.querySelectorAll('tbody tr')].map(r => [r.dataset.row,
             Object.fromEntries([...r.querySelectorAll('td')].map(c => [c.dataset.col, c.innerText.trim()]))]))""")


def _text(page: Any, testid: str) -> str:
    return page.get_by_test_id(testid).inner_text().strip()


def _wait_for(page: Any, testid: str, expected: str) -> None:
    from playwright.sync_api import expect

    expect(page.get_by_test_id(testid)).to_have_text(expected, timeout=TIMEOUT_MS)


def _shoot(page: Any, name: str) -> None:
    """Save a screenshot of the whole notebook (the page scrolls inside an app container)."""
    if not SCREENSHOTS:
        return
    time.sleep(0.8)  # let images finish decoding
    height = page.evaluate("() => Math.max(...[...document.querySelectorAll('*')].map(e => e.scrollHeight))")
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 40, 4000)})
    time.sleep(0.5)
    Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(Path(SCREENSHOTS) / f"app-{name}.png"))
    page.set_viewport_size({"width": 1400, "height": 1000})


def _check_stacks(page: Any, profile: Any, batch: int, strategy_id: str) -> Any:
    """Displayed stack table and key figures == the library's lab report at (track, strategy, batch)."""
    report = lab_report(profile, strategy_id=strategy_id, batch_size=batch)
    shown = _table(page, "stack-table")
    assert list(shown) == [s.strategy_id for s in report.stacks]
    for s in report.stacks:
        row = shown[s.strategy_id]
        assert row["batch"] == str(batch)
        for col, digits in (("weights_mb", 3), ("gradients_mb", 3), ("optimizer_mb", 3), ("activations_mb", 3),
                            ("data_batch_mb", 3), ("total_mb", 2), ("budget_mb", 2),
                            ("memory_utilization_pct", 1), ("throughput_samples_s", 2)):
            assert _close(row[col], getattr(s, col), digits), (s.strategy_id, col, row[col], getattr(s, col))
        assert row["dominant_component"] == s.dominant_component
        assert row["feasible"] == ("yes" if s.feasible else "no")
    sel = next(s for s in report.stacks if s.strategy_id == strategy_id)
    assert _close(_text(page, "sel-total-mb"), sel.total_mb, 2)
    assert _close(_text(page, "sel-budget-mb"), sel.budget_mb, 2)
    assert _close(_text(page, "sel-util-pct"), sel.memory_utilization_pct, 1)
    assert _close(_text(page, "sel-throughput"), sel.throughput_samples_s, 2)
    assert _text(page, "sel-dominant") == sel.dominant_component
    assert _text(page, "sel-feasible") == ("yes" if sel.feasible else "no")
    return report


def test_app_in_headless_chromium(chromium: str, app_url: Callable[[], str]) -> None:
    from playwright.sync_api import sync_playwright

    started = time.monotonic()
    laps: list[tuple[str, float]] = [("start", started)]
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            page.on("request", lambda r: requests.append(r.url))
            url = app_url()
            page.goto(url)
            page.get_by_test_id("stack-table").wait_for(timeout=60_000)

            laps.append(('step 1', time.monotonic()))
            # 1. Defaults: the first track (iPhone), its first strategy, its default batch 8.
            iphone = load_training_profile("iphone")
            first = iphone.strategy_options[0]
            _wait_for(page, "sel-batch", str(iphone.default_batch_size))
            _wait_for(page, "sel-strategy", first.label)
            report = _check_stacks(page, iphone, 8, first.strategy_id)
            # Upstream §4.5 at B=8: full on-device 163.81 MB (not feasible, activations dominant),
            # LoRA 15.70 MB, central training 11.81 MB (both feasible).
            rows = _table(page, "stack-table")
            assert [(_num(rows[k]["total_mb"]), rows[k]["feasible"]) for k in
                    ("full_on_device", "lora_personalization", "central_train_local_eval")] == \
                [(163.81, "no"), (15.70, "yes"), (11.81, "yes")]

            laps.append(('step 2', time.monotonic()))
            # 2. The prediction is checked against the lab's dominant component.
            page.get_by_role("radio", name="activations", exact=True).click()
            page.get_by_text("Correct — ").wait_for(timeout=TIMEOUT_MS)
            assert report.stacks[0].dominant_component == "activations"

            laps.append(('step 3', time.monotonic()))
            # 3. Change track (alias labels shown), strategy and batch.
            cloud = load_training_profile("cloud")
            page.get_by_role("radio", name=re.compile("Cloud Fleet")).click()
            _wait_for(page, "sel-strategy", cloud.strategy_options[0].label)
            mixed = next(s for s in cloud.strategy_options if s.strategy_id == "mixed_checkpointed")
            page.locator("marimo-dropdown[data-label*='Strategy'] select").select_option(
                label=f"{mixed.label} [{mixed.strategy_id}]")
            _wait_for(page, "sel-strategy", mixed.label)
            batch_box = page.locator("marimo-slider[data-label*='Batch size'] input")
            batch_box.fill("20")
            batch_box.press("Enter")
            _wait_for(page, "sel-batch", "20")
            report = _check_stacks(page, cloud, 20, "mixed_checkpointed")
            # Upstream §4.5: 20 is mixed_checkpointed's first infeasible batch (memory budget 70,000 MB).
            assert _text(page, "sel-feasible") == "no"

            laps.append(('step 4', time.monotonic()))
            # 4. The physical model side by side.
            page.locator("marimo-switch button[role=switch]").click()
            page.get_by_test_id("physics-table").wait_for(timeout=TIMEOUT_MS)
            physics = _table(page, "physics-table")
            for v in report.physics:
                assert _close(physics[v.strategy_id]["physics_total_mb"], v.total_mb, 2)
                assert physics[v.strategy_id]["physics_fit"] == v.physics_fit
                assert physics[v.strategy_id]["agree"] == ("yes" if v.agree else "NO")
            _shoot(page, "stack")

            laps.append(('step 5', time.monotonic()))
            # 5. Frontier of the selected strategy: §4.5 says largest feasible 19, first infeasible 20.
            page.get_by_role("tab", name=re.compile("Batch frontier")).click()
            _wait_for(page, "fr-max-feasible", "19")
            assert report.frontier.max_feasible_batch == 19
            assert _text(page, "fr-first-infeasible") == str(report.frontier.first_infeasible_batch) == "20"
            _shoot(page, "frontier")
            page.get_by_text("Every batch of the range").click()
            frontier = _table(page, "frontier-table")
            assert [int(k) for k in frontier] == [p.batch_size for p in report.frontier.points]
            for p in report.frontier.points:
                assert _close(frontier[str(p.batch_size)]["total_mb"], p.total_mb, 2)
                assert frontier[str(p.batch_size)]["feasible"] == ("yes" if p.feasible else "no")

            laps.append(('step 6', time.monotonic()))
            # 6. Plan: memo, rejected alternatives, validation tests, and the downloadable report.
            page.get_by_role("tab", name=re.compile("Plan")).click()
            plan = report.plan
            _wait_for(page, "plan-selected", plan.selected_label)
            assert _text(page, "plan-memo") == f"Memo. {plan.memo_summary}"
            assert _close(_text(page, "plan-total-mb"), plan.total_memory_mb, 2)
            assert page.get_by_test_id("rejected").locator("li").all_inner_texts() == list(plan.rejected_alternatives)
            assert page.get_by_test_id("validation-tests").locator("li").all_inner_texts() == \
                list(cloud.validation_tests)
            # The student's reflection goes into the download after the library's report, with the prediction.
            note = "Selective recomputation fits only up to batch 19; measure batch 16 first."
            box = page.locator("marimo-text-area[data-label*='Reflection'] textarea")
            box.fill(note)
            box.blur()  # marimo sends a text area's value when it loses focus
            status = page.get_by_test_id("notes-status").filter(has_text=f"({len(note)} characters)")
            status.wait_for(timeout=TIMEOUT_MS)
            with page.expect_download(timeout=TIMEOUT_MS) as dl:
                page.get_by_text("Download the report (markdown)").click()
            downloaded = Path(dl.value.path()).read_text()
            assert downloaded.startswith(lab_report_markdown(report))  # the CLI's report, unchanged
            assert "predicted **activations**, lab result **activations** (correct)" in downloaded
            assert downloaded.rstrip().endswith(note)
            _shoot(page, "plan")

            laps.append(('step 7', time.monotonic()))
            # 7. Free mode: any catalog model and hardware through trainfit.estimate.
            page.get_by_role("tab", name=re.compile("Free mode")).click()
            page.get_by_test_id("free-estimate").wait_for(timeout=TIMEOUT_MS)
            seq_box = page.locator("marimo-number[data-label*='Sequence length'] input")
            seq_box.fill("1024")
            seq_box.press("Enter")
            page.get_by_text("seq 1024").wait_for(timeout=TIMEOUT_MS)
            page.locator("marimo-dropdown[data-label*='Activation checkpointing'] select").select_option("selective")
            page.get_by_text("checkpointing selective").wait_for(timeout=TIMEOUT_MS)
            # the default method is the engine's default for the model (detailed: it has an architecture)
            page.get_by_test_id("free-estimate").get_by_text("method: detailed").first.wait_for(timeout=TIMEOUT_MS)
            est = trainfit.estimate("llama-3.1-8b", "h100", batch=8, seq_len=1024, checkpointing="selective")
            assert est.method == "detailed"
            total_row = page.get_by_test_id("free-estimate").locator("tr", has_text="total")
            assert _close(total_row.locator("td").nth(1).inner_text(), est.total_bytes / 1e9, 3)
            _shoot(page, "free")
            # first-order by name: MLSys·im golden case (Llama-3.1-8B, H100, b=8, s=1024, 16-bit, Adam, selective)
            method_box = page.locator("marimo-dropdown[data-label*='Memory method'] select")
            method_box.select_option("first-order")
            page.get_by_test_id("free-estimate").get_by_text("method: first-order").first.wait_for(timeout=TIMEOUT_MS)
            est = trainfit.estimate("llama-3.1-8b", "h100", method="first-order", batch=8, seq_len=1024,
                                    checkpointing="selective")
            total_row = page.get_by_test_id("free-estimate").locator("tr", has_text="total")
            shown_gb = total_row.locator("td").nth(1).inner_text()
            assert _close(shown_gb, est.total_bytes / 1e9, 3), (shown_gb, est.total_bytes)
            assert _num(shown_gb) == 165.790
            method_box.select_option(label=views.DEFAULT_METHOD)
            page.get_by_test_id("free-estimate").get_by_text("method: detailed").first.wait_for(timeout=TIMEOUT_MS)

            laps.append(('step 8', time.monotonic()))
            # 8. The planner one click away: same inputs, 8 accelerators.
            page.get_by_role("radio", name=re.compile("^Plan: best layouts")).click()
            page.get_by_test_id("free-plan").wait_for(timeout=TIMEOUT_MS)
            best = layout_plan("llama-3.1-8b", "h100", 8, global_batch=8, seq_len=1024)
            summary = page.get_by_test_id("free-plan").inner_text()
            assert f"{best.fitting} fit, {best.searched - best.fitting} do not" in summary
            assert f"Plan: {best.model} on 8 x {best.hardware}" in summary
            _shoot(page, "free-plan")
        finally:
            browser.close()

    laps.append(("end", time.monotonic()))
    print("browser test timings (s): "
          + ", ".join(f"{a[0]}→{b[0]} {b[1] - a[1]:.1f}" for a, b in zip(laps, laps[1:])))
    # Offline: every request went to the app itself.
    assert requests, "the browser made no requests"
    outside = sorted({u for u in requests if not u.startswith(url.rstrip("/")) and
                      not u.startswith(("data:", "blob:"))})
    assert not outside, f"the page fetched from outside the app: {outside[:5]}"
    assert time.monotonic() - started < 120
