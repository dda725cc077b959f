"""Row `lgserver-pg`: stock `langgraph-api`'s server on the open
PostgreSQL + Redis runtime `langgraph-runtime-pg` (LANGGRAPH_RUNTIME_EDITION=pg).

Not LangGraph Platform / LangSmith Deployments (whose PostgreSQL runtime is
closed and licensed): `langgraph-runtime-pg` is a third-party MIT runtime
(github.com/langhost/langhost, not affiliated with LangChain) that plugs
into the unchanged `langgraph-api` package. This file makes the call its
CLI (`langhost serve`) and `langgraph dev` both make:
`langgraph_api.cli.run_server(...)`, here with `runtime_edition="pg"` and
the run's PostgreSQL and Redis, serving the graph of `langgraph.json`
beside it (`lg_graph.py`, the same graph as rows `langgraph`/`lgserver`).
The runtime migrates its schema at start (alembic) and keeps assistants,
threads, runs and checkpoints in PostgreSQL (`langgraph-checkpoint-postgres`
for the checkpoints); Redis carries the run queue's wake-ups and streams.

    python lgserver_pg.py --port P --database-uri postgres://... --redis-uri redis://... --n-jobs N

Runs in its working directory (peers.py copies this file, langgraph.json,
lg_graph.py and driver.py to target/peers/lgserver-pg/).
"""

import argparse
import json
import os
import sys

from langgraph_api.cli import run_server


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--database-uri", required=True)
    ap.add_argument("--redis-uri", required=True)
    ap.add_argument("--n-jobs", type=int, required=True)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "langgraph.json")) as f:
        config = json.load(f)
    sys.path.append(here)  # `dependencies: ["."]`, as `langgraph dev` does
    run_server(
        "127.0.0.1",
        a.port,
        False,
        config["graphs"],
        n_jobs_per_worker=a.n_jobs,
        env=config.get("env"),
        runtime_edition="pg",
        server_level="WARNING",
        __database_uri__=a.database_uri,
        __redis_uri__=a.redis_uri,
        __migrations_path__=None,
    )


if __name__ == "__main__":
    main()
