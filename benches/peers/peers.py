#!/usr/bin/env python3
"""benches/peers: the cost of one tool-calling session, side by side.

`benches/peers/run.sh` runs this file with the system python3 (stdlib only).
It installs what each row needs, starts the one mock model, runs every row
against it, one row at a time, and prints/writes the table.

    run.sh ─▶ peers.py ─┬─ mock_model.py (own process: its CPU is nobody's)
                        ├─ in-process rows: rows/row_*.py in their venv,
                        │  target/.../adk/release/peers-adk; each runs its
                        │  own session loop (rows/driver.py) and writes JSON
                        └─ server rows: `cadre serve`, `langgraph dev`; the
                           session loop is this process's HTTP client (its
                           CPU is not the server's); the server's CPU and
                           VmHWM are read from /proc/<pid>

One session, every row: the user asks (`[s:ID] What is 2+3? ...`), the model
asks for `calculator {"expression": "2+3"}`, the tool runs, the model
answers `2+3 = 5`. 2 model calls + 1 tool call; the harness checks both
(the mock's per-session call count, the row's tool count or cadre's reply)
and counts a session that did anything else as an error.

Figures (per row): overhead, 1 at a time = p50 over sessions of (the
session's wall time at its client − the mock's own time for that session's
two requests); CPU per session = the framework process's user+sys CPU over
a phase / the sessions started in it (1 at a time, then C at once); peak
RSS = VmHWM of that process at the end. Decisions, limits and what each row
does and does not do: benches/peers/README.md.
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
    ("langgraph", "LangGraph (prebuilt ReAct agent, in-process)", "python", "langgraph"),
    ("agents", "OpenAI Agents SDK (in-process)", "python", "agents"),
    ("autogen", "AutoGen AgentChat (in-process)", "python", "autogen"),
    ("bare", "bare `openai` SDK loop (in-process)", "python", "bare"),
    ("adk", "ADK-Rust (in-process, in-memory sessions)", "adk", None),
    ("cadre-disk", "cadre over HTTP, durable, data dir on disk", "cadre", None),
    ("cadre-tmpfs", "cadre over HTTP, data dir on tmpfs (/dev/shm)", "cadre", None),
]
VERSION_KEYS = {
    "lgserver": ["langgraph-api", "langgraph-cli", "langgraph"],
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


def ensure_adk(ctx):
    target = os.path.join(ctx.target, "peers", "adk")
    log(f"adk: cargo build --release (target {target})")
    cargo_build(os.path.join(HERE, "adk", "Cargo.toml"), target, [], os.path.join(ctx.logs, "setup-adk.log"))
    return os.path.join(target, "release", "peers-adk")


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


async def lgserver_session(conn, sid):
    t = await conn.request("POST", "/threads", {})
    out = await conn.request(
        "POST",
        f"/threads/{t['thread_id']}/runs/wait",
        {"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": f"[s:{sid}] {QUESTION}"}]}},
    )
    messages = (out or {}).get("messages") or []
    if not any(m.get("type") == "tool" for m in messages):
        raise RuntimeError(f"no tool message in the run's state: {str(out)[:300]}")
    return messages[-1].get("content") if messages else ""


async def http_phases(ctx, row, port, pid, session):
    """The phases of rows/driver.py, over HTTP, CPU and VmHWM of `pid`'s tree."""
    errors = []

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
    c0, t0 = tree_cpu_s(pid), time.perf_counter()
    n = 0
    for i in range(ctx.seq):
        n += 1
        sid = f"{row}-s-{i}"
        wall = await one(conn, sid)
        if wall is not None:
            seq[sid] = wall
        if time.perf_counter() - t0 > ctx.seq_cap_s:
            break
    seq_cpu, seq_elapsed = tree_cpu_s(pid) - c0, time.perf_counter() - t0
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

    c1, t1 = tree_cpu_s(pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(ctx.conc)))
    conc_cpu, conc_elapsed = tree_cpu_s(pid) - c1, time.perf_counter() - t1
    return {
        "warmup": ctx.warmup,
        "seq": {"n": n, "ok": len(seq), "cpu_s": seq_cpu, "elapsed_s": seq_elapsed, "wall_s": seq},
        "conc": {
            "n": started[0],
            "ok": len(conc),
            "concurrency": ctx.conc,
            "cpu_s": conc_cpu,
            "elapsed_s": conc_elapsed,
            "wall_s": conc,
        },
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


def serve_and_measure(ctx, name, cmd, env, cwd, port, ready_path, session, startup_s):
    logfile = os.path.join(ctx.logs, f"{name}.log")
    with open(logfile, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(port, ready_path, proc, startup_s, name)
        result = asyncio.run(http_phases(ctx, name, port, proc.pid, session))
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
    else:
        data = os.path.join(ctx.work, "cadre-data")
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    agents = os.path.join(ctx.work, "cadre-agents")
    shutil.rmtree(agents, ignore_errors=True)
    os.makedirs(agents)
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
    try:
        result = serve_and_measure(ctx, name, cmd, env, ctx.work, port, "/healthz", cadre_session, 60)
    finally:
        fs = subprocess.run(["stat", "-f", "-c", "%T", data], capture_output=True, text=True).stdout.strip()
        if name == "cadre-tmpfs":
            shutil.rmtree(data, ignore_errors=True)
    result["data_dir"] = {"path": data, "fs": fs}
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    result["versions"] = {"cadre": (version.split()[-1] if version else "?") + f" ({rev.stdout.strip() or 'no git'})"}
    return result


def row_lgserver(ctx, name, py):
    # `langgraph dev` keeps its in-memory state under ./.langgraph_api of
    # its working directory: run it in target/, never in the source tree.
    cwd = os.path.join(ctx.work, "lgserver")
    shutil.rmtree(cwd, ignore_errors=True)
    os.makedirs(cwd)
    for f in ("langgraph.json", "lg_graph.py", "driver.py"):
        shutil.copy(os.path.join(HERE, "rows", f), cwd)
    port = free_port()
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
        }
    )
    cmd = [
        os.path.join(os.path.dirname(py), "langgraph"), "dev", "--no-browser", "--no-reload",
        "--host", "127.0.0.1", "--port", str(port), "--config", "langgraph.json",
        "--n-jobs-per-worker", str(ctx.conc),
    ]  # fmt: skip
    result = serve_and_measure(ctx, name, cmd, env, cwd, port, "/ok", lgserver_session, 120)
    result["versions"] = pip_versions(py, VERSION_KEYS[name])
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
    failed = [n for n in results if "error" in results[n]]
    if failed:
        lines += ["", "Rows that did not run:", ""]
        for n in failed:
            lines.append(f"- {n}: {results[n]['error']}".replace("\n", "\n  "))
    if "cadre-disk" in results and "data_dir" in results["cadre-disk"]:
        d1 = results["cadre-disk"]["data_dir"]
        d2 = results.get("cadre-tmpfs", {}).get("data_dir", {})
        lines += [
            "",
            f"cadre's data dirs: disk `{d1['path']}` ({d1['fs']}); tmpfs `{d2.get('path', '–')}` ({d2.get('fs', '–')}).",
        ]
    return "\n".join(lines) + "\n", m


