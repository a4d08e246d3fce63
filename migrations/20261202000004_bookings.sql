-- Bookings: a tenant's claim on a MIG slot or a time-sliced share of a GPU
-- for a time window, and every status change it went through.

CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE bookings (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id        BIGINT NOT NULL REFERENCES tenants (id),
    user_id          BIGINT NOT NULL REFERENCES users (id),
    kind             TEXT NOT NULL CHECK (kind IN ('mig', 'timeslice')),
    -- The model asked for (NULL: any); `model` below is the GPU's once placed.
    requested_model  TEXT,
    model            TEXT,
    profile          TEXT,
    memory_gib       INTEGER NOT NULL CHECK (memory_gib > 0),
    compute_slices   INTEGER NOT NULL CHECK (compute_slices > 0),
    priority         TEXT NOT NULL CHECK (priority IN ('high', 'normal', 'low')),
    -- Requested length, kept so that a queued booking placed later keeps it.
    hours            INTEGER NOT NULL CHECK (hours > 0),
    -- The window the booking holds; its end moves to the release time when
    -- released early, so that it is always the time actually held.
    during           TSTZRANGE NOT NULL CHECK (NOT isempty(during)),
    status           TEXT NOT NULL CHECK (status IN ('queued', 'scheduled', 'provisioning', 'active',
                                                     'releasing', 'released', 'expired', 'cancelled', 'failed')),
    -- What a `releasing` booking becomes once torn down.
    ending_as        TEXT CHECK (ending_as IN ('released', 'expired', 'failed')),
    gpu_id           BIGINT REFERENCES gpus (id),
    -- MIG memory slices [start, start + size).
    slices           INT4RANGE,
    device_uuid      TEXT,
    reason           TEXT,
    -- For a queued booking: the earliest start with capacity when last planned.
    offered_start    TIMESTAMPTZ,
    warned_at        TIMESTAMPTZ,
    -- The worker's claim on the booking's next step.
    lease_owner      TEXT,
    lease_until      TIMESTAMPTZ,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    idempotency_key  TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT bookings_kind_fields CHECK (
        (kind = 'mig' AND profile IS NOT NULL) OR (kind = 'timeslice' AND profile IS NULL)),
    CONSTRAINT bookings_placed CHECK (
        status IN ('queued', 'cancelled', 'failed') OR gpu_id IS NOT NULL),
    CONSTRAINT bookings_mig_slices CHECK (kind = 'timeslice' OR gpu_id IS NULL OR slices IS NOT NULL),
    CONSTRAINT bookings_idempotency_key UNIQUE (user_id, idempotency_key),
    -- The second guard against double booking (the first is the placement
    -- under the tenant's lock): no two live MIG bookings on one GPU share a
    -- memory slice at overlapping times.
    CONSTRAINT bookings_no_overlap EXCLUDE USING gist (gpu_id WITH =, slices WITH &&, during WITH &&)
        WHERE (kind = 'mig' AND status IN ('scheduled', 'provisioning', 'active', 'releasing'))
);
CREATE INDEX bookings_tenant_idx ON bookings (tenant_id, created_at DESC);
CREATE INDEX bookings_user_idx ON bookings (user_id, created_at DESC);
CREATE INDEX bookings_live_idx ON bookings (gpu_id)
    WHERE status IN ('scheduled', 'provisioning', 'active', 'releasing');
CREATE INDEX bookings_queued_idx ON bookings (created_at) WHERE status = 'queued';
CREATE INDEX bookings_created_idx ON bookings (created_at);

CREATE TABLE booking_events (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    booking_id  BIGINT NOT NULL REFERENCES bookings (id) ON DELETE CASCADE,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A user's email, or `worker:<node>` / `planner`.
    actor       TEXT NOT NULL,
    from_status TEXT,
    to_status   TEXT NOT NULL,
    reason      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX booking_events_booking_idx ON booking_events (booking_id, at);
