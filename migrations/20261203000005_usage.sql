-- Metering: one usage row per booking per interval, tariffs, alerts.

-- How far the worker has metered a booking (the end of its last interval).
ALTER TABLE bookings ADD COLUMN metered_until TIMESTAMPTZ;
CREATE INDEX bookings_to_meter_idx ON bookings (gpu_id) WHERE device_uuid IS NOT NULL;

CREATE TABLE usage (
    booking_id      BIGINT NOT NULL REFERENCES bookings (id),
    interval_start  TIMESTAMPTZ NOT NULL,
    interval_end    TIMESTAMPTZ NOT NULL CHECK (interval_end > interval_start),
    -- Compute slices x seconds (a whole GPU is 7 slices).
    slice_seconds   DOUBLE PRECISION NOT NULL CHECK (slice_seconds >= 0),
    gib_seconds     DOUBLE PRECISION NOT NULL CHECK (gib_seconds >= 0),
    -- What the hardware reported during the interval, where it reports it.
    utilization_pct REAL,
    memory_used_mib BIGINT,
    -- Re-metering an interval is a no-op: this key is the idempotency.
    PRIMARY KEY (booking_id, interval_start)
);
CREATE INDEX usage_start_idx ON usage (interval_start);

-- Price per slice-hour for a GPU model and kind from a date on; the one in
-- force on an interval's date applies to it.
CREATE TABLE tariffs (
    id                    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model                 TEXT NOT NULL,
    kind                  TEXT NOT NULL CHECK (kind IN ('mig', 'timeslice')),
    price_per_slice_hour  NUMERIC(12, 4) NOT NULL CHECK (price_per_slice_hour >= 0),
    effective_from        DATE NOT NULL,
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT tariffs_one_per_day UNIQUE (model, kind, effective_from)
);

CREATE TABLE alerts (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    severity    TEXT NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
    source      TEXT NOT NULL,
    message     TEXT NOT NULL,
    resolved_at TIMESTAMPTZ
);
CREATE INDEX alerts_open_idx ON alerts (at DESC) WHERE resolved_at IS NULL;
