-- A virtual env's simulated cluster, as its operator last made it durable (one row): the
-- jobs, their pods and progress, the simulated clock, the lockstep tick, the input offsets
-- it covers and the events it was about to publish (`published` once they were acked).
-- A restarted operator goes on from here instead of an empty cluster.
CREATE TABLE virtual_cluster (
    id         smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    state      bytea NOT NULL,
    published  boolean NOT NULL DEFAULT false,
    saved_at   timestamptz NOT NULL DEFAULT now()
);
