-- Telemetry, alert rules and alerts with a lifecycle, and the notification outbox.

-- Raw samples, kept for GPUSLICE_TELEMETRY_RAW_HOURS (48 h by default), and
-- 5-minute rollups kept for GPUSLICE_TELEMETRY_ROLLUP_DAYS (90 days).
CREATE TABLE gpu_samples (
    gpu_id            BIGINT NOT NULL REFERENCES gpus (id) ON DELETE CASCADE,
    at                TIMESTAMPTZ NOT NULL,
    -- The GPU did not answer (fallen off the bus); the other fields are NULL.
    lost              BOOLEAN NOT NULL DEFAULT false,
    utilization_pct   REAL,
    memory_used_mib   BIGINT,
    memory_total_mib  BIGINT,
    temperature_c     REAL,
    power_w           REAL,
    ecc_uncorrectable BIGINT,
    sm_clock_mhz      INTEGER,
    mem_clock_mhz     INTEGER,
    PRIMARY KEY (gpu_id, at)
);
CREATE INDEX gpu_samples_at_idx ON gpu_samples (at);

-- One row per live booking (MIG instance or time-sliced share) per sample.
CREATE TABLE instance_samples (
    booking_id        BIGINT NOT NULL REFERENCES bookings (id) ON DELETE CASCADE,
    at                TIMESTAMPTZ NOT NULL,
    gpu_id            BIGINT NOT NULL REFERENCES gpus (id) ON DELETE CASCADE,
    memory_used_mib   BIGINT NOT NULL,
    memory_limit_mib  BIGINT NOT NULL,
    utilization_pct   REAL,
    PRIMARY KEY (booking_id, at)
);
CREATE INDEX instance_samples_at_idx ON instance_samples (at);

-- 5-minute rollups, kept up to date as samples arrive (sums and counts,
-- so that a mean is sum / n and a bucket is never re-read): no batch job
-- has to catch up, whatever the history.
CREATE TABLE gpu_rollups (
    gpu_id           BIGINT NOT NULL REFERENCES gpus (id) ON DELETE CASCADE,
    bucket           TIMESTAMPTZ NOT NULL,
    samples          INTEGER NOT NULL,
    lost_samples     INTEGER NOT NULL,
    utilization_sum  DOUBLE PRECISION NOT NULL,
    utilization_n    INTEGER NOT NULL,
    utilization_max  REAL,
    temperature_sum  DOUBLE PRECISION NOT NULL,
    temperature_n    INTEGER NOT NULL,
    temperature_max  REAL,
    memory_used_sum  DOUBLE PRECISION NOT NULL,
    memory_used_n    INTEGER NOT NULL,
    memory_used_max  BIGINT,
    power_sum        DOUBLE PRECISION NOT NULL,
    power_n          INTEGER NOT NULL,
    PRIMARY KEY (gpu_id, bucket)
);
CREATE INDEX gpu_rollups_bucket_idx ON gpu_rollups (bucket);

CREATE TABLE instance_rollups (
    booking_id       BIGINT NOT NULL REFERENCES bookings (id) ON DELETE CASCADE,
    bucket           TIMESTAMPTZ NOT NULL,
    samples          INTEGER NOT NULL,
    memory_used_sum  DOUBLE PRECISION NOT NULL,
    memory_used_max  BIGINT NOT NULL,
    memory_limit_mib BIGINT NOT NULL,
    utilization_sum  DOUBLE PRECISION NOT NULL,
    utilization_n    INTEGER NOT NULL,
    PRIMARY KEY (booking_id, bucket)
);
CREATE INDEX instance_rollups_bucket_idx ON instance_rollups (bucket);

-- Events the driver pushes (XID errors, double-bit ECC errors).
CREATE TABLE gpu_events (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    gpu_id  BIGINT NOT NULL REFERENCES gpus (id) ON DELETE CASCADE,
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    kind    TEXT NOT NULL CHECK (kind IN ('xid', 'ecc_uncorrectable')),
    code    BIGINT NOT NULL
);
CREATE INDEX gpu_events_gpu_at_idx ON gpu_events (gpu_id, at DESC);

