-- Node and GPU inventory, registered by each node's worker with a heartbeat.

CREATE TABLE nodes (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           TEXT NOT NULL,
    backend        TEXT NOT NULL CHECK (backend IN ('sim', 'nvml')),
    last_heartbeat TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT nodes_name_key UNIQUE (name)
);

CREATE TABLE gpus (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    node_id     BIGINT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    idx         INTEGER NOT NULL CHECK (idx >= 0),
    uuid        TEXT NOT NULL,
    model       TEXT NOT NULL,
    product     TEXT NOT NULL DEFAULT '',
    memory_mib  BIGINT NOT NULL CHECK (memory_mib >= 0),
    -- What the platform does with the GPU: MIG instances, time-sliced
    -- shares, or nothing new (drained).
    mode        TEXT NOT NULL CHECK (mode IN ('mig', 'timeslice', 'drained')),
    -- The hardware's MIG mode now, and after the next reset.
    mig_current BOOLEAN NOT NULL,
    mig_pending BOOLEAN NOT NULL,
    max_shares  INTEGER NOT NULL DEFAULT 4 CHECK (max_shares BETWEEN 1 AND 64),
    healthy     BOOLEAN NOT NULL DEFAULT TRUE,
    -- The GPU instances the worker last saw: [{"profile","start","size","device_uuid"}].
    instances   JSONB NOT NULL DEFAULT '[]'::jsonb,
    last_seen   TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT gpus_uuid_key UNIQUE (uuid),
    CONSTRAINT gpus_node_idx_key UNIQUE (node_id, idx)
);
