"""The session loop every in-process Python row shares (rows/*.py import it).

A row module gives `async def session(sid) -> str` (one whole session: the
question goes in, the framework calls the model, runs `calculator`, calls
the model again, the final text comes out) and the versions of what it
measures; `run(...)` does the phases and writes one JSON result, the same
shape as the ADK-Rust program and the harness's HTTP client write:

- warm-up: W sessions one after another, not measured;
- seq: up to N sessions one after another (stops early past --seq-cap-s);
  per session the wall time; the process's CPU over the phase;
- conc: up to T sessions with C in flight at once (C workers, each looping;
  no new session starts past --conc-cap-s); the process's CPU over it;
- the process's peak RSS (VmHWM) at the end.

CPU is `getrusage(RUSAGE_SELF)` user + sys: every thread of this process
(LangGraph's tool threads, the SDKs' pools) and the loop below, which is a
few microseconds per session. The session ids are `<row>-<phase>-<i>`; the
question carries the tag `[s:ID]` the mock charges its time to.
"""

import argparse
import ast
import asyncio
import json
import operator
import os
import resource
import time
import warnings

warnings.filterwarnings("ignore")

QUESTION = "What is 2+3? Use the calculator."
SYSTEM = "You are a helpful assistant. Use the calculator for any arithmetic and report its result."
EXPECT = "5"
TOOL_DESCRIPTION = "Evaluate an arithmetic expression: + - * / % ^ and parentheses."

# Every client's model-call timeout (connect included): the SDKs' 5 s connect
# timeout fails sessions when 200 connect at once on a busy 2-core machine.
TIMEOUT_S = 120.0

TOOL_CALLS = [0]

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitXor: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node):
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("not arithmetic")


def calculate(expression: str) -> str:
    """The rows' calculator: arithmetic only, through the AST (never eval)."""
    TOOL_CALLS[0] += 1
    value = _eval(ast.parse(expression, mode="eval"))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps({"expression": expression, "result": value})


CALCULATOR_SCHEMA = {
    "type": "object",
    "properties": {"expression": {"type": "string", "description": "The arithmetic expression, e.g. '(2+3)*4'"}},
    "required": ["expression"],
    "additionalProperties": False,
}


def question(sid):
    return f"[s:{sid}] {QUESTION}"


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def vm_hwm_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True, help="the mock's OpenAI base URL, .../v1")
    ap.add_argument("--row", required=True)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--seq", type=int, default=200)
    ap.add_argument("--seq-cap-s", type=float, default=60.0)
    ap.add_argument("--conc", type=int, default=200)
    ap.add_argument("--total", type=int, default=2000)
    ap.add_argument("--conc-cap-s", type=float, default=120.0)
    ap.add_argument("--out", required=True)
    return ap.parse_args()


async def _phases(a, session):
    errors = []

    async def one(sid):
        t0 = time.perf_counter()
        try:
            text = await session(sid)
        except Exception as e:  # noqa: BLE001 - reported, not hidden
            errors.append(f"{sid}: {e!r}"[:300])
            return None
        wall = time.perf_counter() - t0
        if EXPECT not in (text or ""):
            errors.append(f"{sid}: final text {text!r} lacks {EXPECT!r}"[:300])
        return wall

    for i in range(a.warmup):
        await one(f"{a.row}-w-{i}")

    seq = {}
    c0, t0 = cpu_s(), time.perf_counter()
    for i in range(a.seq):
        sid = f"{a.row}-s-{i}"
        wall = await one(sid)
        if wall is not None:
            seq[sid] = wall
        if time.perf_counter() - t0 > a.seq_cap_s:
            break
    seq_cpu, seq_elapsed = cpu_s() - c0, time.perf_counter() - t0
    seq_n = i + 1

    started = [0]
    conc = {}

    async def worker():
        while started[0] < a.total and time.perf_counter() - t1 <= a.conc_cap_s:
            i = started[0]
            started[0] += 1
            sid = f"{a.row}-c-{i}"
            wall = await one(sid)
            if wall is not None:
                conc[sid] = wall

    c1, t1 = cpu_s(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(a.conc)))
    conc_cpu, conc_elapsed = cpu_s() - c1, time.perf_counter() - t1

    return {
        "warmup": a.warmup,
        "seq": {"n": seq_n, "ok": len(seq), "cpu_s": seq_cpu, "elapsed_s": seq_elapsed, "wall_s": seq},
        "conc": {
            "n": started[0],
            "ok": len(conc),
            "concurrency": a.conc,
            "cpu_s": conc_cpu,
            "elapsed_s": conc_elapsed,
            "wall_s": conc,
        },
        "errors": errors[:20],
        "error_count": len(errors),
    }


def run(session, versions, setup=None):
    """Parse the command line, run the phases, write the JSON result."""
    a = args()
    if setup is not None:
        setup(a)
    result = asyncio.run(_phases(a, session))
    result.update(
        {
            "row": a.row,
            "pid": os.getpid(),
            "versions": versions,
            "tool_calls": TOOL_CALLS[0],
            "vm_hwm_kb": vm_hwm_kb(),
            "measured": "process (in-process framework + this loop)",
        }
    )
    with open(a.out, "w") as f:
        json.dump(result, f)
