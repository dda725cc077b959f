-- The store's own kinds of documents, out of `docs` into tables of their
-- own (redb schema 3 did the same): keyed by the document's key alone,
-- with the tenant index and the erase link as columns, like `docs`. The
-- rows already in `docs` are moved by the migration that runs this file
-- (`docs::move_own_docs`), in the same transaction. Every table gets the
-- two partial indexes `docs` has: by tenant (listings) and by session (an
-- erase deletes from every table by session).

-- Pending confirmations, by confirmation id.
CREATE TABLE confirmations (
    key text COLLATE "C" PRIMARY KEY,
    body json NOT NULL,
    tenant text COLLATE "C",
    session_id text COLLATE "C"
);
CREATE INDEX confirmations_by_tenant ON confirmations (tenant, key) WHERE tenant IS NOT NULL;
CREATE INDEX confirmations_by_session ON confirmations (session_id) WHERE session_id IS NOT NULL;

-- Decided confirmations, by confirmation id.
CREATE TABLE confirmations_decided (
    key text COLLATE "C" PRIMARY KEY,
    body json NOT NULL,
    tenant text COLLATE "C",
    session_id text COLLATE "C"
);
CREATE INDEX confirmations_decided_by_tenant ON confirmations_decided (tenant, key)
    WHERE tenant IS NOT NULL;
CREATE INDEX confirmations_decided_by_session ON confirmations_decided (session_id)
    WHERE session_id IS NOT NULL;

-- Tenant configs, by tenant.
CREATE TABLE tenant_configs (
    key text COLLATE "C" PRIMARY KEY,
    body json NOT NULL,
    tenant text COLLATE "C",
    session_id text COLLATE "C"
);
CREATE INDEX tenant_configs_by_tenant ON tenant_configs (tenant, key) WHERE tenant IS NOT NULL;
CREATE INDEX tenant_configs_by_session ON tenant_configs (session_id) WHERE session_id IS NOT NULL;

-- API keys, by key id.
CREATE TABLE api_keys (
    key text COLLATE "C" PRIMARY KEY,
    body json NOT NULL,
    tenant text COLLATE "C",
    session_id text COLLATE "C"
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant, key) WHERE tenant IS NOT NULL;
CREATE INDEX api_keys_by_session ON api_keys (session_id) WHERE session_id IS NOT NULL;

-- Workflow runs, by run id. owner/epoch: the fencing token of the one
-- node that runs it (as for sessions).
CREATE TABLE workflow_runs (
    key text COLLATE "C" PRIMARY KEY,
    body json NOT NULL,
    tenant text COLLATE "C",
    session_id text COLLATE "C",
    owner text COLLATE "C",
    epoch bigint NOT NULL DEFAULT 1
);
CREATE INDEX workflow_runs_by_tenant ON workflow_runs (tenant, key) WHERE tenant IS NOT NULL;
CREATE INDEX workflow_runs_by_session ON workflow_runs (session_id) WHERE session_id IS NOT NULL;

-- Map elements of workflow runs, by `<run id>/<node>/<index>`.
CREATE TABLE workflow_items (
    key text COLLATE "C" PRIMARY KEY,
    body json NOT NULL,
    tenant text COLLATE "C",
    session_id text COLLATE "C"
);
CREATE INDEX workflow_items_by_tenant ON workflow_items (tenant, key) WHERE tenant IS NOT NULL;
CREATE INDEX workflow_items_by_session ON workflow_items (session_id) WHERE session_id IS NOT NULL;
