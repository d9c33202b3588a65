"""A managed ``llama-server``: started on a free loopback port, waited for, always stopped.

:class:`LlamaServer` is a context manager. Entering it starts ``llama-server`` in its own process
group (its own session) bound to 127.0.0.1 on a port the operating system chose, retries with a
new port if another process took that one first, and waits for ``GET /health`` to answer ok.
Leaving it — on return, on an exception, on Ctrl-C — sends SIGTERM to the server's process group,
waits, and sends SIGKILL to the group if it has not exited: the server is never left running and
is never found by name. The child also asks the kernel to send it SIGTERM when the process that
started it dies (``PR_SET_PDEATHSIG``), so even a parent killed by SIGKILL leaves no server behind.

Threads: one per model and polling off by default (``-t 1 -td 1 --poll 0 --spec-draft-poll 0``):
on a busy machine llama.cpp's spin-waiting thread pools collapse with two threads per model on two
cores.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from otbound._validation import InvalidInputError
from otbound.engine._client import EngineError, health

#: the speculative-decoding types of llama.cpp's ``--spec-type`` that the audit drives
SPEC_TYPES = ("none", "draft-simple", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")
#: default thread settings (one thread per model, no polling)
DEFAULT_THREADS = ("-t", "1", "-tb", "1", "-td", "1", "-tbd", "1", "--poll", "0", "--spec-draft-poll", "0")
_STOP_GRACE_S = 5.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 the operating system reports free now (it may be taken again before use).

    Examples
    --------
    >>> from otbound.engine import free_port
    >>> 1024 <= free_port() <= 65535
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _port_in_use(log: str) -> bool:
    text = log.lower()
    return "address already in use" in text or "couldn't bind" in text or "failed to bind" in text \
        or os.strerror(errno.EADDRINUSE).lower() in text


class LlamaServer:
    """``llama-server`` with a target (and optionally a draft) GGUF model, as a context manager.

    Parameters
    ----------
    binary : str or Path
        The ``llama-server`` executable (e.g. ``llama_cpp_build().binary("llama-server")``).
    model : str or Path
        The target GGUF file.
    draft : str or Path, optional
        The draft GGUF file (``-md``); required by ``spec_type="draft-simple"``.
    spec_type : str
        ``"none"`` (no speculation) or one of :data:`SPEC_TYPES`.
    draft_max, draft_min : int
        ``--spec-draft-n-max`` / ``--spec-draft-n-min``.
    p_min : float
        ``--spec-draft-p-min`` (the draft stops below this top probability).
    ctx_size : int
        ``-c``.
    threads : sequence of str
        Thread flags (:data:`DEFAULT_THREADS`).
    extra_args : sequence of str
        More flags, passed as they are.
    port : int, optional
        A port to use (default: one the OS chooses; with an explicit port a port in use is an error).
    startup_timeout : float
        Seconds to wait for ``/health`` before the start is abandoned (the server is stopped).
    retries : int
        New ports to try when the chosen one was taken meanwhile.

    Attributes
    ----------
    url : str
        ``http://127.0.0.1:<port>`` once started.
    command : list of str
        The command line (for the records).
    pid : int
        The server's process id (also its process group id).

    Examples
    --------
    >>> from otbound.engine import LlamaServer
    >>> from otbound import InvalidInputError
    >>> try:
    ...     LlamaServer("llama-server", "target.gguf", spec_type="warp")
    ... except InvalidInputError as err:
    ...     print(str(err).split(";")[0])
    unknown speculative type 'warp'
    """

    def __init__(self, binary, model, *, draft=None, spec_type: str = "none", draft_max: int = 4,
                 draft_min: int = 0, p_min: float = 0.0, ctx_size: int = 2048, threads=DEFAULT_THREADS,
                 extra_args=(), port: int | None = None, startup_timeout: float = 120.0, retries: int = 3):
        if spec_type not in SPEC_TYPES:
            raise InvalidInputError(f"unknown speculative type {spec_type!r}; expected one of {', '.join(SPEC_TYPES)}")
        if spec_type == "draft-simple" and draft is None:
            raise InvalidInputError("spec_type 'draft-simple' needs a draft model")
        if not (0.0 <= float(p_min) <= 1.0):
            raise InvalidInputError(f"p_min must be in [0, 1], got {p_min}")
        if int(draft_max) < 1 or int(draft_min) < 0 or int(draft_min) > int(draft_max):
            raise InvalidInputError(f"need 0 <= draft_min <= draft_max and draft_max >= 1, "
                                    f"got {draft_min}, {draft_max}")
        self.binary, self.model = Path(binary), Path(model)
        self.draft = None if draft is None else Path(draft)
        self.spec_type, self.p_min = spec_type, float(p_min)
        self.draft_max, self.draft_min = int(draft_max), int(draft_min)
        self.ctx_size, self.threads, self.extra_args = int(ctx_size), tuple(threads), tuple(map(str, extra_args))
        self.fixed_port, self.startup_timeout, self.retries = port, float(startup_timeout), int(retries)
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.command: list[str] = []
        self._log_dir: tempfile.TemporaryDirectory | None = None
        self.log_path: Path | None = None

    # -- the command ---------------------------------------------------------------------------
    def _args(self, port: int) -> list[str]:
        cmd = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(port),
               "-c", str(self.ctx_size), "-np", "1", "--metrics", "--no-webui", *self.threads]
        if self.draft is not None and self.spec_type == "draft-simple":
            cmd += ["-md", str(self.draft)]
        if self.spec_type != "none":
            cmd += ["--spec-type", self.spec_type, "--spec-draft-n-max", str(self.draft_max),
                    "--spec-draft-n-min", str(self.draft_min), "--spec-draft-p-min", repr(self.p_min)]
        return cmd + list(self.extra_args)

    def describe(self) -> dict:
        """The server's configuration (JSON-ready)."""
        return {"binary": str(self.binary), "model": str(self.model), "draft": None if self.draft is None else
                str(self.draft), "spec_type": self.spec_type, "draft_max": self.draft_max, "draft_min": self.draft_min,
                "p_min": self.p_min, "ctx_size": self.ctx_size, "threads": list(self.threads),
                "extra_args": list(self.extra_args), "command": list(self.command)}

    @property
    def url(self) -> str:
        if self.port is None:
            raise EngineError("the server is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def log_tail(self, lines: int = 8) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:])

    # -- start / stop ---------------------------------------------------------------------------
    def start(self) -> LlamaServer:
        """Start the server and wait until it is healthy (stopping it on any failure)."""
        for path, what in ((self.binary, "llama-server binary"), (self.model, "model"), (self.draft, "draft model")):
            if path is not None and not path.is_file():
                raise InvalidInputError(f"the {what} {path} does not exist")
        self._log_dir = tempfile.TemporaryDirectory(prefix="otbound-llama-server-")
        self.log_path = Path(self._log_dir.name) / "server.log"
        try:
            tries = 1 if self.fixed_port is not None else 1 + self.retries
            for attempt in range(tries):
                port = self.fixed_port if self.fixed_port is not None else free_port()
                try:
                    self._launch(port)
                    self._wait_healthy()
                    return self
                except _PortTaken:
                    self._stop_process()
                    if self.fixed_port is not None or attempt == tries - 1:
                        raise EngineError(f"llama-server could not bind 127.0.0.1:{port}: the port is in use") from None
        except BaseException:
            self.stop()
            raise
        raise EngineError("llama-server did not start")  # pragma: no cover - the loop returns or raises

    def _launch(self, port: int) -> None:
        self.command = self._args(port)
        self.port = port
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                tail = self.log_tail()
                if _port_in_use(tail):
                    raise _PortTaken()
                raise EngineError(f"llama-server exited with status {code} while starting: {tail[-600:]}")
            if health(self.url, timeout=2.0):
                return
            if time.monotonic() > deadline:
                raise EngineError(f"llama-server was not healthy after {self.startup_timeout:.0f} s: "
                                  f"{self.log_tail()[-600:]}")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _stop_process(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        else:  # the leader exited: make sure nothing of its group lingers
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        """Stop the server (SIGTERM to its process group, then SIGKILL); idempotent."""
        try:
            self._stop_process()
        finally:
            if self._log_dir is not None and self.proc is None:
                self._log_dir.cleanup()
                self._log_dir = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):  # last resort: a server object dropped without stop()
        with contextlib.suppress(Exception):
            if self.proc is not None:
                self._stop_process()


class _PortTaken(Exception):
    pass


def children_of(pid: int | None = None) -> list[int]:
    """Process ids whose parent is ``pid`` (default: this process), read from ``/proc``.

    Examples
    --------
    >>> from otbound.engine._server import children_of
    >>> isinstance(children_of(), list)
    True
    """
    pid = os.getpid() if pid is None else int(pid)
    out = []
    for entry in os.listdir("/proc") if sys.platform.startswith("linux") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out
