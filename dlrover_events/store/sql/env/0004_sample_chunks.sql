-- A job's runtime samples, apart from its state: each checkpoint appends, as one chunk,
-- the samples a job gained since the last one, and deletes the chunks that fell out of
-- the job's window (its last 60). Rewriting every changed job's 60 samples at every
-- checkpoint made Postgres parse and compress about 45 kB per job every 2 s.
-- A job's samples are the last ones of its chunks in `seq` order, after any samples its
-- state document holds itself (checkpoints written before this table).
CREATE TABLE job_sample_chunks (
    job_uuid  text NOT NULL,
    seq       bigint NOT NULL CHECK (seq >= 0),
    samples   jsonb NOT NULL,
    PRIMARY KEY (job_uuid, seq)
);
