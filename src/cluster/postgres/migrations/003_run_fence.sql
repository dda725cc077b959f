-- The epoch fence of a workflow run's writes, as `cadre_fence` is of a
-- session's: refuses (SQLSTATE CF001) unless the run is still at `ep`, and
-- holds its row (FOR SHARE) until the transaction ends, so a takeover's
-- UPDATE of the epoch waits for it.
CREATE FUNCTION cadre_fence_run(rid text, ep bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM workflow_runs WHERE key = rid AND epoch = ep FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'workflow run % is fenced: epoch % is stale', rid, ep
            USING ERRCODE = 'CF001';
    END IF;
END
$$;

-- What the takeover sweep reads: the runs still running.
CREATE INDEX workflow_runs_running ON workflow_runs (key) WHERE (body->>'status') = 'running';
