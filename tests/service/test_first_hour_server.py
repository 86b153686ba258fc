"""A new user's first hour with the server (issue 25): what `make run` runs (`hallmark
quickstart`) started as a process in an empty directory, with `hallmark` not on PATH, and
then used as README says.

* item 2: README's "Try it" (its curl block, then the `openai` client and httpx) runs as written
  against it, after the `export` line its banner prints (issue 34, item 8: on any port);
* item 3: the banner prints the exact command that puts `hallmark` on PATH, and it works;
* item 5: a second server on the same port is refused before it creates or prints anything,
  naming a free port and `PORT=`;
* item 12: its log has one line per request (4xx included), JSON with
  HALLMARK_LOG_FORMAT=json (text otherwise), with a request id the response carries, and
  never a token, a body or a query string.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.service.engine_models import TEST_DRAFT, TEST_MODEL

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
VENV_BIN = str(Path(sys.executable).parent)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _user_env(**extra: str) -> dict[str, str]:
    """A new user's shell: no HALLMARK_* settings, and the venv's bin directory (where
    `hallmark` lives) not on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HALLMARK_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != Path(VENV_BIN).resolve())
    env.pop("VIRTUAL_ENV", None)
    env.update({"PYTHONPATH": str(REPO), "HALLMARK_DEVICE": "cpu", "HALLMARK_MODEL": TEST_MODEL,
                "HALLMARK_DRAFT_MODEL": TEST_DRAFT, **extra})
    return env


