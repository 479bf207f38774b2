"""The leaderboard site: built from rebench reports, checked as data and in a real browser."""
import json
import os
import shutil
from pathlib import Path

import pytest

from tasks import get_task
from tests.conftest import require
from training.leaderboard import ReportError, build_site, entries_from, load_report, main
from training.rebench_report import Sample, Turn, report_document, summarize

TASKS = ("softmax", "matmul", "geglu")   # geglu is a held-out task


def conversations(label: str, split: str, outcomes: dict[str, list[list[str]]], speedup: float | None = None
                  ) -> list[Sample]:
    """Samples with the given statuses per task: one list of per-turn statuses per sample."""
    out = []
    for task_name, per_sample in outcomes.items():
        task = get_task(task_name)
        if split == "train" and task.heldout_task:
            continue
        group = "held-out tasks" if task.heldout_task else "train tasks"
        for i, statuses in enumerate(per_sample):
            turns = [Turn(t, s, speedup if s == "correct" else None, s, "") for t, s in enumerate(statuses, 1)]
            out.append(Sample(label, task_name, group, task.level, split, i, turns))
    return out


def write_report(path: Path, samples: list[Sample], turns: int, backend: str = "tpu-interpret") -> Path:
    settings = {"samples": 2, "k": [1, 2], "turns": turns, "fast_p": 1.0, "temperature": 0.8, "max_tokens": 4096,
                "context": "none", "splits": sorted({s.split for s in samples}), "tasks": list(TASKS),
                "backend": backend, "tpu_generation": "v5e", "numerics": "tpu-default-precision",
                "evaluator_version": "0.1.0", "evaluator_code": "0123456789ab", "jax": "0.10.2"}
    models = [{"label": m, "model": f"org/{m}", "base_url": "http://localhost:8000/v1", "adapter": None}
              for m in dict.fromkeys(s.model for s in samples)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report_document(settings, models, summarize(samples, [1, 2], turns, 1.0))))
    return path


F, C = "wrong_output", "correct"


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[Path]:
    """base and tuned on both splits (two reports, 2 turns), and a timed model on train only."""
    root = tmp_path_factory.mktemp("reports")
    train = (conversations("base", "train", {"softmax": [[F, F], [C]], "matmul": [[F, F], [F, F]]})
             + conversations("tuned", "train", {"softmax": [[C], [F, C]], "matmul": [[F, C], [C]]}))
    heldout = (conversations("base", "heldout", {"softmax": [[F, F], [F, F]], "matmul": [[C], [F, F]],
                                                 "geglu": [[F, C], [F, F]]})
               + conversations("tuned", "heldout", {"softmax": [[F, C], [F, C]], "matmul": [[C], [F, C]],
                                                    "geglu": [[F, F], [F, F]]}))
    timed = conversations("on-tpu", "train", {"softmax": [[C], [C]], "matmul": [["timeout"], [C]]}, speedup=1.4)
    return [write_report(root / "train" / "report.json", train, 2),
            write_report(root / "heldout" / "report.json", heldout, 2),
            write_report(root / "tpu" / "report.json", timed, 1, backend="tpu")]


def test_rows_merge_splits_rank_and_keep_not_timed_apart_from_zero(reports):
    entries = entries_from([(str(p), load_report(p)) for p in reports])
    assert [e.label for e in entries] == ["on-tpu", "tuned", "base"]   # by train-task pass@1 at turn 1
    tpu, tuned, base = entries
    assert set(tuned.results) == {"train", "heldout"} and len(tuned.sources) == 2
    assert tuned.headline("train", "train tasks", 1) == pytest.approx(0.5)
    assert tuned.headline("train", "train tasks", None) == pytest.approx(1.0)
    assert tuned.headline("heldout", "held-out tasks", None) == 0.0
    assert base.headline("heldout", "held-out tasks", None) == pytest.approx(0.5)
    assert tpu.headline("heldout", "train tasks", 1) is None       # not measured there
    assert tuned.fast() is None and tpu.fast() == pytest.approx(0.75)


def test_the_page_says_not_timed_and_links_its_reports(reports, tmp_path):
    index = build_site(reports, tmp_path / "site")
    html = index.read_text()
    assert html.count('<span class="muted">not timed</span>') == 2 and "75.0%" in html
    for name in ("style.css", "table-sort.js", "turns.png", "status_mix.png"):
        assert (index.parent / name).stat().st_size > 0
    assert len(list((index.parent / "reports").glob("*.json"))) == 3


def test_bad_reports_are_one_line_errors(reports, tmp_path, capsys):
    not_json = tmp_path / "a.json"
    not_json.write_text("{oops")
    other = tmp_path / "b.json"
    other.write_text(json.dumps({"results": {}}))
    for path, words in ((tmp_path / "missing.json", "not found"), (not_json, "not JSON"),
                        (other, "not a rebench report")):
        assert main([str(path), "--out", str(tmp_path / "site")]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1
    with pytest.raises(ReportError, match="two train results"):
        entries_from([("a", load_report(reports[0])), ("b", load_report(reports[0]))])


def chromium() -> tuple[str | None, str | None]:
    return (shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver"))


def test_the_site_in_a_real_browser(reports, tmp_path):
    browser, driver_path = chromium()
    require(browser is not None and driver_path is not None,
            "Chromium and its driver are not installed (Debian: apt-get install chromium chromium-driver)")
    require(__import__("importlib").util.find_spec("selenium") is not None,
            "selenium is not installed (pip install -e '.[test]')")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    index = build_site(reports, tmp_path / "site")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the system's driver: Selenium Manager would otherwise try to download one
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(index.as_uri())

        def models() -> list[str]:
            return [row.find_element(By.CSS_SELECTOR, "td.model strong").text
                    for row in driver.find_elements(By.CSS_SELECTOR, "#ranking-table tbody tr")]

        assert models() == ["on-tpu", "tuned", "base"]          # one row per model, ranked
        header = driver.find_elements(By.CSS_SELECTOR, "#ranking-table thead th")
        held_out_tasks_last = next(h for h in header if h.text.startswith("held-out tasks") and "≤T" in h.text)
        held_out_tasks_last.click()                              # best first; the unmeasured row last
        assert models() == ["base", "tuned", "on-tpu"]
        held_out_tasks_last.click()
        assert models()[:2] == ["tuned", "base"]
        next(h for h in header if h.text == "model").click()
        assert models() == ["base", "on-tpu", "tuned"]
        images = driver.find_elements(By.TAG_NAME, "img")
        assert len(images) == 2
        assert all(driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
                   for img in images)
        assert driver.find_elements(By.CSS_SELECTOR, "#task-table tbody tr")  # the per-task table is there
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        if os.environ.get("LEADERBOARD_SCREENSHOT"):
            driver.save_screenshot(os.environ["LEADERBOARD_SCREENSHOT"])
    finally:
        driver.quit()
