"""The stage reports as a person sees them: a Prefect server with its UI, a small curate run against
it, and the run's artifacts rendered in headless Debian chromium (driven over the DevTools protocol,
since `--dump-dom` returns before the UI's API calls finish)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import require_binary
from tests.ops_helpers import ROOT, Chromium, PrefectServer, light_curate_config, small_jsonl


def _artifacts(api: str, flow_run_id: str) -> dict[str, dict]:
    body = json.dumps({"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}).encode()
    req = urllib.request.Request(api + "/artifacts/filter", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return {a["key"]: a for a in json.loads(r.read()) if a.get("key")}


@pytest.mark.slow
def test_run_artifacts_render_in_chromium(shared_data, tmp_path):
    require_binary("chromium", "chromium-browser", install="apt-get install chromium")
    server = PrefectServer(tmp_path / "prefect-ui-home", ui=True).start()
    browser = None
    try:
        inp = small_jsonl(shared_data, tmp_path / "in" / "docs.jsonl", "en_nltk_abc_news.jsonl", 30)
        small_jsonl(shared_data, tmp_path / "in" / "es.jsonl", "es_gutenberg_quijote.jsonl", 10)
        cfg = light_curate_config(tmp_path / "curate.yaml", artifact_prefix="browser-test")
        out = tmp_path / "run"
        proc = subprocess.run([sys.executable, "-m", "quipu.flows.cli", "curate", str(cfg), "--input", str(inp.parent),
                               "--output", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                              env={**os.environ, "PREFECT_API_URL": server.url})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        run = json.loads((out / "run.json").read_text())
        arts = _artifacts(server.url, run["run_id"])
        expected = {"browser-test-funnel", "browser-test-summary", "browser-test-progress", "browser-test-run-json",
                    "browser-test-charts"} | \
                   {f"browser-test-stage-{s['name']}" for s in run["stages"]}
        assert expected <= set(arts), sorted(arts)
        assert arts["browser-test-progress"]["data"] == 100.0

        browser = Chromium(tmp_path)
        base = server.url[: -len("/api")]
        # The funnel table artifact: every stage's input / kept / removed counts are on the page.
        page = browser.open(f"{base}/artifacts/artifact/{arts['browser-test-funnel']['id']}")
        numbers = [str(s[k]) for s in run["stages"] for k in ("input_docs", "kept_docs", "removed_docs")]
        text = page.wait_for_text([s["name"] for s in run["stages"]] + numbers, timeout=90)
        assert "Can't connect" not in text
        page.screenshot(tmp_path / "funnel.png")
        # The flow run's Artifacts tab lists the run's report artifacts.
        # (the default UI ignores ?tab=; the V2 UI opens the tab)
        page = browser.open(f"{base}/v2/runs/flow-run/{run['run_id']}?tab=Artifacts")
        page.wait_for_text(["browser-test-funnel", "browser-test-stage-heuristics"], timeout=60)
        shot = page.screenshot(tmp_path / "run-artifacts.png")
        assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        if browser:
            browser.stop()
        server.stop()
