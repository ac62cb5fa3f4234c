-- The brain's checkpoint: every job's state and, in the same transaction, the input
-- offsets that state covers, so a restarted brain resumes exactly where its state stops.
CREATE TABLE job_states (
    job_uuid    text PRIMARY KEY,
    -- input partition of the job (its key's partition on the job topics): what a brain
    -- instance loads when it is assigned that partition.
    partition   integer NOT NULL,
    state       jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_states_partition ON job_states (partition);

CREATE TABLE brain_offsets (
    topic        text NOT NULL,
    partition    integer NOT NULL,
    -- next offset to process: every record before it is folded into job_states.
    next_offset  bigint NOT NULL CHECK (next_offset >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition)
);
