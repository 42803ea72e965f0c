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
import yaml

from tests.conftest import require_binary
from quipu.tasks.pipeline import STAGES
from tests.ops_helpers import ROOT, Chromium, PrefectServer, deploy_file, light_curate_config, small_jsonl, wait_until


def _post(api: str, path: str, body: dict):
    req = urllib.request.Request(api + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _artifacts(api: str, flow_run_id: str) -> dict[str, dict]:
    """The run's artifacts by the query the V2 UI's Artifacts tab sends (flow-run._id-*.js)."""
    body = {"artifacts": {"operator": "and_", "flow_run_id": {"any_": [flow_run_id]}, "type": {"not_any_": ["result"]}},
            "sort": "ID_DESC", "offset": 0}
    return {a["key"]: a for a in _post(api, "/artifacts/filter", body) if a.get("key")}


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
                              env={**os.environ, "PREFECT_API_URL": server.url, "PREFECT_LOGGING_LEVEL": "INFO"})
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        run = json.loads((out / "run.json").read_text())
        arts = _artifacts(server.url, run["run_id"])
        expected = {"browser-test-funnel", "browser-test-summary", "browser-test-progress", "browser-test-charts"} | \
                   {f"browser-test-stage-{s['name']}" for s in run["stages"]}
        assert expected <= set(arts), sorted(arts)
        assert arts["browser-test-progress"]["data"] == 100.0
        # The tab's order is by random id; the summary, made last, links every report's UI page,
        # and a log line at the run's end gives the summary's address.
        summary = arts["browser-test-summary"]
        linked = {k for k, a in arts.items() if f"/artifacts/artifact/{a['id']})" in summary["data"]}
        assert linked == expected - {"browser-test-summary", "browser-test-progress"}, linked
        assert all(arts[k]["created"] < summary["created"] for k in linked)
        line = f"summary of the run: {server.url[:-len('/api')]}/artifacts/artifact/{summary['id']}"
        wait_until(lambda: any(line in log["message"] for log in _post(
            server.url, "/logs/filter", {"logs": {"flow_run_id": {"any_": [run["run_id"]]}}})), 30, line)

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

        # The curate deployment's Custom run form: the schema `prefect deploy` stores for the flow,
        # the parameters `quipu deploy` resolves (registered through the API: a `quipu deploy`
        # process costs 10 s; the shipped-chain test runs it). The short fields, each block
        # closed ("as in config_file" selected) and named.
        from prefect.utilities.callables import parameter_schema

        from quipu.flows.curate import curate
        from quipu.flows.deploy import resolve
        spec = yaml.safe_load(deploy_file(tmp_path / "prefect.yaml", cfg, "browser-pool", ["curate"]).read_text())
        (dep,) = resolve(spec, ROOT, ["curate"], check=False)[0]["deployments"]
        flow_id = _post(server.url, "/flows/", {"name": "curate"})["id"]
        deployment = _post(server.url, "/deployments/", {
            "name": "curate", "flow_id": flow_id, "entrypoint": dep["entrypoint"], "parameters": dep["parameters"],
            "parameter_openapi_schema": parameter_schema(curate).model_dump_for_openapi(), "enforce_parameter_schema": True})
        page = browser.open(f"{base}/v2/deployments/deployment/{deployment['id']}/run")
        text = page.wait_for_text(["config file", "perplexity (Optional)", "curated (Optional)"], timeout=60)
        blocks = ["runner", "extract", "curated", *(s.name for s in STAGES)]
        assert all(f"\n{b} (Optional)" in text for b in blocks)
        selected = page.eval("Array.from(document.querySelectorAll('[role=tab][aria-selected=true]')).map(t => t.innerText)")
        assert selected.count("as in config_file") == len(blocks) and "change" not in selected, selected
        fields = page.eval("document.querySelectorAll('input, textarea, button[role=combobox]').length")
        assert fields <= 15, fields      # the run's own fields (189 with every block open)
        page.screenshot(tmp_path / "curate-form.png")
    finally:
        if browser:
            browser.stop()
        server.stop()