class Server:
    def __init__(self, directory: Path, port: int, log_format: str, command: str = "quickstart",
                 env: dict[str, str] | None = None) -> None:
        self.directory, self.port = directory, port
        self.url = f"http://127.0.0.1:{port}"
        self.out, self.err = directory / "stdout.txt", directory / "stderr.txt"
        self.env = env or _user_env(HALLMARK_LOG_FORMAT=log_format)
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen([sys.executable, "-m", "service.cli", command, "--port", str(port)],
                                            cwd=directory, env=self.env, stdout=out, stderr=err)
        deadline = time.time() + 300
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.err.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("the server did not become ready")
            time.sleep(0.3)

    def stdout(self) -> str:
        return self.out.read_text()

    def log_lines(self) -> list[str]:
        return self.err.read_text().splitlines()

    def token(self) -> str:
        return re.search(r"API token for 'demo' \(shown once, store it now\): (hm_\S+)", self.stdout()).group(1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # what Ctrl-C in `make run` sends
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = Server(tmp_path_factory.mktemp("first-hour"), _free_port(), "json")
    yield running
    running.stop()


def _access_lines(server: Server, request_id: str, timeout: float = 30) -> list[dict]:
    """The JSON access lines of ``request_id`` (they are written once the answer is sent)."""
    deadline = time.time() + timeout
    while True:
        lines = [json.loads(line) for line in server.log_lines() if request_id in line]
        found = [line for line in lines if line.get("logger") == "hallmark.access"]
        if found or time.time() > deadline:
            return found
        time.sleep(0.1)


# --- item 3: the CLI on PATH -------------------------------------------------------------------


def test_the_banner_gives_the_exact_command_that_makes_hallmark_work(server):
    banner = [line for line in server.stdout().splitlines() if line.startswith("the CLI")]
    assert len(banner) == 1, server.stdout()
    setup = re.match(r"the CLI: run `(source [^`]+)` once in your shell", banner[0])
    assert setup, banner[0]
    shell = dict(server.env)
    assert subprocess.run(["bash", "-c", "command -v hallmark"], env=shell, capture_output=True).returncode != 0
    # Follow the banner literally, in the user's shell and directory.
    run = subprocess.run(["bash", "-c", f"{setup.group(1)} && command -v hallmark && hallmark doctor --json"],
                         cwd=server.directory, env=shell, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    found, report = run.stdout.split("\n", 1)
    assert Path(found).resolve() == (Path(VENV_BIN) / "hallmark").resolve()
    assert json.loads(report)["ok"] is True  # the CLI sees the server's database and KEK
    # The other way the banner offers: the script's path, as it is.
    direct = re.search(r"or call `([^`]+) --help` as it is", banner[0]).group(1)
    assert subprocess.run(["bash", "-c", f"{direct} --help"], cwd=server.directory, env=shell,
                          capture_output=True).returncode == 0


def test_the_cli_line_is_plain_when_hallmark_is_already_on_path(monkeypatch):
    from service.cli import invocation

    monkeypatch.setenv("PATH", VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    if not invocation.on_path():
        pytest.skip("this interpreter has no `hallmark` console script beside it")
    assert invocation.banner_line() == "the CLI: `hallmark --help` (`hallmark doctor` checks the set-up)"
    assert invocation.command("tokens issue --tenant demo") == "hallmark tokens issue --tenant demo"


# --- item 2 (and issue 34, item 8): README's "Try it", on this server's free port -------------------


def _readme_try_it() -> tuple[str, str]:
    """README's "Try it": its bash block, and its two Python blocks (the `openai` client, then
    httpx) as one session, exactly as written."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Try it", 1)[1].split("\n## ", 1)[0]
    [bash] = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2 and "from openai import OpenAI" in blocks[0] and "httpx.post" in blocks[1]
    # Nothing in it names a port: it reads the URL the banner exports.
    assert not re.search(r"localhost|127\.0\.0\.1|:8000", bash + "".join(blocks)), "a hard-coded address"
    return bash, "\n".join(blocks)


def _banner_export(server: Server) -> str:
    """The `export …` the banner prints for README's "Try it" (first run: URL and token)."""
    lines = [line for line in server.stdout().splitlines() if line.startswith("README's \"Try it\"")]
    assert len(lines) == 1, server.stdout()
    export = re.fullmatch(r"README's \"Try it\", in another shell: `(export HALLMARK_URL=\S+ TOKEN=hm_\S+)`",
                          lines[0])
    assert export, lines[0]
    assert f"HALLMARK_URL={server.url} " in export.group(1) and f"TOKEN={server.token()}" in export.group(1)
    return export.group(1)


def _in_users_shell(server: Server, script: str, **env: str) -> subprocess.CompletedProcess:
    """``script`` in bash after the banner's export, in the user's environment (no HALLMARK_*
    settings of its own) with the venv's python first on PATH, as `source .venv/bin/activate`
    leaves it."""
    shell = {**server.env, "PATH": VENV_BIN + os.pathsep + server.env["PATH"], **env}
    return subprocess.run(["bash", "-c", f"set -e\n{_banner_export(server)}\n{script}"], env=shell,
                          capture_output=True, text=True, timeout=600, cwd=server.directory)


def test_the_readmes_curl_commands_run_as_written(server):
    """README's bash block, as written after the banner's export: generate (asking again while
    the demo model ends early), detect, the public check, the record, and the receipt checked
    offline with the log key pinned on first use. Issue 34, item 4: its example was 150 tokens,
    "too short" for the public check (200); item 6: `receipt verify` needed --trust-log-key."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    bash, _ = _readme_try_it()
    # The one change: the scratch file, so that two runs of this test on one machine cannot race.
    assert bash.count("/tmp/out.json") == 7
    bash = bash.replace("/tmp/out.json", str(server.directory / "out.json"))
    # The user's pinned log keys (~/.config/hallmark/known-logs) stay out of the test.
    run = _in_users_shell(server, bash, HALLMARK_KNOWN_LOGS=str(server.directory / "known-logs"))
    assert run.returncode == 0, run.stderr
    decoder, answers, rest = json.JSONDecoder(), [], run.stdout.strip()
    while rest.startswith("{"):
        answer, end = decoder.raw_decode(rest)
        answers.append(answer)
        rest = rest[end:].strip()
    generated, detected, public, record = answers
    assert generated["text"] and generated["watermark"]["watermarked_tokens"] > 0
    assert generated["usage"]["completion_tokens"] >= 250, generated["usage"]
    assert detected["tier"] == "tenant" and isinstance(detected["watermarked"], bool)
    assert public["tier"] == "public" and public["verdict"] != "too_short" and public["tokens"] >= 200, public
    assert record["id"] == generated["generation_id"] and record["tenant"] == "demo"
    assert rest.startswith("pinned on first use") and "compare it with the key its operator publishes" in rest, rest
    assert rest.splitlines()[-1].startswith(f"ok: receipt of generation {generated['generation_id']} (tenant demo"), rest


def test_the_readmes_openai_example_runs_as_written(server):
    _, code = _readme_try_it()
    # The venv's python, which `make run` installs (with the `openai` client), after the export
    # the banner prints: nothing in the code is changed, whatever the port.
    run = _in_users_shell(server, 'exec python -c "$README_CODE"', README_CODE=code)
    assert run.returncode == 0, run.stderr
    generation_id = re.search(r"\b([0-9a-f]{32})\b", run.stdout).group(1)
    last = run.stdout.strip().splitlines()[-1]
    # watermarked, basis, scored_as (its own text, an exact copy: the generation's ids), log10 p, key
    assert re.match(r"(True|False) \[('watermark'|'ledger'|, )*\] generation_ids -?\d", last), run.stdout
    record = httpx.get(f"{server.url}/v1/generations/{generation_id}",
                       headers={"Authorization": f"Bearer {server.token()}"}, timeout=30)
    assert record.status_code == 200 and record.json()["tenant"] == "demo"
    # The three calls are in the log, with their route templates.
    routes = {(line["route"], line["status"]) for line in map(json.loads, server.log_lines())
              if line.get("logger") == "hallmark.access"}
    assert {("/v1/completions", 200), ("/v1/chat/completions", 200), ("/v1/detect", 200)} <= routes


def test_the_try_it_line_names_a_reachable_url_and_the_token_only_when_printed():
    from service.cli.serve import try_it_line

    assert try_it_line("0.0.0.0", 8123, "hm_x") == (
        "README's \"Try it\", in another shell: `export HALLMARK_URL=http://127.0.0.1:8123 TOKEN=hm_x`")
    assert "`export HALLMARK_URL=http://[::1]:8123`" in try_it_line("::", 8123, None)
    assert "TOKEN=hm" not in try_it_line("127.0.0.1", 8123, None)


# --- item 5: a busy port ---------------------------------------------------------------------------


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_a_busy_port_is_refused_before_anything_happens(server, tmp_path):
    """Before: a second `make run` printed the token and "serving on …", loaded the model,
    logged "Application startup complete" and only then "[Errno 98] address already in use"."""
    started = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "service.cli", "quickstart", "--port", str(server.port)],
                            cwd=tmp_path, env=server.env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 1
    assert second.stdout == ""  # no token, no "serving on"
    assert not (tmp_path / "var").exists()  # no database, no KEK
    [error] = second.stderr.splitlines()
    match = re.fullmatch(rf"error: 127\.0\.0\.1:{server.port} is already in use \(.*\); pick another port: "
                         r"`PORT=(\d+) make run` \(or `hallmark quickstart --port (\d+)`\)", error)
    assert match and match.group(1) == match.group(2), error
    assert _bindable(int(match.group(1)))
    assert time.monotonic() - started < 60  # no model was loaded (a second's work; generous for a busy CI)

    serve_env = {**server.env, "HALLMARK_DATABASE_URL": f"sqlite:///{server.directory / 'var' / 'hallmark.db'}",
                 "HALLMARK_KEK_FILE": str(server.directory / "var" / "kek.key")}
    serve = subprocess.run([sys.executable, "-m", "service.cli", "serve", "--port", str(server.port)],
                           cwd=tmp_path, env=serve_env, capture_output=True, text=True, timeout=300)
    assert serve.returncode == 1 and serve.stdout == ""
    [error] = serve.stderr.splitlines()
    assert re.fullmatch(rf"error: 127\.0\.0\.1:{server.port} is already in use \(.*\); pick another port: "
                        r"`hallmark serve --port \d+`", error), error
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200  # the first one is untouched


# --- item 12: the request log ----------------------------------------------------------------------


def test_every_request_leaves_one_json_line_without_secrets(server):
    token = server.token()
    wrong_token = "hm_" + "W" * 40
    body_secret = "the body text must never reach the log"
    query_secret = "query-secret-42"
    calls = [
        ("ok-health", "GET", "/healthz", {}, None, 200, "/healthz"),
        ("wrong-token", "POST", f"/v1/detect?api_key={query_secret}", {"Authorization": f"Bearer {wrong_token}"},
         {"text": body_secret}, 401, "/v1/detect"),
        ("no-token", "GET", "/v1/generations", {}, None, 401, "/v1/generations"),
        ("bad-json", "POST", "/v1/detect", {"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
         b"{not json", 422, "/v1/detect"),
        ("unknown-generation", "GET", "/v1/generations/" + "0" * 32, {"Authorization": f"Bearer {token}"},
         None, 404, "/v1/generations/{generation_id}"),
        ("too-large", "POST", "/v1/detect", {"Authorization": f"Bearer {token}"},
         {"text": "x" * 2_000_000}, 413, "/v1/detect"),
        ("detected", "POST", "/v1/detect", {"Authorization": f"Bearer {token}"}, {"text": body_secret}, 200,
         "/v1/detect"),
    ]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for request_id, method, path, headers, body, status, _ in calls:
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
            response = client.request(method, path, headers={**headers, "x-request-id": request_id}, **kwargs)
            assert response.status_code == status, (request_id, response.text)
            assert response.headers["x-request-id"] == request_id
        unmatched = client.get("/no/such/route?token=" + query_secret)
        assert unmatched.status_code == 404
        generated = unmatched.headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", generated)
        refused_id = client.get("/healthz", headers={"x-request-id": "not a plain id"}).headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", refused_id)

    for request_id, method, _, _, _, status, route in calls:
        [line] = _access_lines(server, request_id)
        assert (line["method"], line["route"], line["status"]) == (method, route, status), line
        assert line["level"] == "info" and isinstance(line["duration_ms"], (int, float)) and line["duration_ms"] >= 0
        assert line["ts"].endswith("Z") and "path" not in line
    [line] = _access_lines(server, generated)
    assert (line["route"], line["path"], line["status"]) == (None, "/no/such/route", 404)
    assert len(_access_lines(server, refused_id)) == 1

    log = server.err.read_text()
    for secret in (token, wrong_token, body_secret, query_secret, "Bearer"):
        assert secret not in log
    # Every line of the process is one JSON object: uvicorn's, the start-up's, the requests'.
    parsed = [json.loads(line) for line in log.splitlines()]
    assert {"uvicorn.error", "hallmark.access", "hallmark.app"} <= {p["logger"] for p in parsed}
    assert any(p["message"].startswith(f"ready: answering on {server.url}") for p in parsed)


def test_the_text_log_has_the_same_line_per_request(tmp_path):
    """The default format: one readable line per request, with its request id."""
    server = Server(tmp_path, _free_port(), "text", env=_user_env())  # text is the default
    try:
        response = httpx.post(server.url + "/v1/detect", json={"text": "hello"}, timeout=30,
                              headers={"Authorization": "Bearer hm_nope", "x-request-id": "text-401"})
        assert response.status_code == 401
        deadline = time.time() + 30
        while not [line for line in server.log_lines() if "text-401" in line] and time.time() < deadline:
            time.sleep(0.1)
        [line] = [line for line in server.log_lines() if "text-401" in line]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z INFO hallmark\.access: POST /v1/detect 401 [\d.]+ ms "
                            r"id=text-401", line), line
    finally:
        server.stop()
    # Ctrl-C ends it cleanly: uvicorn's last line, and no interpreter noise after it (before,
    # triton's nanobind printed ~40 lines of "leaked" reports).
    lines = server.log_lines()
    assert lines[-1].endswith("Finished server process [%d]" % server.process.pid), lines[-5:]
