-- Experiments, as the experiments recorder (streams/searcher/recorder.py) stores them from
-- <env>.experiments, <env>.trial.decisions and <env>.trial.metrics, for `experiment
-- describe`, `trial metrics`, /v1/experiments and the console
-- (dlrover_events/experiments/store.py). Every write is idempotent, keyed by the event's
-- id or the decision's (experiment, seq), so a batch read again after a crash adds nothing.

-- One row per experiment. A decision or an action may be read before the submission (they
-- are on other topics): the row is then made without a spec, which the submission fills.
CREATE TABLE experiments (
    name           text PRIMARY KEY,
    spec           jsonb,
    submitted_at   timestamptz,
    status         text NOT NULL DEFAULT 'active'
                   CHECK (status IN ('active', 'paused', 'completed', 'killed', 'refused')),
    status_reason  text NOT NULL DEFAULT '',
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Every decision of an experiment's searcher, in its order (`seq` from 0).
CREATE TABLE trial_decisions (
    experiment   text NOT NULL,
    seq          bigint NOT NULL,
    decision     text NOT NULL,
    trial        integer,
    hparams      jsonb NOT NULL DEFAULT '{}'::jsonb,
    budget       double precision,
    rung         integer,
    reason       text NOT NULL DEFAULT '',
    event_id     uuid NOT NULL UNIQUE,
    occurred_at  timestamptz NOT NULL,
    PRIMARY KEY (experiment, seq)
);
CREATE INDEX trial_decisions_trial ON trial_decisions (experiment, trial, seq);

-- What trials measured. A trial's curve is read by (experiment, trial, step); the best
-- validation value of a metric is read from the validation rows alone, which are few (one
-- per evaluation), through the partial index.
CREATE TABLE trial_metrics (
    experiment   text NOT NULL,
    trial        integer NOT NULL,
    step         bigint NOT NULL,
    budget       double precision NOT NULL,
    validation   boolean NOT NULL,
    metrics      jsonb NOT NULL,
    event_id     uuid NOT NULL UNIQUE,
    occurred_at  timestamptz NOT NULL
);
CREATE INDEX trial_metrics_curve ON trial_metrics (experiment, trial, step);
CREATE INDEX trial_metrics_validation ON trial_metrics (experiment, trial, step)
    WHERE validation;
