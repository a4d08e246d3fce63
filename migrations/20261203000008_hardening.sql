-- Addresses each account has signed in from successfully. When strangers
-- spread a guessing attack on one account over many addresses, the
-- account-wide ceiling refuses new addresses but keeps letting the owner in
-- from the places they use (see docs/security.md, "Sign-in throttling").
CREATE TABLE sign_in_addresses (
    user_id     BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    client_addr TEXT NOT NULL CHECK (length(client_addr) <= 64),
    last_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, client_addr)
);
CREATE INDEX sign_in_addresses_last_at ON sign_in_addresses (last_at);

-- `serve` starts the embedded PostgreSQL again when its server dies; each
-- restart is on record as an alert.
INSERT INTO alert_rules (name, description, threshold, for_secs, severity) VALUES
  ('database_restarted', 'The embedded PostgreSQL server stopped and gpuslice started it again', 1, 0, 'critical');
