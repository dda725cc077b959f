-- Bytes of the call records made outside a session (direct tool calls,
-- workflow tool nodes; their JSON text), per tenant, one row per node
-- (written by that node only, in the statement that writes or erases
-- the record: no hot row); a tenant's storage is its sessions' bytes plus
-- the sum of its rows here (`store::storage`). A row may go below zero
-- when one node erases what another counted; the sum is exact. Counted
-- here for the records already there.
CREATE TABLE tenant_call_bytes (
    tenant text COLLATE "C" NOT NULL,
    node text COLLATE "C" NOT NULL,
    bytes bigint NOT NULL,
    PRIMARY KEY (tenant, node)
);

INSERT INTO tenant_call_bytes (tenant, node, bytes)
SELECT tenant, 'migration', sum(octet_length(body::text))::bigint
FROM tool_calls
WHERE conversation_id IS NULL AND tenant IS NOT NULL
GROUP BY tenant;
