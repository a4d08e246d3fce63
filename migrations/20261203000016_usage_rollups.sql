-- Cost that stays flat as history grows (issue 18): every report reads a
-- daily rollup per booking, kept exact by a statement trigger in the
-- metering transaction itself (only rows actually inserted count, so
-- re-metering stays a no-op); the minute rows stay the source of truth in
-- a table partitioned by month, so old months leave as whole partitions.

CREATE TABLE usage_daily (
    booking_id      BIGINT NOT NULL REFERENCES bookings (id),
    -- The UTC day of the rows' interval starts, as the reports always had it.
    day             DATE NOT NULL,
    slice_seconds   DOUBLE PRECISION NOT NULL,
    gib_seconds     DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (booking_id, day)
);
CREATE INDEX usage_daily_day_idx ON usage_daily (day, booking_id);

ALTER TABLE usage RENAME TO usage_before_partitioning;
ALTER INDEX usage_start_idx RENAME TO usage_before_partitioning_start_idx;
ALTER TABLE usage_before_partitioning RENAME CONSTRAINT usage_pkey TO usage_before_partitioning_pkey;

CREATE TABLE usage (
    booking_id      BIGINT NOT NULL REFERENCES bookings (id),
    interval_start  TIMESTAMPTZ NOT NULL,
    interval_end    TIMESTAMPTZ NOT NULL CHECK (interval_end > interval_start),
    slice_seconds   DOUBLE PRECISION NOT NULL CHECK (slice_seconds >= 0),
    gib_seconds     DOUBLE PRECISION NOT NULL CHECK (gib_seconds >= 0),
    utilization_pct REAL,
    memory_used_mib BIGINT,
    PRIMARY KEY (booking_id, interval_start)
) PARTITION BY RANGE (interval_start);
CREATE INDEX usage_start_idx ON usage (interval_start);
-- Rows of a month whose partition does not exist yet land here; making
-- that month's partition moves them in.
CREATE TABLE usage_default PARTITION OF usage DEFAULT;

-- The partition of the month holding `m` (UTC), made when missing.
CREATE FUNCTION gpuslice_usage_month(m date) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    first date := date_trunc('month', m)::date;
    name text := format('usage_y%sm%s', to_char(first, 'YYYY'), to_char(first, 'MM'));
    -- Bounds spelled out in UTC, whatever the session's DateStyle or zone.
    lo text := to_char(first, 'YYYY-MM-DD') || ' 00:00:00+00';
    hi text := to_char((first + interval '1 month')::date, 'YYYY-MM-DD') || ' 00:00:00+00';
BEGIN
    -- One maker at a time (every server and worker keeps partitions ahead).
    PERFORM pg_advisory_xact_lock(hashtext('gpuslice-usage-partitions'));
    IF to_regclass(name) IS NOT NULL THEN
        RETURN name;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE usage INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
    -- The range as a constraint first, so that attaching skips its scan.
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (interval_start >= %L AND interval_start < %L)',
                   name, name || '_range', lo, hi);
    -- No metering row may slip into the default partition between the move
    -- and the attach (the attach would then refuse).
    LOCK TABLE usage_default IN ACCESS EXCLUSIVE MODE;
    -- Already rolled up: moved without passing through the parent.
    EXECUTE format('WITH moved AS (DELETE FROM usage_default WHERE interval_start >= %L AND interval_start < %L RETURNING *)
                    INSERT INTO %I SELECT * FROM moved', lo, hi, name);
    EXECUTE format('ALTER TABLE usage ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', name, lo, hi);
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', name, name || '_range');
    RETURN name;
END $$;

-- Drops the monthly partitions older than the `keep` months up to this
-- one (the current month counts); returns how many. The rollups stay.
CREATE FUNCTION gpuslice_usage_retain(keep int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n int := 0;
    oldest date := (date_trunc('month', now() AT TIME ZONE 'UTC') - make_interval(months => keep - 1))::date;
BEGIN
    IF keep <= 0 THEN
        RETURN 0;
    END IF;
    -- Dropping a partition locks the whole table: wait briefly, else try
    -- again at the next round rather than stall metering.
    SET LOCAL lock_timeout = '2s';
    PERFORM pg_advisory_xact_lock(hashtext('gpuslice-usage-partitions'));
    FOR r IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'usage'::regclass AND c.relname ~ '^usage_y[0-9]{4}m[0-9]{2}$'
    LOOP
        IF to_date(substr(r.relname, 8, 4) || substr(r.relname, 13, 2), 'YYYYMM') < oldest THEN
            EXECUTE format('DROP TABLE %I', r.relname);
            n := n + 1;
        END IF;
    END LOOP;
    RETURN n;
END $$;

CREATE FUNCTION gpuslice_usage_rollup() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_daily (booking_id, day, slice_seconds, gib_seconds)
    SELECT booking_id, (interval_start AT TIME ZONE 'UTC')::date, sum(slice_seconds), sum(gib_seconds)
    FROM new_rows GROUP BY 1, 2
    -- One lock order for every metering transaction (no deadlock).
    ORDER BY 1, 2
    ON CONFLICT (booking_id, day) DO UPDATE
        SET slice_seconds = usage_daily.slice_seconds + EXCLUDED.slice_seconds,
            gib_seconds = usage_daily.gib_seconds + EXCLUDED.gib_seconds;
    RETURN NULL;
END $$;
CREATE TRIGGER usage_rollup AFTER INSERT ON usage REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION gpuslice_usage_rollup();

-- The months already metered, this one and the next two; then the rows,
-- which build the rollups on the way in.
DO $$
DECLARE m date;
BEGIN
    FOR m IN
        SELECT DISTINCT date_trunc('month', interval_start AT TIME ZONE 'UTC')::date FROM usage_before_partitioning
        UNION SELECT (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => k))::date
              FROM generate_series(0, 2) k
    LOOP
        PERFORM gpuslice_usage_month(m);
    END LOOP;
END $$;
INSERT INTO usage SELECT * FROM usage_before_partitioning;
DROP TABLE usage_before_partitioning;
