-- The fleet optimizer (issue 16): what it did and what admins decided,
-- with the metric before and after.
CREATE TABLE optimizer_actions (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    action      TEXT NOT NULL CHECK (action IN ('priority_lowered', 'priority_restored')),
    -- `optimizer`, or the admin's e-mail.
    actor       TEXT NOT NULL,
    booking_id  BIGINT REFERENCES bookings (id) ON DELETE CASCADE,
    metric      TEXT NOT NULL,
    before      DOUBLE PRECISION,
    after       DOUBLE PRECISION,
    detail      JSONB NOT NULL DEFAULT '{}'
);
CREATE INDEX optimizer_actions_at_idx ON optimizer_actions (at DESC);
CREATE INDEX optimizer_actions_booking_idx ON optimizer_actions (booking_id, action);

-- A share the optimizer lowered to `low`: the priority to give back.
ALTER TABLE bookings ADD COLUMN lowered_from TEXT
    CHECK (lowered_from IN ('high', 'normal', 'low'));
