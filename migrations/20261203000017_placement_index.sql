-- The placement index (issue 18): every server keeps the fleet's bookable
-- GPUs and placed live bookings in memory, per kind, and before a decision
-- reads only what changed since it last looked. The changes are logged
-- here by triggers, in the changing transaction itself, each with that
-- transaction's id: a reader asks for every change its last snapshot could
-- not see (ids from that snapshot's xmax on, and those then running), so a
-- change that commits late is never skipped, a long transaction elsewhere
-- costs nothing, and re-reading a booking twice is harmless.
CREATE TABLE placement_changes (
    xid        xid8 NOT NULL DEFAULT pg_current_xact_id(),
    -- 'mig' or 'timeslice': a booking of that kind changed (booking_id),
    -- or the foreign MIG instances did (booking_id NULL); 'fleet': the
    -- bookable GPUs did.
    kind       TEXT NOT NULL CHECK (kind IN ('mig', 'timeslice', 'fleet')),
    booking_id BIGINT
);
CREATE INDEX placement_changes_xid_idx ON placement_changes (xid);

-- Snapshot horizons taken by the trimming round: changes below a horizon
-- marked an hour ago go, and `placement_change_trimmed` says how far the
-- log has been trimmed: a reader whose last look is older loads in full.
CREATE TABLE placement_change_marks (
    at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    horizon xid8 NOT NULL
);
CREATE TABLE placement_change_trimmed (
    one   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    below xid8 NOT NULL
);
INSERT INTO placement_change_trimmed (below) VALUES ('0');

CREATE FUNCTION gpuslice_placement_booking_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        INSERT INTO placement_changes (kind, booking_id) VALUES (OLD.kind, OLD.id);
    END IF;
    IF TG_OP <> 'DELETE' AND (TG_OP = 'INSERT' OR NEW.kind <> OLD.kind) THEN
        INSERT INTO placement_changes (kind, booking_id) VALUES (NEW.kind, NEW.id);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER bookings_placement_insert AFTER INSERT ON bookings FOR EACH ROW
    WHEN (NEW.gpu_id IS NOT NULL AND NEW.status IN ('scheduled', 'provisioning', 'active', 'releasing'))
    EXECUTE FUNCTION gpuslice_placement_booking_changed();
CREATE TRIGGER bookings_placement_update AFTER UPDATE ON bookings FOR EACH ROW
    WHEN ((OLD.gpu_id IS NOT NULL OR NEW.gpu_id IS NOT NULL)
          AND (OLD.status IN ('scheduled', 'provisioning', 'active', 'releasing')
               OR NEW.status IN ('scheduled', 'provisioning', 'active', 'releasing'))
          AND (OLD.status, OLD.gpu_id, OLD.slices, OLD.during, OLD.memory_gib, OLD.profile, OLD.kind)
              IS DISTINCT FROM (NEW.status, NEW.gpu_id, NEW.slices, NEW.during, NEW.memory_gib, NEW.profile, NEW.kind))
    EXECUTE FUNCTION gpuslice_placement_booking_changed();
CREATE TRIGGER bookings_placement_delete AFTER DELETE ON bookings FOR EACH ROW
    WHEN (OLD.gpu_id IS NOT NULL)
    EXECUTE FUNCTION gpuslice_placement_booking_changed();

CREATE FUNCTION gpuslice_placement_foreign_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO placement_changes (kind, booking_id) VALUES ('mig', NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER foreign_instances_placement AFTER INSERT OR DELETE ON foreign_instances FOR EACH ROW
    EXECUTE FUNCTION gpuslice_placement_foreign_changed();
CREATE TRIGGER foreign_instances_placement_update AFTER UPDATE ON foreign_instances FOR EACH ROW
    WHEN ((OLD.gpu_id, OLD.gi_id, OLD.profile, OLD.slice_start, OLD.seen_at)
          IS DISTINCT FROM (NEW.gpu_id, NEW.gi_id, NEW.profile, NEW.slice_start, NEW.seen_at))
    EXECUTE FUNCTION gpuslice_placement_foreign_changed();

CREATE FUNCTION gpuslice_placement_fleet_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO placement_changes (kind, booking_id) VALUES ('fleet', NULL);
    RETURN NULL;
END $$;
CREATE TRIGGER gpus_placement AFTER INSERT OR DELETE ON gpus FOR EACH ROW
    EXECUTE FUNCTION gpuslice_placement_fleet_changed();
CREATE TRIGGER gpus_placement_update AFTER UPDATE ON gpus FOR EACH ROW
    WHEN ((OLD.node_id, OLD.idx, OLD.uuid, OLD.model, OLD.memory_mib, OLD.mode, OLD.mig_current,
           OLD.mig_pending, OLD.max_shares, OLD.healthy, OLD.requested_mode)
          IS DISTINCT FROM (NEW.node_id, NEW.idx, NEW.uuid, NEW.model, NEW.memory_mib, NEW.mode,
                            NEW.mig_current, NEW.mig_pending, NEW.max_shares, NEW.healthy, NEW.requested_mode))
    EXECUTE FUNCTION gpuslice_placement_fleet_changed();
CREATE TRIGGER nodes_placement_update AFTER UPDATE ON nodes FOR EACH ROW
    WHEN (OLD.name IS DISTINCT FROM NEW.name)
    EXECUTE FUNCTION gpuslice_placement_fleet_changed();
