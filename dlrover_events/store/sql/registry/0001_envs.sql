-- The env registry. Exactly one env is real: the partial unique index enforces it.
CREATE TABLE envs (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9-]{0,30}$'),
    mode        text NOT NULL CHECK (mode IN ('real', 'virtual')),
    partitions  integer NOT NULL CHECK (partitions >= 1),
    settings    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX envs_one_real ON envs ((true)) WHERE mode = 'real';

-- Every change of the registry, with its reason (create, delete, promote, watchdog).
CREATE TABLE env_changes (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL,
    change      text NOT NULL,
    mode        text,
    reason      text NOT NULL DEFAULT '',
    changed_at  timestamptz NOT NULL DEFAULT now()
);
