"""The managed server's life cycle, with a stand-in executable (no llama.cpp build needed):
started on a free loopback port, waited for, stopped on every path, never left behind."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from otbound import InvalidInputError
from otbound.engine import EngineError, LlamaServer, children_of
from otbound.engine._client import health

FAKE = textwrap.dedent('''\
    #!{python}
    import http.server, os, sys, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    host = args[args.index("--host") + 1]
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "crash":
        print("error: loading model failed", flush=True)
        sys.exit(3)
    if mode == "ignore-term":
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "slow":
        time.sleep(60)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b'{{"status":"ok"}}')

        def log_message(self, *a):
            pass

    try:
        srv = http.server.HTTPServer((host, port), H)
    except OSError as err:
        print(f"couldn't bind HTTP server socket: {{err}}", flush=True)
        sys.exit(1)
    srv.serve_forever()
''')


@pytest.fixture()
def fake(tmp_path):
    path = tmp_path / "llama-server"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return path, model


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie not yet reaped by us would still answer: the server is our child, so check /proc state
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_start_health_stop_leaves_nothing(fake, monkeypatch):
    binary, model = fake
    monkeypatch.setenv("FAKE_MODE", "ok")
    before = set(children_of())
    with LlamaServer(binary, model, startup_timeout=30) as srv:
        assert srv.url.startswith("http://127.0.0.1:") and health(srv.url)
        assert srv.command[srv.command.index("--host") + 1] == "127.0.0.1"
        for flag, value in (("-t", "1"), ("-td", "1"), ("--poll", "0")):
            assert srv.command[srv.command.index(flag) + 1] == value
        assert os.getpgid(srv.pid) == srv.pid  # its own process group
        pid, url = srv.pid, srv.url
    assert _gone(pid) and not health(url)
    assert set(children_of()) == before


def test_stopped_on_an_exception_and_on_ctrl_c(fake, monkeypatch):
    binary, model = fake
    monkeypatch.setenv("FAKE_MODE", "ok")
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with LlamaServer(binary, model, startup_timeout=30) as srv:
                pid = srv.pid
                raise exc
        assert _gone(pid)


def test_a_server_ignoring_sigterm_is_killed(fake, monkeypatch):
    binary, model = fake
    monkeypatch.setenv("FAKE_MODE", "ignore-term")
    with LlamaServer(binary, model, startup_timeout=30) as srv:
        pid = srv.pid
    assert _gone(pid)


def test_a_server_that_dies_at_start_is_one_clear_error(fake, monkeypatch):
    binary, model = fake
    monkeypatch.setenv("FAKE_MODE", "crash")
    with pytest.raises(EngineError, match="exited with status 3.*loading model failed"):
        LlamaServer(binary, model, startup_timeout=30).start()
    assert children_of() == []


def test_a_slow_server_times_out_and_is_stopped(fake, monkeypatch):
    binary, model = fake
    monkeypatch.setenv("FAKE_MODE", "slow")
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="not healthy after 1 s"):
        LlamaServer(binary, model, startup_timeout=1).start()
    assert time.monotonic() - t0 < 20 and children_of() == []


def test_a_port_in_use(fake, monkeypatch):
    binary, model = fake
    monkeypatch.setenv("FAKE_MODE", "ok")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # an explicit port in use: one clear error
        with pytest.raises(EngineError, match=f"could not bind 127.0.0.1:{port}: the port is in use"):
            LlamaServer(binary, model, port=port, startup_timeout=30).start()
        # a chosen port taken meanwhile: another one is tried
        import otbound.engine._server as server_mod

        ports = iter([port, None])
        real = server_mod.free_port
        monkeypatch.setattr(server_mod, "free_port", lambda: next(ports) or real())
        with LlamaServer(binary, model, startup_timeout=30) as srv:
            assert srv.port != port and health(srv.url)
    assert children_of() == []


def test_the_server_dies_with_its_parent(fake, tmp_path):
    """A parent killed by SIGKILL (no cleanup runs) still takes its server down (PR_SET_PDEATHSIG)."""
    binary, model = fake
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f'''\
        import sys, time
        from otbound.engine import LlamaServer
        srv = LlamaServer({str(binary)!r}, {str(model)!r}, startup_timeout=30).start()
        print(srv.pid, flush=True)
        time.sleep(60)
    '''))
    env = dict(os.environ, FAKE_MODE="ok", PYTHONPATH=os.getcwd())
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(pid, signal.SIGKILL)
        pytest.fail("the server outlived its parent")


def test_bad_arguments_are_refused(fake):
    binary, model = fake
    with pytest.raises(InvalidInputError, match="unknown speculative type"):
        LlamaServer(binary, model, spec_type="nope")
    with pytest.raises(InvalidInputError, match="needs a draft model"):
        LlamaServer(binary, model, spec_type="draft-simple")
    with pytest.raises(InvalidInputError, match="does not exist"):
        LlamaServer(binary, model.with_name("missing.gguf")).start()
