-- Every logical table of the redb store as a real table with real keys.
-- Keys are text COLLATE "C": byte order, as redb orders them, so cursors
-- and pages agree between the backends. Bodies are json (not jsonb): the
-- store filters on columns only, json keeps the text as sent (jsonb refuses
-- \u0000, which a user message may hold) and costs no conversion on write.

CREATE TABLE meta (
    key text COLLATE "C" PRIMARY KEY,
    value bigint NOT NULL
);

CREATE TABLE nodes (
    id text COLLATE "C" PRIMARY KEY,
    addr text,
    heartbeat_at timestamptz NOT NULL
);

-- owner/epoch: the fencing token of the one writer per session.
CREATE TABLE sessions (
    id text COLLATE "C" PRIMARY KEY,
    tenant text COLLATE "C" NOT NULL,
    owner text COLLATE "C",
    epoch bigint NOT NULL DEFAULT 1,
    body json NOT NULL
);
CREATE INDEX sessions_by_tenant ON sessions (tenant, id);

CREATE TABLE messages (
    session_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    is_user boolean NOT NULL,
    body json NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE summaries (
    session_id text COLLATE "C" PRIMARY KEY,
    body json NOT NULL
);

CREATE TABLE tool_calls (
    record_id text COLLATE "C" PRIMARY KEY,
    tenant text COLLATE "C",
    tool_name text COLLATE "C" NOT NULL,
    conversation_id text COLLATE "C",
    workflow_id text COLLATE "C",
    body json NOT NULL
);
CREATE INDEX tool_calls_by_conversation ON tool_calls (conversation_id, record_id)
    WHERE conversation_id IS NOT NULL;
CREATE INDEX tool_calls_by_workflow ON tool_calls (workflow_id, record_id)
    WHERE workflow_id IS NOT NULL;
CREATE INDEX tool_calls_by_tool ON tool_calls (tool_name, record_id);
CREATE INDEX tool_calls_by_tenant ON tool_calls (tenant, record_id)
    WHERE tenant IS NOT NULL;
CREATE INDEX tool_calls_by_tenant_conversation ON tool_calls (tenant, conversation_id, record_id)
    WHERE tenant IS NOT NULL AND conversation_id IS NOT NULL;
CREATE INDEX tool_calls_by_tenant_workflow ON tool_calls (tenant, workflow_id, record_id)
    WHERE tenant IS NOT NULL AND workflow_id IS NOT NULL;
CREATE INDEX tool_calls_by_tenant_tool ON tool_calls (tenant, tool_name, record_id)
    WHERE tenant IS NOT NULL;

-- One row per (tool, node), written by that node only: no hot row.
CREATE TABLE tool_stats (
    tool text COLLATE "C" NOT NULL,
    node text COLLATE "C" NOT NULL,
    total_calls bigint NOT NULL,
    successful_calls bigint NOT NULL,
    failed_calls bigint NOT NULL,
    total_execution_time_ms bigint NOT NULL,
    PRIMARY KEY (tool, node)
);

-- The namespaces of today's DOCS table (confirmations, workflow runs and
-- items, tools' state, tenant configs, keys); tenant and session_id are
-- the listing index and the erase link.
CREATE TABLE docs (
    namespace text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    body json NOT NULL,
    tenant text COLLATE "C",
    session_id text COLLATE "C",
    PRIMARY KEY (namespace, key)
);
CREATE INDEX docs_by_tenant ON docs (namespace, tenant, key) WHERE tenant IS NOT NULL;
CREATE INDEX docs_by_session ON docs (session_id) WHERE session_id IS NOT NULL;

-- Written by the session's owner only.
CREATE TABLE session_usage (
    session_id text COLLATE "C" PRIMARY KEY,
    prompt_tokens bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    total_tokens bigint NOT NULL,
    model_calls bigint NOT NULL
);

-- One row per (tenant, day, agent, node): no hot row; summed on read.
CREATE TABLE tenant_usage (
    tenant text COLLATE "C" NOT NULL,
    day text COLLATE "C" NOT NULL,
    agent text COLLATE "C" NOT NULL,
    node text COLLATE "C" NOT NULL,
    prompt_tokens bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    total_tokens bigint NOT NULL,
    model_calls bigint NOT NULL,
    PRIMARY KEY (tenant, day, agent, node)
);

CREATE TABLE turns (
    session_id text COLLATE "C" NOT NULL,
    turn_id text COLLATE "C" NOT NULL,
    open boolean NOT NULL,
    body json NOT NULL,
    PRIMARY KEY (session_id, turn_id)
);
CREATE INDEX open_turns ON turns (session_id, turn_id) WHERE open;

CREATE TABLE turn_keys (
    session_id text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    turn_id text COLLATE "C" NOT NULL,
    PRIMARY KEY (session_id, key)
);

CREATE TABLE idempotency (
    tenant text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    stored_at_ms bigint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX idempotency_by_age ON idempotency (stored_at_ms);

-- The epoch fence of a write request: refuses (SQLSTATE CF001) unless the
-- session is still at `ep`, and holds its row (FOR SHARE) until the
-- transaction ends, so a takeover's UPDATE of the epoch waits for it.
CREATE FUNCTION cadre_fence(sid text, ep bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM sessions WHERE id = sid AND epoch = ep FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'session % is fenced: epoch % is stale', sid, ep
            USING ERRCODE = 'CF001';
    END IF;
END
$$;
