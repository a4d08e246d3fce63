-- GPU instances made behind gpuslice's back (issue 20): seen by the node's
-- reconcile, their memory slices count as taken by placement, never
-- destroyed by gpuslice.
CREATE TABLE foreign_instances (
    gpu_id      BIGINT NOT NULL REFERENCES gpus (id) ON DELETE CASCADE,
    gi_id       INT NOT NULL,
    -- The catalog profile whose slots it takes (by its size when the
    -- driver's profile is not in the catalog).
    profile     TEXT NOT NULL,
    slice_start INT NOT NULL,
    slice_size  INT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    seen_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (gpu_id, gi_id)
);
