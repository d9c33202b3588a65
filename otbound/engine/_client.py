"""HTTP calls to a running llama.cpp (or OpenAI-compatible) server, with the standard library only.

Every failure to reach the server becomes an :class:`~otbound.engine.EngineError` naming the URL:
nothing listening, a server that died mid-run, a reply that is not the JSON expected.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.request


class EngineError(RuntimeError):
    """A serving engine could not be started, reached or kept running; the message says which and why.

    Examples
    --------
    >>> from otbound.engine import EngineError, spec_counters
    >>> try:
    ...     spec_counters("http://127.0.0.1:9")   # nothing listens on the discard port
    ... except EngineError as err:
    ...     print(str(err).split(":")[0] + ":" + str(err).split(":")[1] + ":" + str(err).split(":")[2])
    no answer from http://127.0.0.1:9/metrics
    """


#: the speculative-decoding counters llama.cpp's ``/metrics`` exposes (vLLM's names, ``llamacpp:`` prefix)
SPEC_COUNTERS = ("spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
                 "spec_decode_num_drafts_total")
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
_LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _request(url: str, data: dict | None = None, timeout: float = 60.0):
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise EngineError(f"no answer from {url}: {reason}") from None


def health(base: str, timeout: float = 2.0) -> bool:
    """True when ``GET base/health`` answers 200 (a llama.cpp server that finished loading)."""
    try:
        status, _ = _request(base.rstrip("/") + "/health", timeout=timeout)
    except EngineError:
        return False
    return status == 200


def _json_reply(base: str, path: str, body: dict | None, timeout: float) -> dict:
    """``GET`` (``body`` None) or ``POST`` ``base + path``; the parsed JSON of a 200 reply, else EngineError."""
    method = "GET" if body is None else "POST"
    status, raw = _request(base.rstrip("/") + path, body, timeout=timeout)
    if status != 200:
        raise EngineError(f"{method} {base}{path} answered {status}: {raw[:300]!r}")
    try:
        return json.loads(raw)
    except ValueError:
        raise EngineError(f"{method} {base}{path} did not answer JSON: {raw[:200]!r}") from None


def get_json(base: str, path: str, timeout: float = 30.0) -> dict:
    return _json_reply(base, path, None, timeout)


def completion(base: str, body: dict, timeout: float = 300.0) -> dict:
    """``POST base/completion`` (llama.cpp's native endpoint) with ``body``; the parsed reply."""
    return _json_reply(base, "/completion", body, timeout)


def parse_prometheus(text: str) -> dict:
    """Prometheus text exposition → ``{name: value}`` for unlabelled samples and ``{name: {labels: value}}``
    (labels as a sorted tuple of pairs) for labelled ones; comments skipped.

    Examples
    --------
    >>> from otbound.engine._client import parse_prometheus
    >>> parse_prometheus('# TYPE a counter\\na 3\\nb{position="1"} 2\\nb{position="0"} 5\\n')
    {'a': 3.0, 'b': {(('position', '0'),): 5.0, (('position', '1'),): 2.0}}
    """
    out: dict = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2), float(m.group(3))
        if labels:
            key = tuple(sorted(_LABEL.findall(labels)))
            out.setdefault(name, {})[key] = value
            out[name] = dict(sorted(out[name].items()))
        else:
            out[name] = value
    return out


def spec_counters(base: str, timeout: float = 30.0) -> dict:
    """The speculative-decoding counters of ``GET base/metrics`` (raw, JSON-ready).

    Returns
    -------
    dict
        ``{"draft_tokens", "accepted_tokens", "drafts"}`` (floats; 0 where the server does not serve
        the counter yet), ``"accepted_per_pos"`` (list, position 0 first), ``"raw"`` (every ``spec_decode`` line
        as served) and ``"prefix"`` (the metric prefix, e.g. ``"llamacpp:"``).

    Raises
    ------
    EngineError
        Nothing answers at ``base``, or ``/metrics`` is not served (llama-server needs ``--metrics``).

    Examples
    --------
    >>> from otbound.engine import EngineError, spec_counters
    >>> try:
    ...     spec_counters("http://127.0.0.1:9")
    ... except EngineError as err:
    ...     print("refused")
    refused
    """
    status, raw = _request(base.rstrip("/") + "/metrics", timeout=timeout)
    if status != 200:
        raise EngineError(f"GET {base}/metrics answered {status} (llama-server needs --metrics): {raw[:200]!r}")
    text = raw.decode(errors="replace")
    parsed = parse_prometheus(text)
    out = {"raw": [line for line in text.splitlines() if "spec_decode" in line and not line.startswith("#")]}
    prefix = next((k[: -len(SPEC_COUNTERS[0])] for k in parsed if k.endswith(SPEC_COUNTERS[0])), "llamacpp:")
    out["prefix"] = prefix
    for key, name in zip(("draft_tokens", "accepted_tokens", "drafts"), SPEC_COUNTERS):
        value = parsed.get(prefix + name, 0.0)  # a counter not served yet has not counted anything
        out[key] = float(value) if not isinstance(value, dict) else math.nan
    per = parsed.get(prefix + PER_POS, {})
    positions = {}
    for labels, value in per.items() if isinstance(per, dict) else ():
        pos = dict(labels).get("position")
        if pos is not None and pos.isdigit():
            positions[int(pos)] = float(value)
    out["accepted_per_pos"] = [positions.get(i, 0.0) for i in range(max(positions) + 1)] if positions else []
    return out


def counter_delta(before: dict, after: dict) -> dict:
    """``after − before`` of :func:`spec_counters` (per-position lists padded with zeros).

    Examples
    --------
    >>> from otbound.engine._client import counter_delta
    >>> counter_delta({"draft_tokens": 2.0, "accepted_tokens": 1.0, "drafts": 1.0, "accepted_per_pos": [1.0]},
    ...               {"draft_tokens": 6.0, "accepted_tokens": 4.0, "drafts": 3.0, "accepted_per_pos": [3.0, 1.0]})
    {'draft_tokens': 4.0, 'accepted_tokens': 3.0, 'drafts': 2.0, 'accepted_per_pos': [2.0, 1.0]}
    """
    out = {k: after[k] - before[k] for k in ("draft_tokens", "accepted_tokens", "drafts")}
    a, b = list(after["accepted_per_pos"]), list(before["accepted_per_pos"])
    n = max(len(a), len(b))
    a, b = a + [0.0] * (n - len(a)), b + [0.0] * (n - len(b))
    out["accepted_per_pos"] = [x - y for x, y in zip(a, b)]
    return out
