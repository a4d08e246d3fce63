-- Private iCalendar feeds (part of issue 19): a person's bookings, or a
-- tenant's for its managers, at a secret URL that can be revoked and
-- renewed. The token is the URL's secret and is shown again on the
-- settings page, as calendar services do; it grants read access to
-- booking times only.
CREATE TABLE calendar_feeds (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id     BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    tenant_id   BIGINT REFERENCES tenants (id) ON DELETE CASCADE,
    token       TEXT NOT NULL UNIQUE CHECK (length(token) BETWEEN 32 AND 128),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);
CREATE UNIQUE INDEX calendar_feeds_live_idx ON calendar_feeds (user_id, coalesce(tenant_id, 0))
    WHERE revoked_at IS NULL;
