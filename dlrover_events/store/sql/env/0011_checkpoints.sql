-- Checkpoints and the model registry (dlrover_events/checkpoints/store.py). The checkpoints
-- service (streams/checkpoints/service.py) records every CheckpointCommitted of
-- <env>.checkpoints here, idempotent on the checkpoint's id, and keeps the state the
-- retention policy gives it; `model register` (the CLI, /v1/models) adds versions, each
-- referencing one checkpoint, which retention then never deletes.

-- One row per committed checkpoint. `state`: kept; deleting (retention chose it, its files
-- are being removed: a service restarted finds it and finishes); deleted (its files are
-- gone; the row stays, so `checkpoint list --all` and a model's lineage still say what it
-- was and why it went).
CREATE TABLE checkpoints (
    checkpoint_id   text PRIMARY KEY,
    job_uuid        text NOT NULL,
    job_name        text NOT NULL DEFAULT '',
    experiment      text,
    trial           integer,
    step            bigint NOT NULL,
    world_size      integer NOT NULL,
    plan_id         text,
    metrics         jsonb NOT NULL DEFAULT '{}'::jsonb,
    size_bytes      bigint NOT NULL,
    url             text NOT NULL,
    blocking_s      double precision NOT NULL,
    persist_s       double precision NOT NULL,
    format          text NOT NULL,
    format_version  integer NOT NULL,
    reason          text NOT NULL,
    event_id        uuid NOT NULL UNIQUE,
    committed_at    timestamptz NOT NULL,
    state           text NOT NULL DEFAULT 'kept'
                    CHECK (state IN ('kept', 'deleting', 'deleted')),
    delete_reason   text,
    delete_detail   text NOT NULL DEFAULT '',
    deleted_at      timestamptz
);
CREATE INDEX checkpoints_job ON checkpoints (job_uuid, step);
CREATE INDEX checkpoints_job_name ON checkpoints (job_name, step);
CREATE INDEX checkpoints_experiment ON checkpoints (experiment, trial)
    WHERE experiment IS NOT NULL;
CREATE INDEX checkpoints_deleting ON checkpoints (committed_at) WHERE state = 'deleting';

-- A registered model: a name its versions share.
CREATE TABLE models (
    name         text PRIMARY KEY,
    description  text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- A model's versions, numbered from 1, each one checkpoint with the lineage back to its
-- run as it was when registered (job, trial, experiment, hyperparameters, plans).
CREATE TABLE model_versions (
    model          text NOT NULL REFERENCES models (name),
    version        integer NOT NULL CHECK (version >= 1),
    checkpoint_id  text NOT NULL REFERENCES checkpoints (checkpoint_id),
    notes          text NOT NULL DEFAULT '',
    labels         jsonb NOT NULL DEFAULT '[]'::jsonb,
    lineage        jsonb NOT NULL,
    registered_by  text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, version)
);
CREATE INDEX model_versions_checkpoint ON model_versions (checkpoint_id);
