-- Device isolation and the security monitor (issue 14).

-- The device files a booking's processes may open, as the worker confined
-- its cgroup to them at activation: [{"path", "major", "minor"}].
ALTER TABLE bookings ADD COLUMN device_nodes JSONB;

-- Suspicion, counted per subject: `booking:N`, `account:N` (a person),
-- `address:A` (a client address), `uid:U@node` (a Unix account on a
-- node), `gpu:UUID` (a device no booking holds). At most one open incident
-- per subject; its score grows with each piece of evidence and raises the
-- `security_incident` alert at the rule's threshold.
CREATE TABLE security_incidents (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subject     TEXT NOT NULL CHECK (length(subject) BETWEEN 1 AND 200),
    booking_id  BIGINT REFERENCES bookings (id) ON DELETE SET NULL,
    user_id     BIGINT REFERENCES users (id) ON DELETE SET NULL,
    node        TEXT,
    score       INT NOT NULL DEFAULT 0,
    state       TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed')),
    alert_id    BIGINT REFERENCES alerts (id) ON DELETE SET NULL,
    -- The node froze the booking's share (response `freeze-shares`); it
    -- stays frozen until the incident is closed.
    held        BOOLEAN NOT NULL DEFAULT false,
    opened_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    closed_at   TIMESTAMPTZ,
    closed_by   BIGINT REFERENCES users (id) ON DELETE SET NULL,
    close_note  TEXT CHECK (length(close_note) <= 2000)
);
CREATE UNIQUE INDEX security_incidents_one_open_idx ON security_incidents (subject) WHERE state = 'open';
CREATE INDEX security_incidents_last_idx ON security_incidents (state, last_at DESC);

-- What was seen. An incident keeps its first 100 pieces of evidence (its
-- score keeps counting past them).
CREATE TABLE security_evidence (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    incident_id BIGINT NOT NULL REFERENCES security_incidents (id) ON DELETE CASCADE,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    detector    TEXT NOT NULL CHECK (detector IN ('intruder_process', 'foreign_account',
                    'exec_refusals', 'share_memory', 'sign_in_failures', 'token_new_address',
                    'response')),
    detail      TEXT NOT NULL CHECK (length(detail) <= 2000)
);
CREATE INDEX security_evidence_incident_idx ON security_evidence (incident_id, at);

-- Addresses each API token was used from (a token used from a new address
-- is evidence).
CREATE TABLE token_addresses (
    token_id    BIGINT NOT NULL REFERENCES api_tokens (id) ON DELETE CASCADE,
    client_addr TEXT NOT NULL CHECK (length(client_addr) <= 64),
    first_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (token_id, client_addr)
);

INSERT INTO alert_rules (name, description, threshold, for_secs, severity) VALUES
  ('security_incident', 'Suspicious behaviour on a booking, account, address or device reached the threshold (see /admin/security)', 5, 0, 'high');
