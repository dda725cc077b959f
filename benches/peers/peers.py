#!/usr/bin/env python3
"""benches/peers: the cost of one tool-calling session, side by side.

`benches/peers/run.sh` runs this file with the system python3 (stdlib only).
It installs what each row needs, starts the one mock model, runs every row
against it, one row at a time, and prints/writes the table.

    run.sh ─▶ peers.py ─┬─ mock_model.py (own process: its CPU is nobody's)
                        ├─ in-process rows: rows/row_*.py in their venv,
                        │  target/.../adk/release/peers-adk; each runs its
                        │  own session loop (rows/driver.py) and writes JSON
                        ├─ server rows: `cadre serve`, `langgraph dev`,
                        │  peers-adk-server (adk-server), rows/lgserver_pg.py
                        │  (langgraph-api + langgraph-runtime-pg); the
                        │  session loop is this process's HTTP client (its
                        │  CPU is not the server's); the server's CPU and
                        │  VmHWM are read from /proc/<pid>
                        └─ one PostgreSQL (target/peers/pg) and one Redis
                           (target/peers/redis) for the run, started when a
                           row first needs them; their CPU and bytes written
                           are measured apart from the row's

One session, every row: the user asks (`[s:ID] What is 2+3? ...`), the model
asks for `calculator {"expression": "2+3"}`, the tool runs, the model
answers `2+3 = 5`. 2 model calls + 1 tool call; the harness checks both
(the mock's per-session call count, the row's tool count or cadre's reply)
and counts a session that did anything else as an error.

Figures (per row): overhead, 1 at a time = p50 over sessions of (the
session's wall time at its client − the mock's own time for that session's
two requests); CPU per session = the framework process's user+sys CPU over
a phase / the sessions started in it (1 at a time, then C at once); peak
RSS = VmHWM of that process at the end; for the rows on a database server,
that server's CPU per session apart; bytes written per session and, on
PostgreSQL, WAL per session; what each durable row kept, counted in its
database. Decisions, limits and what each row does and does not do:
benches/peers/README.md.
"""

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
QUESTION = "What is 2+3? Use the calculator."
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024

# name, label, kind, venv/requirements name
ROWS = [
    ("lgserver", "LangGraph Server (`langgraph dev`, in-memory, HTTP)", "lgserver", "lgserver"),
    (
        "lgserver-pg",
        (
            "LangGraph's API server (stock langgraph-api, HTTP) on the open PostgreSQL + Redis runtime "
            "langgraph-runtime-pg (third-party, MIT; not LangGraph Platform)"
        ),
        "lgserverpg",
        "lgserver-pg",
    ),
    ("langgraph", "LangGraph (prebuilt ReAct agent, in-process)", "python", "langgraph"),
    ("agents", "OpenAI Agents SDK (in-process)", "python", "agents"),
    ("autogen", "AutoGen AgentChat (in-process)", "python", "autogen"),
    ("bare", "bare `openai` SDK loop (in-process)", "python", "bare"),
    ("adk", "ADK-Rust (in-process, in-memory sessions)", "adk", None),
    (
        "adk-sqlite",
        "ADK-Rust's server (adk-server, HTTP), SQLite sessions (adk-session, sqlx; WAL, one connection)",
        "adkserver",
        None,
    ),
    ("adk-pg", "ADK-Rust's server (adk-server, HTTP), PostgreSQL sessions (adk-session, sqlx)", "adkserver", None),
    ("cadre-disk", "cadre over HTTP, durable, data dir on disk", "cadre", None),
    ("cadre-tmpfs", "cadre over HTTP, data dir on tmpfs (/dev/shm)", "cadre", None),
    ("cadre-pg", "cadre over HTTP, one node on PostgreSQL (`--store`)", "cadre", None),
]
# `--only` names that stand for several rows
ALIASES = {"cadre": {"cadre-disk", "cadre-tmpfs", "cadre-pg"}, "adk-server": {"adk-sqlite", "adk-pg"}}
VERSION_KEYS = {
    "lgserver": ["langgraph-api", "langgraph-cli", "langgraph"],
    "lgserver-pg": ["langgraph-api", "langgraph-runtime-pg", "langgraph-checkpoint-postgres", "langgraph"],
    "langgraph": ["langgraph", "langchain-openai"],
    "agents": ["openai-agents", "openai"],
    "autogen": ["autogen-agentchat", "autogen-ext"],
    "bare": ["openai"],
}


def log(msg):
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class RowFailed(Exception):
    pass


# ---------------------------------------------------------------------------
# Setup: venvs, cargo builds
# ---------------------------------------------------------------------------


