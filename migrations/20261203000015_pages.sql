-- Pages by keyset (issue 18): lists walk (created_at, id) or (at, id)
-- backwards from a cursor, each covered by an index.
DROP INDEX IF EXISTS bookings_tenant_idx;
DROP INDEX IF EXISTS bookings_user_idx;
CREATE INDEX bookings_tenant_idx ON bookings (tenant_id, created_at DESC, id DESC);
CREATE INDEX bookings_user_idx ON bookings (user_id, created_at DESC, id DESC);
CREATE INDEX bookings_newest_idx ON bookings (created_at DESC, id DESC);
-- Served by bookings_newest_idx now.
DROP INDEX IF EXISTS bookings_created_idx;
DROP INDEX IF EXISTS audit_log_at_idx;
CREATE INDEX audit_log_at_idx ON audit_log (at DESC, id DESC);
-- Alerts list open ones first, then newest.
DROP INDEX IF EXISTS alerts_started_idx;
CREATE INDEX alerts_started_idx ON alerts ((state <> 'resolved') DESC, started_at DESC, id DESC);
