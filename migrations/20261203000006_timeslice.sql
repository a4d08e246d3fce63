-- Time-sliced shares: the Unix account `gpuslice exec` accepts for a user,
-- the scheduler's latest view of a share, and the tenants' QoS ledger.

ALTER TABLE users ADD COLUMN unix_user TEXT
    CHECK (unix_user IS NULL OR unix_user ~ '^[a-z_][a-z0-9_-]{0,31}$');

-- {"time_slice_ms", "priority", "achieved_share_pct", "guaranteed_share_pct",
--  "violations", "boosted", "at"}, written every few seconds by the node's worker.
ALTER TABLE bookings ADD COLUMN scheduler JSONB;

CREATE TABLE qos_events (
    id                   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                   TIMESTAMPTZ NOT NULL DEFAULT now(),
    booking_id           BIGINT NOT NULL REFERENCES bookings (id),
    tenant_id            BIGINT NOT NULL REFERENCES tenants (id),
    kind                 TEXT NOT NULL CHECK (kind IN ('violation', 'boost', 'recovered')),
    achieved_share_pct   DOUBLE PRECISION NOT NULL,
    guaranteed_share_pct DOUBLE PRECISION NOT NULL
);
CREATE INDEX qos_events_tenant_idx ON qos_events (tenant_id, at DESC);