-- Alert rules: admins edit threshold, duration, severity and whether a rule is on.
CREATE TABLE alert_rules (
    name        TEXT PRIMARY KEY,
    description TEXT NOT NULL,
    threshold   DOUBLE PRECISION NOT NULL,
    for_secs    INTEGER NOT NULL CHECK (for_secs >= 0 AND for_secs <= 604800),
    severity    TEXT NOT NULL CHECK (severity IN ('info', 'warning', 'critical', 'high')),
    enabled     BOOLEAN NOT NULL DEFAULT true,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO alert_rules (name, description, threshold, for_secs, severity) VALUES
  ('gpu_temperature_high', 'GPU temperature above the threshold (°C) for the duration', 85, 60, 'critical'),
  ('gpu_utilization_high', 'GPU utilisation above the threshold (%) for the duration', 95, 300, 'info'),
  ('instance_memory_near_limit', 'A booking uses at least the threshold (%) of its GPU memory for the duration', 90, 60, 'warning'),
  ('gpu_xid_error', 'More XID errors than the threshold within the duration (the alert resolves after a quiet duration)', 0, 600, 'critical'),
  ('gpu_ecc_uncorrectable', 'Uncorrectable (double-bit) ECC errors since the last GPU reset above the threshold', 0, 0, 'critical'),
  ('gpu_lost', 'The GPU stopped answering (fallen off the bus) for the duration', 0, 0, 'critical'),
  ('node_heartbeat_stale', 'A node has not reported for more than the threshold (seconds)', 60, 0, 'critical'),
  ('metering_spool_full', 'A node''s usage spool passed the threshold (%) while PostgreSQL was unreachable', 80, 0, 'warning');

-- Alerts: pending (condition holds, not yet for long enough) -> firing -> resolved.
ALTER TABLE alerts RENAME COLUMN at TO started_at;
ALTER TABLE alerts
    ADD COLUMN rule TEXT NOT NULL DEFAULT 'metering_spool_full',
    ADD COLUMN state TEXT NOT NULL DEFAULT 'resolved' CHECK (state IN ('pending', 'firing', 'resolved')),
    ADD COLUMN node TEXT,
    ADD COLUMN gpu_uuid TEXT,
    ADD COLUMN booking_id BIGINT REFERENCES bookings (id) ON DELETE SET NULL,
    ADD COLUMN value DOUBLE PRECISION,
    ADD COLUMN fired_at TIMESTAMPTZ,
    ADD COLUMN acked_by BIGINT REFERENCES users (id),
    ADD COLUMN acked_at TIMESTAMPTZ,
    ADD COLUMN silenced_until TIMESTAMPTZ;
UPDATE alerts SET node = substring(source FROM 7) WHERE source LIKE 'meter:%';
-- The old spool alerts were raised after the fact and never resolved: they are history.
UPDATE alerts SET state = 'resolved', fired_at = started_at, resolved_at = COALESCE(resolved_at, started_at);
ALTER TABLE alerts DROP COLUMN source;
ALTER TABLE alerts ALTER COLUMN rule DROP DEFAULT, ALTER COLUMN state DROP DEFAULT;
ALTER TABLE alerts DROP CONSTRAINT alerts_severity_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_severity_check CHECK (severity IN ('info', 'warning', 'critical', 'high'));
ALTER TABLE alerts ADD COLUMN subject TEXT GENERATED ALWAYS AS
    (coalesce(node, '') || '/' || coalesce(gpu_uuid, '') || '/' || coalesce(booking_id::text, '')) STORED;
DROP INDEX alerts_open_idx;
-- One open alert per rule and subject: no floods.
CREATE UNIQUE INDEX alerts_one_open_idx ON alerts (rule, subject) WHERE state IN ('pending', 'firing');
CREATE INDEX alerts_started_idx ON alerts (started_at DESC);
CREATE INDEX alerts_booking_idx ON alerts (booking_id) WHERE booking_id IS NOT NULL;

-- The outbox: a notification is written with the change that causes it and
-- sent by the notifier. `sending` rows whose sender died are not sent again
-- (the message may have left); they become `unconfirmed` for an admin to resend.
CREATE TABLE notifications (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    channel         TEXT NOT NULL CHECK (channel IN ('email', 'webhook')),
    -- An e-mail address, or empty for the webhook.
    recipient       TEXT NOT NULL,
    user_id         BIGINT REFERENCES users (id) ON DELETE CASCADE,
    topic           TEXT NOT NULL,
    subject         TEXT NOT NULL,
    body            TEXT NOT NULL,
    alert_id        BIGINT REFERENCES alerts (id) ON DELETE SET NULL,
    booking_id      BIGINT REFERENCES bookings (id) ON DELETE SET NULL,
    state           TEXT NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'sending', 'sent', 'failed', 'unconfirmed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    claimed_at      TIMESTAMPTZ,
    claimed_by      TEXT,
    sent_at         TIMESTAMPTZ,
    last_error      TEXT
);
CREATE INDEX notifications_due_idx ON notifications (channel, next_attempt_at) WHERE state = 'pending';
CREATE INDEX notifications_sending_idx ON notifications (claimed_at) WHERE state = 'sending';
CREATE INDEX notifications_created_idx ON notifications (created_at);

-- What each person wants by e-mail; a missing row means the default (on).
CREATE TABLE notification_prefs (
    user_id BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    topic   TEXT NOT NULL,
    email   BOOLEAN NOT NULL,
    PRIMARY KEY (user_id, topic)
);
