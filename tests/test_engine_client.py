"""The engine client's JSON calls against an in-process loopback server: a 200 JSON reply parsed, a
non-200 status or a reply that is not JSON one EngineError naming the method and the URL."""

import http.server
import threading

import pytest

from otbound.engine import EngineError
from otbound.engine._client import completion, get_json

REPLIES = {"/ok": (200, b'{"a": 1}'), "/completion": (200, b'{"content": "x"}'), "/down": (503, b"loading"),
           "/text": (200, b"not json")}


class _Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, path):
        status, body = REPLIES[path]
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer(self.path)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(self.server.post_path)

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    srv.post_path = "/completion"
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def test_json_replies_are_parsed(server):
    _, base = server
    assert get_json(base, "/ok") == {"a": 1}
    assert completion(base + "/", {"prompt": "hi"}) == {"content": "x"}


@pytest.mark.parametrize(("post_path", "said"), [("/down", "answered 503"), ("/text", "did not answer JSON")])
def test_a_bad_reply_is_one_error_naming_method_and_url(server, post_path, said):
    srv, base = server
    with pytest.raises(EngineError, match=f"^GET {base}{post_path} {said}"):
        get_json(base, post_path)
    srv.post_path = post_path
    with pytest.raises(EngineError, match=f"^POST {base}/completion {said}"):
        completion(base, {"prompt": "hi"})
