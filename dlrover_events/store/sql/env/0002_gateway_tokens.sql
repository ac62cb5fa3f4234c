-- Bearer tokens of the config gateway, one table per env (so a token belongs to one env).
-- Only a SHA-256 of each token is kept: a leak of this table gives no usable token.
CREATE TABLE gateway_tokens (
    token_id    text PRIMARY KEY,
    name        text NOT NULL,
    token_hash  text NOT NULL UNIQUE,
    scopes      text[] NOT NULL CHECK (cardinality(scopes) > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
