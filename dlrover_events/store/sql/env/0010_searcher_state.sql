-- The searcher's checkpoint (streams/searcher/runtime): each experiment's state, the
-- events its decisions caused that are not yet known to be published (the outbox), and
-- the input offsets they cover, all written in one transaction per batch. A searcher
-- killed at any moment resumes from here: what it decided is published from the outbox,
-- never decided again, and the inputs after the offsets are decided once.

-- One row per experiment the searcher began. `state`: the core's ExperimentState
-- (streams/searcher/core/state.py, to_json); `wing`: what the runtime keeps beside it
-- (the spec, each trial's job as the operator named it, effects waiting for a job's uid).
-- `version` grows by one per write, so a searcher knows whether its copy is current.
CREATE TABLE searcher_state (
    experiment  text PRIMARY KEY,
    state       jsonb NOT NULL,
    wing        jsonb NOT NULL,
    version     bigint NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Events decided and not yet known to be published, in the order they must go out (id).
-- Written with the state that decided them; deleted once the broker has them. Publishing
-- one again (a crash before its delete) duplicates nothing: every event carries the id,
-- request_id or plan_id its consumers keep once.
CREATE TABLE searcher_outbox (
    id          bigserial PRIMARY KEY,
    experiment  text NOT NULL,
    topic       text NOT NULL,
    key         text,
    value       bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX searcher_outbox_experiment ON searcher_outbox (experiment, id);

-- Next input offset per partition: every record before it is in searcher_state.
CREATE TABLE searcher_offsets (
    topic        text NOT NULL,
    partition    integer NOT NULL,
    next_offset  bigint NOT NULL CHECK (next_offset >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition)
);