def run_logged(cmd, logfile, env=None, cwd=None):
    with open(logfile, "ab") as f:
        f.write(("\n$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if rc != 0:
        with open(logfile, "rb") as f:
            tail = f.read()[-1500:].decode(errors="replace")
        raise RowFailed(f"`{' '.join(cmd)}` failed (exit {rc}); see {logfile}:\n{tail}")


def ensure_venv(name, ctx):
    """target/peers/venvs/<name> with requirements/<name>.txt (every version pinned)."""
    req = os.path.join(HERE, "requirements", f"{name}.txt")
    venv = os.path.join(ctx.work, "venvs", name)
    stamp = os.path.join(venv, ".peers-requirements")
    digest = hashlib.sha256(open(req, "rb").read()).hexdigest()
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(stamp) and open(stamp).read() == digest and os.path.exists(py):
        return py
    logfile = os.path.join(ctx.logs, f"setup-{name}.log")
    log(f"{name}: installing {req} into {venv} (log: {logfile})")
    shutil.rmtree(venv, ignore_errors=True)
    run_logged([sys.executable, "-m", "venv", venv], logfile)
    run_logged([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", req], logfile)
    with open(stamp, "w") as f:
        f.write(digest)
    return py


def cargo_build(manifest, target_dir, extra, logfile):
    env = dict(os.environ, CARGO_TARGET_DIR=target_dir)
    env.setdefault("CARGO_INCREMENTAL", "0")
    run_logged(["cargo", "build", "--release", "--locked", "--manifest-path", manifest] + extra, logfile, env=env)


def ensure_adk(ctx, binary="peers-adk"):
    """Both ADK-Rust programs (one package, its own Cargo.lock): built once per run."""
    target = os.path.join(ctx.target, "peers", "adk")
    if not getattr(ctx, "adk_built", False):
        log(f"adk: cargo build --release (target {target})")
        cargo_build(os.path.join(HERE, "adk", "Cargo.toml"), target, [], os.path.join(ctx.logs, "setup-adk.log"))
        ctx.adk_built = True
    return os.path.join(target, "release", binary)


def ensure_cadre(ctx):
    if ctx.cadre_bin:
        return ctx.cadre_bin
    log(f"cadre: cargo build --release --bin cadre (target {ctx.target})")
    cargo_build(
        os.path.join(REPO, "Cargo.toml"), ctx.target, ["--bin", "cadre"], os.path.join(ctx.logs, "setup-cadre.log")
    )
    ctx.cadre_bin = os.path.join(ctx.target, "release", "cadre")
    return ctx.cadre_bin


# ---------------------------------------------------------------------------
# Processes: /proc readings, start/stop
# ---------------------------------------------------------------------------


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def tree_cpu_s(pid):
    """user+sys of pid and its live descendants (threads included, dead ones too)."""
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except OSError:
            pass
    return total / CLK_TCK


def tree_cpu_reaped_s(pid):
    """tree_cpu_s plus the CPU of the descendants already reaped (cutime,
    cstime): for a database server, whose backends come and go."""
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        except OSError:
            pass
    return total / CLK_TCK


def tree_write_bytes(pid):
    """write_bytes of /proc/<pid>/io over pid's live tree: the bytes its
    processes sent (or, buffered, dirtied) to a block device; 0 on tmpfs."""
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/io") as f:
                for line in f:
                    if line.startswith("write_bytes:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def dir_bytes(path):
    """Bytes allocated to the files under path (st_blocks), as `du` counts."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def tree_hwm_kb(pid):
    total = 0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def own_cpu_s():
    """This process and its waited-for children (the rows, the servers once stopped)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def machine_busy_s():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / CLK_TCK


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(port, path, proc, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RowFailed(f"{what} exited with {proc.returncode} before it answered {path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RowFailed(f"{what} did not answer {path} within {timeout} s")


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ---------------------------------------------------------------------------
# The mock model
# ---------------------------------------------------------------------------


class Mock:
    def __init__(self, ctx):
        self.port_file = os.path.join(ctx.work, "mock.port")
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.log = open(os.path.join(ctx.logs, "mock.log"), "ab")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "mock_model.py"), "--port-file", self.port_file],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + 20
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit("the mock model did not start: see " + self.log.name)
            time.sleep(0.05)
        self.port = int(open(self.port_file).read())
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def call(self, method, path):
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(1 << 20):
                data += chunk
        return json.loads(data.split(b"\r\n\r\n", 1)[1])

    def reset(self):
        self.call("POST", "/reset")

    def stats(self):
        return self.call("GET", "/stats")


# ---------------------------------------------------------------------------
# PostgreSQL (rows adk-pg, cadre-pg): one server for the run, from the
# machine's binaries, started the first time a row needs it
# ---------------------------------------------------------------------------


def pg_bin_dir():
    """/usr/lib/postgresql/<newest>/bin, else initdb on PATH (as tests/support/postgres.rs)."""
    versions = []
    for v in os.listdir("/usr/lib/postgresql") if os.path.isdir("/usr/lib/postgresql") else []:
        b = os.path.join("/usr/lib/postgresql", v, "bin")
        if v.isdigit() and os.path.exists(os.path.join(b, "initdb")):
            versions.append((int(v), b))
    if versions:
        return max(versions)[1]
    initdb = shutil.which("initdb")
    if initdb and os.path.exists(os.path.join(os.path.dirname(initdb), "postgres")):
        return os.path.dirname(initdb)
    raise RowFailed(
        "PostgreSQL's server binaries (initdb, postgres) are not in /usr/lib/postgresql/*/bin or on PATH "
        "(Debian: apt-get install postgresql)"
    )


class Postgres:
    """initdb in target/peers/pg (as the `postgres` user when run as root:
    PostgreSQL refuses root), then `postgres` with its defaults (fsync on,
    synchronous_commit on) but for the address, the socket directory and
    max_connections; every row gets a database of its own."""

    SETTINGS = ("server_version", "synchronous_commit", "fsync", "wal_sync_method", "full_page_writes",
                "shared_buffers", "max_connections")  # fmt: skip

    def __init__(self, ctx):
        self.bin = pg_bin_dir()
        self.dir = os.path.join(ctx.work, "pg")
        self.data = os.path.join(self.dir, "data")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.user = {}
        if os.geteuid() == 0:
            import pwd

            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise RowFailed(
                    "running as root, and PostgreSQL refuses root: the `postgres` user is missing"
                ) from None
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        logfile = os.path.join(ctx.logs, "postgres.log")
        with open(logfile, "ab") as f:
            rc = subprocess.call(
                [os.path.join(self.bin, "initdb"), "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                 "--locale=C", "--no-sync"],
                stdout=f, stderr=subprocess.STDOUT, cwd=self.dir, **self.user,
            )  # fmt: skip
        if rc != 0:
            raise RowFailed(f"initdb failed (exit {rc}); see {logfile}")
        self.port = free_port()
        with open(logfile, "ab") as log_f:
            self.proc = subprocess.Popen(
                [os.path.join(self.bin, "postgres"), "-D", self.data, "-p", str(self.port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}",
                 "-c", "max_connections=500"],
                stdout=log_f, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True, **self.user,
            )  # fmt: skip
        deadline = time.time() + 60
        while subprocess.call(
            [os.path.join(self.bin, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
        ):  # fmt: skip
            if self.proc.poll() is not None or time.time() > deadline:
                stop(self.proc)
                raise RowFailed(f"PostgreSQL did not start; see {logfile}")
            time.sleep(0.1)
        self.settings = {k: self.sql(f"SHOW {k}") for k in self.SETTINGS}

    def sql(self, query, db="postgres"):
        out = subprocess.run(
            [os.path.join(self.bin, "psql"), "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1", "-c", query],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise RowFailed(f"psql {query!r}: {out.stderr.strip()}")
        return out.stdout.strip()

    def stop(self):
        """A fast shutdown (SIGINT), then SIGKILL to its process group."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def counters(self):
        """The cluster's WAL insert position in bytes: the WAL the phases wrote
        (every database's, autovacuum's too) is its difference."""
        return {"pg_wal_bytes": int(self.sql("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"))}

    def database(self, name):
        """A fresh database for a row; its URL."""
        db = name.replace("-", "_")
        self.sql(f"DROP DATABASE IF EXISTS {db}")
        self.sql(f"CREATE DATABASE {db}")
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"


def postgres(ctx):
    if getattr(ctx, "pg", None) is None:
        ctx.pg = Postgres(ctx)
        log(f"PostgreSQL {ctx.pg.settings['server_version']} at 127.0.0.1:{ctx.pg.port} (pid {ctx.pg.proc.pid})")
    return ctx.pg


class Redis:
    """The machine's `redis-server` (row lgserver-pg), in target/peers/redis,
    with its defaults (RDB snapshots `save 3600 1 300 100 60 10000`, no AOF)
    but for the address and the directory. Missing, it is installed as the
    tests install it (scripts/test-packages, Debian, as root)."""

    SETTINGS = ("redis_version", "save", "appendonly", "appendfsync")

    def __init__(self, ctx):
        if not shutil.which("redis-server"):
            subprocess.call([os.path.join(REPO, "scripts", "test-packages"), "redis-server"])
            if not shutil.which("redis-server"):
                raise RowFailed("`redis-server` is not on PATH (Debian: apt-get install redis-server)")
        self.dir = os.path.join(ctx.work, "redis")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.port = free_port()
        logfile = os.path.join(ctx.logs, "redis.log")
        with open(logfile, "ab") as log_f:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir],
                stdout=log_f, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True,
            )  # fmt: skip
        deadline = time.time() + 20
        while self.cmd("PING").strip() != "+PONG":
            if self.proc.poll() is not None or time.time() > deadline:
                stop(self.proc)
                raise RowFailed(f"redis-server did not start; see {logfile}")
            time.sleep(0.1)
        info = self.cmd("INFO server")
        version = next((x.split(":", 1)[1] for x in info.split("\r\n") if x.startswith("redis_version:")), "?")
        self.settings = {"redis_version": version}
        for k in self.SETTINGS[1:]:
            reply = self.cmd(f"CONFIG GET {k}").split("\r\n")
            self.settings[k] = reply[4] if len(reply) > 4 else "?"  # *2 $n key $m value
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def cmd(self, line):
        """One inline command; its raw reply ('' when it cannot connect)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(line.encode() + b"\r\nQUIT\r\n")
                data = b""
                while chunk := s.recv(1 << 16):
                    data += chunk
        except OSError:
            return ""
        text = data.decode(errors="replace")
        return text.removesuffix("+OK\r\n")

    def stop(self):
        stop(self.proc)


def databases_cpu_s(ctx):
    """The CPU of the run's PostgreSQL and Redis so far (0 before they start):
    the benchmark's own processes, not "other processes"."""
    return sum(tree_cpu_reaped_s(db.proc.pid) for db in (ctx.pg, ctx.redis) if db is not None)


def redis(ctx):
    if getattr(ctx, "redis", None) is None:
        ctx.redis = Redis(ctx)
        log(f"Redis {ctx.redis.settings['redis_version']} at 127.0.0.1:{ctx.redis.port} (pid {ctx.redis.proc.pid})")
    return ctx.redis


# ---------------------------------------------------------------------------
# HTTP client for the server rows (stdlib asyncio, keep-alive, one
# connection per session loop, as independent clients would hold)
# ---------------------------------------------------------------------------


class Conn:
    def __init__(self, port):
        self.port = port
        self.reader = self.writer = None

    async def close(self):
        if self.writer:
            self.writer.close()
            self.reader = self.writer = None

    async def request(self, method, path, body=None):
        for attempt in (0, 1):
            fresh = self.writer is None
            if fresh:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            data = json.dumps(body).encode() if body is not None else b""
            head = (
                f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\ncontent-type: application/json\r\n"
                f"accept: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
            )
            try:
                self.writer.write(head.encode() + data)
                await self.writer.drain()
                status, headers, payload = await self._response()
            except (ConnectionError, asyncio.IncompleteReadError):
                await self.close()
                if fresh or attempt:
                    raise
                continue  # the server closed an idle kept-alive connection
            if headers.get("connection", "").lower() == "close":
                await self.close()
            if status >= 300:
                raise RuntimeError(f"{method} {path}: HTTP {status}: {payload[:300]!r}")
            return json.loads(payload) if payload else None
        raise AssertionError("unreachable")

    async def _response(self):
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                out += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
            return status, headers, bytes(out)
        n = int(headers.get("content-length", "0"))
        return status, headers, (await self.reader.readexactly(n) if n else b"")


async def cadre_session(conn, sid):
    s = await conn.request("POST", "/v1/sessions", {"agent": "peers"})
    r = await conn.request("POST", f"/v1/sessions/{s['id']}/messages", {"content": f"[s:{sid}] {QUESTION}"})
    calls = r.get("tool_calls") or []
    if len(calls) != 1 or calls[0].get("name") != "calculator" or not calls[0].get("is_success"):
        raise RuntimeError(f"tool calls {calls!r}")
    return r.get("answer") or ""


def adk_texts_and_tools(events):
    """The text parts of the agent's events and the calculator's answers in them."""
    texts, results = [], []
    for ev in events or []:
        content = ev.get("content") or (ev.get("llm_response") or {}).get("content") or {}
        for part in content.get("parts") or []:
            if part.get("text"):
                texts.append(part["text"])
            resp = part.get("functionResponse") or part.get("function_response")
            if resp and resp.get("name") == "calculator":
                results.append(resp.get("response"))
    return texts, results


async def adkserver_session(conn, sid):
    ids = {"appName": "assistant", "userId": "user", "sessionId": sid}
    await conn.request("POST", "/api/sessions", ids)
    message = {"role": "user", "parts": [{"text": f"[s:{sid}] {QUESTION}"}]}
    events = await conn.request("POST", "/api/run", dict(ids, newMessage=message))
    texts, results = adk_texts_and_tools(events)
    if len(results) != 1 or not isinstance(results[0], dict) or results[0].get("result") != 5:
        raise RuntimeError(f"calculator results {results!r} in {str(events)[:300]}")
    return texts[-1] if texts else ""


async def lgserver_session(conn, sid):
    t = await conn.request("POST", "/threads", {})
    out = await conn.request(
        "POST",
        f"/threads/{t['thread_id']}/runs/wait",
        {"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": f"[s:{sid}] {QUESTION}"}]}},
    )
    messages = (out or {}).get("messages") or []
    tools = [m.get("content") for m in messages if m.get("type") == "tool"]
    try:
        result = json.loads(tools[0]).get("result") if len(tools) == 1 else None
    except (TypeError, ValueError, AttributeError):
        result = None
    if result != 5:
        raise RuntimeError(f"calculator results {tools!r} in the run's state: {str(out)[:300]}")
    return messages[-1].get("content") if messages else ""


async def http_phases(ctx, row, port, pid, session, dbs=None, data_dir=None, probe=None, logfile=None):
    """The phases of rows/driver.py, over HTTP, CPU and VmHWM of `pid`'s tree;
    the CPU of each database server's tree (`dbs`: name -> pid; reaped
    backends too) apart; over the measured phases (warm-up excluded): the
    bytes every tree writes (less the server's own log, `logfile`, which
    it writes too), `data_dir`'s growth and the database's own counters
    (`probe()`: name -> number, e.g. PostgreSQL's WAL position)."""
    errors = []
    dbs = dbs or {}

    def counters():
        out = dict(probe() if probe else {})
        out["log_bytes"] = os.path.getsize(logfile) if logfile and os.path.exists(logfile) else 0
        out["data_dir_bytes"] = dir_bytes(data_dir) if data_dir else 0
        return out

    def db_cpu():
        return {k: tree_cpu_reaped_s(p) for k, p in dbs.items()}

    def writes():
        return dict({k: tree_write_bytes(p) for k, p in dbs.items()}, server=tree_write_bytes(pid))

    def minus(a, b):
        return {k: a[k] - b[k] for k in a}

    async def one(conn, sid):
        t0 = time.perf_counter()
        try:
            text = await session(conn, sid)
        except Exception as e:  # noqa: BLE001 - counted and reported
            errors.append(f"{sid}: {e!r}"[:300])
            await conn.close()
            return None
        wall = time.perf_counter() - t0
        if "5" not in (text or ""):
            errors.append(f"{sid}: final text {text!r} lacks '5'"[:300])
        return wall

    conn = Conn(port)
    for i in range(ctx.warmup):
        await one(conn, f"{row}-w-{i}")
    seq = {}
    w0, k0 = writes(), counters()
    c0, d0, t0 = tree_cpu_s(pid), db_cpu(), time.perf_counter()
    n = 0
    for i in range(ctx.seq):
        n += 1
        sid = f"{row}-s-{i}"
        wall = await one(conn, sid)
        if wall is not None:
            seq[sid] = wall
        if time.perf_counter() - t0 > ctx.seq_cap_s:
            break
    seq_cpu, seq_db, seq_elapsed = tree_cpu_s(pid) - c0, minus(db_cpu(), d0), time.perf_counter() - t0
    await conn.close()

    started, conc = [0], {}

    async def worker():
        c = Conn(port)
        while started[0] < ctx.total and time.perf_counter() - t1 <= ctx.conc_cap_s:
            i = started[0]
            started[0] += 1
            sid = f"{row}-c-{i}"
            wall = await one(c, sid)
            if wall is not None:
                conc[sid] = wall
        await c.close()

    c1, d1, t1 = tree_cpu_s(pid), db_cpu(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(ctx.conc)))
    conc_cpu, conc_db, conc_elapsed = tree_cpu_s(pid) - c1, minus(db_cpu(), d1), time.perf_counter() - t1
    w1, k1 = writes(), counters()
    return {
        "warmup": ctx.warmup,
        "seq": {
            "n": n,
            "ok": len(seq),
            "cpu_s": seq_cpu,
            "db_cpu_s": sum(seq_db.values()) if dbs else None,
            "db_cpu_by_server_s": seq_db,
            "elapsed_s": seq_elapsed,
            "wall_s": seq,
        },
        "conc": {
            "n": started[0],
            "ok": len(conc),
            "concurrency": ctx.conc,
            "cpu_s": conc_cpu,
            "db_cpu_s": sum(conc_db.values()) if dbs else None,
            "db_cpu_by_server_s": conc_db,
            "elapsed_s": conc_elapsed,
            "wall_s": conc,
        },
        "storage": {
            "sessions": n + started[0],
            "write_bytes": minus(w1, w0),
            "data_dir": data_dir,
            "counters": minus(k1, k0),
        },
        "db_processes": sorted(dbs),
        "errors": errors[:20],
        "error_count": len(errors),
        "vm_hwm_kb": tree_hwm_kb(pid),
        "pid": pid,
        "processes": len(descendants(pid)),
        "measured": "server process tree (the HTTP client is the harness, not charged)",
    }


# ---------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------


def phase_args(ctx):
    return [
        "--warmup", str(ctx.warmup), "--seq", str(ctx.seq), "--seq-cap-s", str(ctx.seq_cap_s),
        "--conc", str(ctx.conc), "--total", str(ctx.total), "--conc-cap-s", str(ctx.conc_cap_s),
    ]  # fmt: skip


def run_inprocess(ctx, name, cmd, cwd):
    out = os.path.join(ctx.work, "results", f"{name}.json")
    if os.path.exists(out):
        os.remove(out)
    logfile = os.path.join(ctx.logs, f"{name}.log")
    cmd = cmd + ["--base-url", ctx.mock.base_url, "--row", name, "--out", out] + phase_args(ctx)
    with open(logfile, "wb") as f:
        rc = subprocess.call(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=ctx.child_env())
    if rc != 0 or not os.path.exists(out):
        tail = open(logfile, "rb").read()[-1500:].decode(errors="replace")
        raise RowFailed(f"exit {rc}; see {logfile}:\n{tail}")
    return json.load(open(out))


def row_python(ctx, name, py):
    return run_inprocess(ctx, name, [py, os.path.join(HERE, "rows", f"row_{name}.py")], os.path.join(HERE, "rows"))


def row_adk(ctx, name, binary):
    return run_inprocess(ctx, name, [binary], ctx.work)


# adk-sqlite's pool, where it differs from SqliteSessionService::new's (None:
# as new opens it: sqlx's default pool, SQLite's rollback journal `delete`).
# As shipped, 200 sessions at once fail most session creations with
# "database is locked" (SQLITE_BUSY at once, not after sqlx's 5 s busy
# timeout: adk-session's transactions read, then write, and SQLite refuses
# a second connection's upgrade to a writer), in either journal mode. One
# connection serialises them, as SQLite serialises writers anyway; WAL is
# the journal SQLite offers for a server. `synchronous` stays FULL.
ADK_SQLITE = {"journal-mode": "wal", "max-connections": "1"}


def kept(ctx, name, tables, sqlite_path=None):
    """Rows in `tables` of the row's database once the row has run: what it
    kept, counted in the database itself (SQLite file or the row's
    PostgreSQL database), not taken from the server."""
    out = {}
    for t in tables:
        try:
            if sqlite_path:
                import sqlite3

                with sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True) as c:
                    out[t] = c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            else:
                out[t] = int(ctx.pg.sql(f"SELECT count(*) FROM {t}", db=name.replace("-", "_")))
        except Exception as e:  # noqa: BLE001 - reported with the row
            out[t] = f"cannot count: {e}"[:200]
    return out


def row_adkserver(ctx, name, binary):
    port = free_port()
    info = os.path.join(ctx.work, "results", f"{name}-info.json")
    if os.path.exists(info):
        os.remove(info)
    dbs, extra = None, []
    if name == "adk-pg":
        pg = postgres(ctx)
        url, dbs, data = pg.database(name), {"postgres": pg.proc.pid}, pg.data
    else:
        data = os.path.join(ctx.work, "adk-sqlite")
        shutil.rmtree(data, ignore_errors=True)
        os.makedirs(data)
        url = f"sqlite://{data}/sessions.db?mode=rwc"
        extra = [x for k, v in ADK_SQLITE.items() if v for x in (f"--sqlite-{k}", v)]
    cmd = [
        binary,
        "--base-url",
        ctx.mock.base_url,
        "--addr",
        f"127.0.0.1:{port}",
        "--sessions",
        url,
        "--info-out",
        info,
    ] + extra
    result = serve_and_measure(
        ctx, name, cmd, ctx.child_env(), ctx.work, port, "/api/health", adkserver_session, 60, dbs, data,
        ctx.pg.counters if dbs else None,
    )  # fmt: skip
    about = {}
    if os.path.exists(info):
        with open(info) as f:
            about = json.load(f)
    result["versions"] = about.get("versions", {})
    result["kept"] = kept(ctx, name, ["sessions", "events"], None if dbs else os.path.join(data, "sessions.db"))
    if name == "adk-pg":
        result["durability"] = dict(ctx.pg.settings, database="PostgreSQL (its own server process)")
    else:
        sq = about.get("sqlite", {})
        sync = {"0": "OFF", "1": "NORMAL", "2": "FULL", "3": "EXTRA"}.get(
            str(sq.get("synchronous")), sq.get("synchronous")
        )
        result["durability"] = {
            "database": f"SQLite {sq.get('sqlite_version', '?')} (in the server process)",
            "journal_mode": sq.get("journal_mode"),
            "synchronous": sync,
            "pool": f"sqlx, at most {ADK_SQLITE['max-connections']} connection(s)"
            if ADK_SQLITE.get("max-connections")
            else "sqlx's default",
        }
    return result


def serve_and_measure(
    ctx, name, cmd, env, cwd, port, ready_path, session, startup_s, dbs=None, data_dir=None, probe=None
):
    logfile = os.path.join(ctx.logs, f"{name}.log")
    with open(logfile, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(port, ready_path, proc, startup_s, name)
        result = asyncio.run(http_phases(ctx, name, port, proc.pid, session, dbs, data_dir, probe, logfile))
        if proc.poll() is not None:
            raise RowFailed(f"{name} exited with {proc.returncode} during the run")
        return result
    except RowFailed as e:
        raise RowFailed(f"{e}; see {logfile}") from None
    finally:
        stop(proc)


def row_cadre(ctx, name, binary):
    if name == "cadre-tmpfs":
        data = f"/dev/shm/cadre-peers-{os.getpid()}"
    elif name == "cadre-pg":
        data = os.path.join(ctx.work, "cadre-pg-data")
    else:
        data = os.path.join(ctx.work, "cadre-data")
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    agents = os.path.join(ctx.work, "cadre-agents")
    shutil.rmtree(agents, ignore_errors=True)
    # tools/ and workflows/ present (empty), so cadre watches them instead of
    # polling for their creation every 5 s during the measurement.
    for sub in ("tools", "workflows"):
        os.makedirs(os.path.join(agents, sub))
    shutil.copy(os.path.join(HERE, "cadre-agent.toml"), os.path.join(agents, "peers.toml"))
    port = free_port()
    env = ctx.child_env()
    for k in list(env):
        if k.startswith("CADRE_") or k == "OPENAI_API_KEY":
            del env[k]
    env.update(
        {
            "CADRE_MODEL_BASE_URL": ctx.mock.base_url,
            "CADRE_MODEL_API_KEY": "peers",
            "CADRE_MODEL": "mock-model",
            # As benches/load.rs: every request comes from 127.0.0.1, so the
            # per-caller rate limit, the per-address connection cap and the
            # executor's queue depth are lifted; the rest is `cadre serve`'s
            # default (request log on, tool pool of 10).
            "CADRE_API_LIMIT_PER_SECOND": "1000000000",
            "CADRE_API_LIMIT_BURST": "1000000000",
            "CADRE_CONCURRENCY_QUEUE_SIZE": str(max(1000, ctx.conc * 4)),
            "CADRE_SERVER_MAX_CONNECTIONS": "100000",
            "CADRE_SERVER_MAX_CONNECTIONS_PER_ADDRESS": "100000",
        }
    )
    cmd = [binary, "serve", "--addr", f"127.0.0.1:{port}", "--data-dir", data, "--agents", agents]
    dbs, measured_dir = None, data
    if name == "cadre-pg":
        pg = postgres(ctx)
        cmd += ["--store", pg.database(name), "--node-id", "n0", "--advertise", f"http://127.0.0.1:{port}"]
        dbs, measured_dir = {"postgres": pg.proc.pid}, pg.data
    try:
        result = serve_and_measure(
            ctx, name, cmd, env, ctx.work, port, "/healthz", cadre_session, 60, dbs, measured_dir,
            ctx.pg.counters if dbs else None,
        )  # fmt: skip
    finally:
        fs = subprocess.run(["stat", "-f", "-c", "%T", data], capture_output=True, text=True).stdout.strip()
        if name == "cadre-tmpfs":
            shutil.rmtree(data, ignore_errors=True)
    result["data_dir"] = {"path": data, "fs": fs}
    if name == "cadre-pg":
        result["kept"] = kept(ctx, name, ["sessions", "messages"])
        result["durability"] = dict(
            ctx.pg.settings,
            database="PostgreSQL (its own server process)",
            cadre="as on redb, the turn's durable commit waits for its WAL flush; the other commits (a batch "
            "without a durable request) `SET LOCAL synchronous_commit = off`",
        )
    else:
        result["durability"] = {"database": f"redb, in the server process ({fs})", "fsync": "on the durable commits"}
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    if ctx.cadre_bin_given:
        # Built elsewhere: the checkout's commit need not be the binary's.
        built = f"the binary {binary}"
    else:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        built = rev.stdout.strip() or "no git"
    result["versions"] = {"cadre": (version.split()[-1] if version else "?") + f" ({built})"}
    return result


def lgserver_dir(ctx, name, extra=()):
    """target/peers/<name> with the graph's files: the server runs there,
    never in the source tree (`langgraph dev` keeps its state in its working
    directory's .langgraph_api)."""
    cwd = os.path.join(ctx.work, name)
    shutil.rmtree(cwd, ignore_errors=True)
    os.makedirs(cwd)
    for f in ("langgraph.json", "lg_graph.py", "driver.py") + tuple(extra):
        shutil.copy(os.path.join(HERE, "rows", f), cwd)
    return cwd


def lgserver_env(ctx):
    env = ctx.child_env()
    env.update(
        {
            "OPENAI_BASE_URL": ctx.mock.base_url,
            "OPENAI_API_KEY": "peers",
            "PEERS_LGSERVER": "1",
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "LANGSMITH_TRACING": "false",
            "LANGCHAIN_TRACING_V2": "false",
            "LANGSMITH_API_KEY": "",
            "LANGCHAIN_API_KEY": "",
            # run_server's check for a newer langgraph-api on PyPI
            "LANGGRAPH_NO_VERSION_CHECK": "1",
        }
    )
    return env


def row_lgserver(ctx, name, py):
    cwd, port, env = lgserver_dir(ctx, name), free_port(), lgserver_env(ctx)
    cmd = [
        os.path.join(os.path.dirname(py), "langgraph"), "dev", "--no-browser", "--no-reload",
        "--host", "127.0.0.1", "--port", str(port), "--config", "langgraph.json",
        "--n-jobs-per-worker", str(ctx.conc),
    ]  # fmt: skip
    result = serve_and_measure(ctx, name, cmd, env, cwd, port, "/ok", lgserver_session, 120)
    result["versions"] = pip_versions(py, VERSION_KEYS[name])
    result["durability"] = {
        "database": "none: in memory, pickled to .langgraph_api/ every 10 s (no fsync)",
    }
    return result


def row_lgserver_pg(ctx, name, py):
    """rows/lgserver_pg.py: langgraph_api.cli.run_server with the runtime
    edition `pg` on the run's PostgreSQL (a database of its own) and Redis;
    as `langgraph dev`, `--n-jobs-per-worker` = the concurrency."""
    pg, rd = postgres(ctx), redis(ctx)
    cwd, port, env = lgserver_dir(ctx, name, ["lgserver_pg.py"]), free_port(), lgserver_env(ctx)
    cmd = [
        py, "lgserver_pg.py", "--port", str(port), "--database-uri", pg.database(name),
        "--redis-uri", rd.url, "--n-jobs", str(ctx.conc),
    ]  # fmt: skip
    dbs = {"postgres": pg.proc.pid, "redis": rd.proc.pid}
    result = serve_and_measure(ctx, name, cmd, env, cwd, port, "/ok", lgserver_session, 180, dbs, pg.data, pg.counters)
    result["versions"] = pip_versions(py, VERSION_KEYS[name])
    result["kept"] = kept(ctx, name, ["threads", "runs", "checkpoints"])
    result["durability"] = dict(
        pg.settings,
        database="PostgreSQL (its own server process) + Redis (its own process)",
        redis=", ".join(f"{k} {v!r}" for k, v in rd.settings.items()),
    )
    return result


def pip_versions(py, names):
    code = "import sys,json; from importlib.metadata import version; print(json.dumps({n: version(n) for n in sys.argv[1:]}))"
    out = subprocess.run([py, "-c", code] + names, capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}


# ---------------------------------------------------------------------------
# Figures and the report
# ---------------------------------------------------------------------------


def figures(result, mock_stats):
    sessions = mock_stats["sessions"]

    def phase(p):
        walls = result[p]["wall_s"]
        over, mock_t, bad = [], [], 0
        for sid, wall in walls.items():
            calls, t = sessions.get(sid, [0, 0.0])
            if calls != 2:
                bad += 1
                continue
            over.append(wall - t)
            mock_t.append(t)
        n = result[p]["n"]
        return {
            "n": n,
            "ok": len(over),
            "not_2_model_calls": bad,
            "cpu_ms_per_session": 1e3 * result[p]["cpu_s"] / n if n else None,
            "db_cpu_ms_per_session": 1e3 * result[p]["db_cpu_s"] / n
            if n and result[p].get("db_cpu_s") is not None
            else None,
            "overhead_ms_p50": 1e3 * statistics.median(over) if over else None,
            "overhead_ms_mean": 1e3 * statistics.fmean(over) if over else None,
            "wall_ms_p50": 1e3 * statistics.median(walls.values()) if walls else None,
            "mock_ms_per_session": 1e3 * statistics.fmean(mock_t) if mock_t else None,
            "sessions_per_s": len(walls) / result[p]["elapsed_s"] if result[p]["elapsed_s"] else None,
            "elapsed_s": result[p]["elapsed_s"],
        }

    f = {"seq": phase("seq"), "conc": phase("conc"), "rss_mb": (result.get("vm_hwm_kb") or 0) / 1024}
    f["errors"] = result.get("error_count", 0)
    f["error_samples"] = result.get("errors", [])[:5]
    expected = result["warmup"] + result["seq"]["n"] + result["conc"]["n"]
    if "tool_calls" in result and result["tool_calls"] != expected:
        f["tool_call_mismatch"] = f"{result['tool_calls']} tool calls for {expected} sessions"
    st = result.get("storage")
    if st and st["sessions"]:
        written = sum(st["write_bytes"].values()) - st["counters"].get("log_bytes", 0)
        f["storage"] = {
            "write_bytes_per_session": max(0, written) / st["sessions"],
            "pg_wal_bytes_per_session": st["counters"]["pg_wal_bytes"] / st["sessions"]
            if "pg_wal_bytes" in st["counters"]
            else None,
        }  # fmt: skip
    f["untagged_model_requests"] = mock_stats.get("untagged", 0)
    f["streamed_model_requests"] = mock_stats.get("streamed", 0)
    return f


def fmt_ms(v):
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:.0f} ms"
    if v >= 10:
        return f"{v:.1f} ms"
    return f"{v:.2f} ms"


def fmt_bytes(v):
    if v is None:
        return "–"
    if v >= 1 << 20:
        return f"{v / (1 << 20):.1f} MiB"
    if v >= 1 << 10:
        return f"{v / (1 << 10):.1f} KiB"
    return f"{v:.0f} B"


# The settings of a row's `durability` shown in the report, in this order.
DURABILITY_KEYS = ("journal_mode", "synchronous", "pool", "synchronous_commit", "fsync", "wal_sync_method", "full_page_writes",
                   "cadre", "redis")  # fmt: skip


def durability_text(r, kind):
    d = r.get("durability")
    if not d:
        return "nothing: in memory, for the process's life" if kind in ("python", "adk") else "–"
    return "; ".join([d.get("database", "?")] + [f"{k}: {d[k]}" for k in DURABILITY_KEYS if k in d])


def ratio(v, ref):
    if v is None or not ref:
        return "–"
    return f"{v / ref:.1f}×" if v / ref >= 1.95 else f"{v / ref:.2f}×"


def machine():
    model = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) // 1024 // 1024} GiB"
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "rustc": subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip(),
    }


def report(ctx, results):
    m = machine()
    ref = results.get("cadre-disk", {}).get("figures")
    ref_seq = ref["seq"]["cpu_ms_per_session"] if ref else None
    ref_conc = ref["conc"]["cpu_ms_per_session"] if ref else None
    lines = [
        "# benches/peers: the cost of one tool-calling session",
        "",
        f"- date: {ctx.started} → {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}",
        f"- machine: {m['nproc']} CPUs, {m['cpu']}, {m['memory']}, Linux {m['kernel']}; {m['rustc']}; Python {m['python']}",
        f"- load average before the run: {ctx.load_before}; after: {open('/proc/loadavg').read().split()[:3]}",
        '- workload: 1 session = user asks, model asks for `calculator` {"expression": "2+3"}, tool runs, model answers (2 model calls + 1 tool call); one mock model (stdlib Python, own process) for every row',
        f"- N: {ctx.warmup} warm-up sessions, then up to {ctx.seq} sessions one at a time (stops after {ctx.seq_cap_s:.0f} s), then up to {ctx.total} sessions with {ctx.conc} in flight (none started after {ctx.conc_cap_s:.0f} s); the N each row reached is in the second table"
        + (" — **--quick run**" if ctx.quick else ""),
        f"- command: `benches/peers/run.sh{(' ' + ' '.join(ctx.argv)) if ctx.argv else ''}`",
        "",
        f"| | overhead per session, 1 at a time | CPU per session, 1 at a time | × cadre durable | CPU per session, {ctx.conc} at once | × cadre durable | peak RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label, _kind, _venv in ROWS:
        if name not in results:
            continue
        r = results[name]
        versions = ", ".join(f"{k} {v}" for k, v in (r.get("versions") or {}).items())
        title = f"{label}" + (f" — {versions}" if versions else "")
        if "error" in r:
            lines.append(f"| {title} | did not run: {r['error_line']} | | | | | |")
            continue
        f = r["figures"]
        lines.append(
            f"| {title} | {fmt_ms(f['seq']['overhead_ms_p50'])} | {fmt_ms(f['seq']['cpu_ms_per_session'])} | "
            f"{ratio(f['seq']['cpu_ms_per_session'], ref_seq)} | {fmt_ms(f['conc']['cpu_ms_per_session'])} | "
            f"{ratio(f['conc']['cpu_ms_per_session'], ref_conc)} | {f['rss_mb']:.0f} MiB |"
        )
    lines += [
        "",
        "Details (N = sessions measured; overhead mean beside the p50; mock = the mock's own time per session; "
        "sessions/s and p50 latency at the concurrent phase; other processes = CPU the machine spent outside this benchmark's "
        "processes (row, mock, harness) while the row ran, in cores on average):",
        "",
        f"| row | N 1 at a time | overhead p50 / mean | mock per session | N at {ctx.conc} | sessions/s | p50 latency | streamed model replies | other processes | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _label, _kind, _venv in ROWS:
        if name not in results or "error" in results[name]:
            continue
        r = results[name]
        f = r["figures"]
        s, c = f["seq"], f["conc"]
        problems = []
        if f["errors"]:
            problems.append(f"{f['errors']} failed sessions")
        if s["not_2_model_calls"] or c["not_2_model_calls"]:
            problems.append(f"{s['not_2_model_calls'] + c['not_2_model_calls']} sessions without exactly 2 model calls")
        if f.get("tool_call_mismatch"):
            problems.append(f["tool_call_mismatch"])
        if f["untagged_model_requests"]:
            problems.append(f"{f['untagged_model_requests']} model requests without a session tag")
        others = r["others_cpu_s"] / r["row_elapsed_s"] if r.get("row_elapsed_s") else 0.0
        lines.append(
            f"| {name} | {s['n']} | {fmt_ms(s['overhead_ms_p50'])} / {fmt_ms(s['overhead_ms_mean'])} | "
            f"{fmt_ms(s['mock_ms_per_session'])} | {c['n']} | {c['sessions_per_s']:.0f} | {fmt_ms(c['wall_ms_p50'])} | {f['streamed_model_requests']} | "
            f"{others:.2f} cores over {r['row_elapsed_s']:.1f} s | {'; '.join(problems) or 'none'} |"
        )
    lines += [
        "",
        (
            "What each row keeps and what its database costs (DB CPU = the CPU of the database servers' process "
            "trees (PostgreSQL with its backends, Redis), measured apart from the row's CPU above, per session; "
            "row + DB = both; bytes written = what the row's server and its database servers wrote to the block "
            "device over the measured phases (`write_bytes` of /proc/<pid>/io, less the server's own log file), "
            "per session, 0 on tmpfs; PostgreSQL WAL = the WAL the cluster inserted over the phases, per session):"
        ),
        "",
        (
            f"| row | in front | what it keeps, durability | DB CPU per session, 1 at a time / {ctx.conc} at once | "
            f"row + DB CPU per session, 1 at a time / {ctx.conc} at once | bytes written per session | "
            "PostgreSQL WAL per session | kept in its database after the run (counted there) |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, _label, kind, _venv in ROWS:
        if name not in results or "error" in results[name]:
            continue
        r = results[name]
        f = r["figures"]
        s, c = f["seq"], f["conc"]
        st = f.get("storage") or {}
        if s.get("db_cpu_ms_per_session") is not None:
            db = f"{fmt_ms(s['db_cpu_ms_per_session'])} / {fmt_ms(c['db_cpu_ms_per_session'])}"
            both = (
                f"{fmt_ms(s['cpu_ms_per_session'] + s['db_cpu_ms_per_session'])} / "
                f"{fmt_ms(c['cpu_ms_per_session'] + c['db_cpu_ms_per_session'])}"
            )
        else:
            db = "– (in the row's process)" if kind in ("adkserver", "cadre") else "–"
            both = "–"
        front = "in-process" if kind in ("python", "adk") else "HTTP"
        written, wal = fmt_bytes(st.get("write_bytes_per_session")), fmt_bytes(st.get("pg_wal_bytes_per_session"))
        run = r["warmup"] + s["n"] + c["n"]
        kept_rows = ", ".join(f"{v} {k}" for k, v in (r.get("kept") or {}).items())
        kept_text = f"{kept_rows} (of {run} sessions run)" if kept_rows else "–"
        lines.append(
            f"| {name} | {front} | {durability_text(r, kind)} | {db} | {both} | {written} | {wal} | {kept_text} |"
        )
    failed = [n for n in results if "error" in results[n]]
    if failed:
        lines += ["", "Rows that did not run:", ""]
        for n in failed:
            lines.append(f"- {n}: {results[n]['error']}".replace("\n", "\n  "))
    dirs = []
    for name, *_ in ROWS:
        r = results.get(name, {})
        path = (r.get("storage") or {}).get("data_dir")
        d = r.get("data_dir") if isinstance(r.get("data_dir"), dict) else {}
        if path:
            dirs.append(f"{name} `{path}`" + (f" ({d['fs']})" if d.get("path") == path else ""))
    if dirs:
        lines += ["", "Data dirs (kept after the run, but for tmpfs): " + "; ".join(dirs) + "."]
    return "\n".join(lines) + "\n", m


# ---------------------------------------------------------------------------


class Ctx:
    pass


def main():
    ap = argparse.ArgumentParser(description="benches/peers: one tool-calling session, side by side")
    ap.add_argument(
        "--only",
        help="comma-separated rows (" + ",".join(r[0] for r in ROWS) + "; `cadre` = the three cadre rows, "
        "`adk-server` = adk-sqlite,adk-pg)",
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: 5 warm-up, 50 one at a time, 400 at 200")
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--seq", type=int, help="sessions one at a time (default 500)")
    ap.add_argument("--conc", type=int, help="sessions in flight in the concurrent phase (default 200)")
    ap.add_argument("--total", type=int, help="sessions in the concurrent phase (default 2000)")
    ap.add_argument("--cadre-bin", help="use this cadre binary instead of building one")
    a = ap.parse_args()

    ctx = Ctx()
    ctx.argv = sys.argv[1:]
    ctx.quick = a.quick
    ctx.warmup = a.warmup if a.warmup is not None else (5 if a.quick else 20)
    ctx.seq = a.seq or (50 if a.quick else 500)
    ctx.conc = a.conc or 200
    ctx.total = a.total or (400 if a.quick else 2000)
    ctx.seq_cap_s = 20.0 if a.quick else 60.0
    ctx.conc_cap_s = 40.0 if a.quick else 120.0
    ctx.target = os.path.abspath(os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target"))
    ctx.work = os.path.join(REPO, "target", "peers")
    ctx.logs = os.path.join(ctx.work, "logs")
    ctx.cadre_bin = a.cadre_bin
    ctx.cadre_bin_given = bool(a.cadre_bin)
    ctx.pg = ctx.redis = None
    for d in (ctx.work, ctx.logs, os.path.join(ctx.work, "results")):
        os.makedirs(d, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LANGSMITH_", "LANGCHAIN_"))}
    base_env["PYTHONDONTWRITEBYTECODE"] = "1"
    ctx.child_env = lambda: dict(base_env)
    ctx.started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    ctx.load_before = open("/proc/loadavg").read().split()[:3]

    wanted = None
    if a.only:
        wanted = set()
        for w in a.only.split(","):
            w = w.strip()
            wanted |= ALIASES.get(w, {w})
        unknown = wanted - {r[0] for r in ROWS}
        if unknown:
            raise SystemExit(f"unknown rows: {', '.join(sorted(unknown))}")
    rows = [r for r in ROWS if wanted is None or r[0] in wanted]

    log(f"rows: {', '.join(r[0] for r in rows)}; outputs under {ctx.work}")
    results, prepared = {}, {}
    for name, label, kind, venv in rows:
        try:
            if kind in ("python", "lgserver", "lgserverpg"):
                prepared[name] = ensure_venv(venv, ctx)
            elif kind == "adk":
                prepared[name] = ensure_adk(ctx)
            elif kind == "adkserver":
                prepared[name] = ensure_adk(ctx, "peers-adk-server")
            else:
                prepared[name] = ensure_cadre(ctx)
        except Exception as e:  # noqa: BLE001 - reported in the table, the other rows go on
            msg = str(e) if isinstance(e, RowFailed) else traceback.format_exc()
            results[name] = {
                "error": "setup failed: " + msg.strip(),
                "error_line": "setup failed: " + msg.strip().splitlines()[0][:200],
            }
            log(f"{name}: SETUP FAILED: {msg.strip().splitlines()[0]}")

    ctx.mock = Mock(ctx)
    log(f"mock model at {ctx.mock.base_url} (pid {ctx.mock.proc.pid})")
    try:
        for name, label, kind, venv in rows:
            if name not in prepared:
                continue
            log(f"{name}: {label}")
            ctx.mock.reset()
            busy0, t0, own0, mock0 = machine_busy_s(), time.time(), own_cpu_s(), tree_cpu_s(ctx.mock.proc.pid)
            db0 = databases_cpu_s(ctx)
            try:
                run_row = {
                    "python": row_python,
                    "adk": row_adk,
                    "adkserver": row_adkserver,
                    "cadre": row_cadre,
                    "lgserver": row_lgserver,
                    "lgserverpg": row_lgserver_pg,
                }[kind]
                r = run_row(ctx, name, prepared[name])
                r["figures"] = figures(r, ctx.mock.stats())
                elapsed = time.time() - t0
                ours = own_cpu_s() - own0 + tree_cpu_s(ctx.mock.proc.pid) - mock0 + databases_cpu_s(ctx) - db0
                r["row_elapsed_s"] = elapsed
                r["others_cpu_s"] = max(0.0, machine_busy_s() - busy0 - ours)
                f = r["figures"]
                log(
                    f"{name}: overhead p50 {fmt_ms(f['seq']['overhead_ms_p50'])}, CPU/session "
                    f"{fmt_ms(f['seq']['cpu_ms_per_session'])} (1 at a time), "
                    f"{fmt_ms(f['conc']['cpu_ms_per_session'])} ({ctx.conc} at once), RSS {f['rss_mb']:.0f} MiB, "
                    f"errors {f['errors']}"
                )
            except Exception as e:  # noqa: BLE001 - one row's failure is reported, the run goes on
                msg = str(e) if isinstance(e, RowFailed) else traceback.format_exc()
                first = msg.strip().splitlines()[0] if msg.strip() else repr(e)
                r = {"error": msg.strip(), "error_line": first[:200]}
                log(f"{name}: FAILED: {first}")
            results[name] = r
    finally:
        stop(ctx.mock.proc)
        for db in (ctx.pg, ctx.redis):
            if db is not None:
                db.stop()

    text, m = report(ctx, results)
    with open(os.path.join(ctx.work, "report.md"), "w") as f:
        f.write(text)
    slim = {}
    for n, r in results.items():
        slim[n] = {k: v for k, v in r.items() if k not in ("seq", "conc")}
        for p in ("seq", "conc"):
            if p in r:
                slim[n][p] = {k: v for k, v in r[p].items() if k != "wall_s"}
    with open(os.path.join(ctx.work, "report.json"), "w") as f:
        json.dump(
            {
                "machine": m,
                "started": ctx.started,
                "argv": ctx.argv,
                "settings": {
                    "warmup": ctx.warmup,
                    "seq": ctx.seq,
                    "seq_cap_s": ctx.seq_cap_s,
                    "conc": ctx.conc,
                    "total": ctx.total,
                    "conc_cap_s": ctx.conc_cap_s,
                },  # fmt: skip
                "rows": slim,
            },
            f,
            indent=1,
        )
    print()
    print(text)
    log(f"written: {os.path.join(ctx.work, 'report.md')} and report.json")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