# ---------------------------------------------------------------------------


class Ctx:
    pass


def main():
    ap = argparse.ArgumentParser(description="benches/peers: one tool-calling session, side by side")
    ap.add_argument(
        "--only", help="comma-separated rows (" + ",".join(r[0] for r in ROWS) + "; `cadre` = both cadre rows)"
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
            wanted |= {"cadre-disk", "cadre-tmpfs"} if w == "cadre" else {w}
        unknown = wanted - {r[0] for r in ROWS}
        if unknown:
            raise SystemExit(f"unknown rows: {', '.join(sorted(unknown))}")
    rows = [r for r in ROWS if wanted is None or r[0] in wanted]

    log(f"rows: {', '.join(r[0] for r in rows)}; outputs under {ctx.work}")
    results, prepared = {}, {}
    for name, label, kind, venv in rows:
        try:
            if kind in ("python", "lgserver"):
                prepared[name] = ensure_venv(venv, ctx)
            elif kind == "adk":
                prepared[name] = ensure_adk(ctx)
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
            try:
                run_row = {"python": row_python, "adk": row_adk, "cadre": row_cadre, "lgserver": row_lgserver}[kind]
                r = run_row(ctx, name, prepared[name])
                r["figures"] = figures(r, ctx.mock.stats())
                elapsed = time.time() - t0
                ours = own_cpu_s() - own0 + tree_cpu_s(ctx.mock.proc.pid) - mock0
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
