-- Idle reclaim (issue 16): a tenant's policy, and each booking's idle clock.
ALTER TABLE tenants
    ADD COLUMN idle_after_minutes INTEGER NOT NULL DEFAULT 0
        CHECK (idle_after_minutes BETWEEN 0 AND 10080),
    ADD COLUMN idle_grace_minutes INTEGER NOT NULL DEFAULT 30
        CHECK (idle_grace_minutes BETWEEN 1 AND 10080),
    ADD COLUMN idle_action TEXT NOT NULL DEFAULT 'notify'
        CHECK (idle_action IN ('notify', 'release'));

-- idle_since: the first sample of the current idle stretch (NULL: busy, or
-- not measured); idle_warned_at: when the owner was warned; idle_kept_at:
-- the owner's last "still working" (the idle clock starts again there).
ALTER TABLE bookings
    ADD COLUMN idle_since TIMESTAMPTZ,
    ADD COLUMN idle_warned_at TIMESTAMPTZ,
    ADD COLUMN idle_kept_at TIMESTAMPTZ;

-- How many processes a booking's device ran at each sample ("running
-- work"); NULL where the backend cannot tell.
ALTER TABLE instance_samples ADD COLUMN processes INTEGER;
