-- An env's own tables. Unqualified names: the migration runs with search_path set to
-- the env's schema, so every env gets the same tables in its own schema.
CREATE TABLE jobs (
    job_uuid      text PRIMARY KEY,
    meta          jsonb NOT NULL,
    status        text NOT NULL DEFAULT 'submitted',
    stage         text NOT NULL DEFAULT 'create',
    resources     jsonb NOT NULL DEFAULT '{}'::jsonb,
    submitted_at  timestamptz,
    started_at    timestamptz,
    finished_at   timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE nodes (
    job_uuid    text NOT NULL,
    role        text NOT NULL,
    node_id     integer NOT NULL,
    name        text NOT NULL DEFAULT '',
    status      text NOT NULL,
    resource    jsonb NOT NULL DEFAULT '{}'::jsonb,
    exit_code   integer,
    reason      text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_uuid, role, node_id)
);

CREATE TABLE runtime_samples (
    event_id       uuid PRIMARY KEY,
    job_uuid       text NOT NULL,
    global_step    bigint NOT NULL,
    speed          double precision NOT NULL,
    samples_per_s  double precision NOT NULL,
    occurred_at    timestamptz NOT NULL,
    nodes          jsonb NOT NULL DEFAULT '[]'::jsonb
);
CREATE INDEX runtime_samples_job ON runtime_samples (job_uuid, occurred_at);

CREATE TABLE plans (
    plan_id     text PRIMARY KEY,
    job_uuid    text NOT NULL,
    optimizer   text NOT NULL,
    stage       text NOT NULL,
    reason      text NOT NULL,
    resource    jsonb NOT NULL,
    caused_by   text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX plans_job ON plans (job_uuid, created_at);

CREATE TABLE scale_plans (
    plan_id      text PRIMARY KEY,
    job_uuid     text NOT NULL,
    source_plan  text,
    body         jsonb NOT NULL,
    status       text NOT NULL DEFAULT 'pending',
    reason       text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    applied_at   timestamptz
);
CREATE INDEX scale_plans_job ON scale_plans (job_uuid, created_at);

CREATE TABLE configs (
    name        text PRIMARY KEY,
    version     integer NOT NULL CHECK (version >= 1),
    document    jsonb NOT NULL,
    deleted     boolean NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE config_history (
    name        text NOT NULL,
    version     integer NOT NULL,
    op          text NOT NULL CHECK (op IN ('upsert', 'delete')),
    document    jsonb,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);

CREATE TABLE evaluation_results (
    id            bigserial PRIMARY KEY,
    event_id      uuid UNIQUE,
    evaluator     text NOT NULL,
    window_start  timestamptz NOT NULL,
    window_end    timestamptz NOT NULL,
    jobs          integer NOT NULL DEFAULT 0,
    metrics       jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Every valid event seen on the env's topics, once per event_id.
CREATE TABLE events_archive (
    event_id     uuid PRIMARY KEY,
    type         text NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL,
    "offset"     bigint NOT NULL,
    key          text,
    occurred_at  timestamptz NOT NULL,
    body         jsonb NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX events_archive_key ON events_archive (key, occurred_at);
CREATE INDEX events_archive_type ON events_archive (type, occurred_at);
