-- Bytes of a session's stored messages (their JSON text), kept by the
-- statement that inserts them; a tenant's storage is the sum over its
-- sessions (`store::storage`). Counted here for the messages already there.
ALTER TABLE sessions ADD COLUMN stored_bytes bigint NOT NULL DEFAULT 0;

UPDATE sessions s SET stored_bytes = m.bytes
FROM (SELECT session_id, sum(octet_length(body::text))::bigint AS bytes
      FROM messages GROUP BY session_id) m
WHERE m.session_id = s.id;
