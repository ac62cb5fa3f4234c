-- The env's operator's answers to JobRequests (schemas/requests.py), one per request id:
-- a request delivered again (a consumer's redelivery, a requester's retry) gets its first
-- answer again instead of a second job. Only final answers are kept (created, exists,
-- refused); `job` is the job's JobMeta as the answer named it.
CREATE TABLE job_requests (
    request_id   text PRIMARY KEY,
    name         text NOT NULL,
    requester    text NOT NULL DEFAULT '',
    owner        text,
    status       text NOT NULL,
    reason       text NOT NULL DEFAULT '',
    job          jsonb,
    answered_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_requests_owner ON job_requests (owner) WHERE owner IS NOT NULL;
