-- Bookings ahead may be moved to another GPU or slot of their model to let
-- a new booking in, in the same transaction as it; several may trade
-- places, so the overlap constraint is checked at commit in that
-- transaction (SET CONSTRAINTS ... DEFERRED) and, everywhere else, at
-- each statement as before (INITIALLY IMMEDIATE).
ALTER TABLE bookings DROP CONSTRAINT bookings_no_overlap;
ALTER TABLE bookings ADD CONSTRAINT bookings_no_overlap
    EXCLUDE USING gist (gpu_id WITH =, slices WITH &&, during WITH &&)
    WHERE (kind = 'mig' AND status IN ('scheduled', 'provisioning', 'active', 'releasing'))
    DEFERRABLE INITIALLY IMMEDIATE;
