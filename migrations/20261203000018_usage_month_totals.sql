-- Report totals of whole past months (issue 18): a year's `/reports` read
-- every booking-day of the year (about 175,000 rows at 100 million usage
-- rows); now it reads the cached totals of its whole months, by tenant,
-- model and profile (or share), priced and with the months' booking ids
-- (for the distinct count), plus the booking-days of its partial months.
--
-- A cache, exact by versions: every statement that changes a month's
-- rollups bumps that month's version in the same transaction, and any
-- change of tariffs (or of a booking's tenant, model, profile, memory or
-- kind, or of the daily rollup by hand) bumps the epoch. The current
-- month's version row is written by every metering statement: metering
-- transactions of different nodes wait for each other on it (each holds
-- it for the rest of its short transaction; every one takes months in
-- ascending order, so they cannot deadlock). A month's totals are computed in one
-- snapshot together with the version and epoch they reflect, and used
-- only while both are still current.

CREATE TABLE usage_month_versions (
    month   DATE PRIMARY KEY,
    version BIGINT NOT NULL
);

CREATE TABLE usage_totals_epoch (
    one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    version BIGINT NOT NULL
);
INSERT INTO usage_totals_epoch (version) VALUES (1);

-- Months whose totals below are complete, with what they reflect.
CREATE TABLE usage_month_cached (
    month   DATE PRIMARY KEY,
    version BIGINT NOT NULL,
    epoch   BIGINT NOT NULL
);

CREATE TABLE usage_month_totals (
    month         DATE NOT NULL,
    tenant_id     BIGINT NOT NULL,
    model         TEXT NOT NULL,
    what          TEXT NOT NULL,
    slice_seconds DOUBLE PRECISION NOT NULL,
    gib_seconds   DOUBLE PRECISION NOT NULL,
    -- Sum of the per-day costs rounded to cents, as the CSV's rows.
    cost          NUMERIC NOT NULL,
    unpriced_rows BIGINT NOT NULL,
    bookings      BIGINT[] NOT NULL,
    PRIMARY KEY (month, tenant_id, model, what)
);

-- The rollup trigger also bumps the versions of the months it touched
-- (in month order, after the rollup rows: one lock order for everyone).
CREATE OR REPLACE FUNCTION gpuslice_usage_rollup() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The rollup's own writes bump their months below, not the epoch.
    PERFORM set_config('gpuslice.rolling_up', 'on', true);
    INSERT INTO usage_daily (booking_id, day, slice_seconds, gib_seconds)
    SELECT booking_id, (interval_start AT TIME ZONE 'UTC')::date, sum(slice_seconds), sum(gib_seconds)
    FROM new_rows GROUP BY 1, 2
    -- One lock order for every metering transaction (no deadlock).
    ORDER BY 1, 2
    ON CONFLICT (booking_id, day) DO UPDATE
        SET slice_seconds = usage_daily.slice_seconds + EXCLUDED.slice_seconds,
            gib_seconds = usage_daily.gib_seconds + EXCLUDED.gib_seconds;
    INSERT INTO usage_month_versions (month, version)
    SELECT DISTINCT date_trunc('month', interval_start AT TIME ZONE 'UTC')::date, 1 FROM new_rows
    ORDER BY 1
    ON CONFLICT (month) DO UPDATE SET version = usage_month_versions.version + 1;
    PERFORM set_config('gpuslice.rolling_up', 'off', true);
    RETURN NULL;
END $$;

-- Any other change of the rollups (a correction by hand) bumps its months too.
CREATE FUNCTION gpuslice_usage_daily_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('gpuslice.rolling_up', true) = 'on' THEN
        -- Written by the rollup trigger, which bumps the months itself.
        RETURN NULL;
    END IF;
    UPDATE usage_totals_epoch SET version = version + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER usage_daily_changed AFTER UPDATE OR DELETE OR TRUNCATE ON usage_daily
    FOR EACH STATEMENT EXECUTE FUNCTION gpuslice_usage_daily_changed();
CREATE TRIGGER usage_daily_inserted AFTER INSERT ON usage_daily
    FOR EACH STATEMENT EXECUTE FUNCTION gpuslice_usage_daily_changed();

CREATE FUNCTION gpuslice_usage_epoch_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE usage_totals_epoch SET version = version + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER tariffs_usage_epoch AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tariffs
    FOR EACH STATEMENT EXECUTE FUNCTION gpuslice_usage_epoch_bump();
CREATE TRIGGER bookings_usage_epoch AFTER UPDATE ON bookings FOR EACH ROW
    WHEN ((OLD.tenant_id, OLD.model, OLD.profile, OLD.memory_gib, OLD.kind)
          IS DISTINCT FROM (NEW.tenant_id, NEW.model, NEW.profile, NEW.memory_gib, NEW.kind))
    EXECUTE FUNCTION gpuslice_usage_epoch_bump();

-- The months whose cached totals are current.
CREATE VIEW usage_month_current AS
    SELECT c.month FROM usage_month_cached c
    LEFT JOIN usage_month_versions v ON v.month = c.month
    WHERE c.version = COALESCE(v.version, 0)
      AND c.epoch = (SELECT version FROM usage_totals_epoch);

-- The reports' groups over the booking-days of [lo, hi] (one tenant's, or
-- all): by tenant, model and profile (or share), each day priced by the
-- tariff in force and rounded to cents, as the CSV's rows. What
-- `usage_month_totals` keeps per month, and what a report reads for the
-- days no current month covers. A plain SQL function: the planner inlines it.
CREATE FUNCTION gpuslice_usage_groups(lo date, hi date, only_tenant bigint)
RETURNS TABLE (tenant_id bigint, model text, what text, slice_seconds float8, gib_seconds float8,
               cost numeric, unpriced_rows bigint, bookings bigint[])
LANGUAGE sql STABLE AS $$
    SELECT b.tenant_id, COALESCE(b.model, ''), COALESCE(b.profile, b.memory_gib || ' GiB share'),
           sum(d.slice_seconds), sum(d.gib_seconds),
           COALESCE(sum(round(d.slice_seconds::numeric / 3600 * tf.price, 2)), 0),
           count(*) FILTER (WHERE tf.price IS NULL), array_agg(DISTINCT b.id)
    FROM usage_daily d
    JOIN bookings b ON b.id = d.booking_id
    LEFT JOIN LATERAL (
        SELECT t.price_per_slice_hour AS price FROM tariffs t
        WHERE t.model = b.model AND t.kind = b.kind AND t.effective_from <= d.day
        ORDER BY t.effective_from DESC LIMIT 1
    ) tf ON TRUE
    WHERE d.day BETWEEN lo AND hi AND (only_tenant IS NULL OR b.tenant_id = only_tenant)
    GROUP BY 1, 2, 3
$$;
