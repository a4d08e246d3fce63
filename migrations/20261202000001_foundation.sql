-- Schema v1: tenants and quotas, users and memberships, API tokens, audit log,
-- login throttling and the session table used by tower-sessions.

CREATE TABLE tenants (
    id                    BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slug                  TEXT NOT NULL,
    name                  TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    archived              BOOLEAN NOT NULL DEFAULT FALSE,
    max_active_bookings   INTEGER NOT NULL DEFAULT 2   CHECK (max_active_bookings BETWEEN 0 AND 1000),
    max_gpu_memory_gib    INTEGER NOT NULL DEFAULT 40  CHECK (max_gpu_memory_gib BETWEEN 0 AND 100000),
    max_compute_slices    INTEGER NOT NULL DEFAULT 7   CHECK (max_compute_slices BETWEEN 0 AND 10000),
    default_priority      TEXT    NOT NULL DEFAULT 'normal' CHECK (default_priority IN ('high', 'normal', 'low')),
    guaranteed_share_pct  INTEGER NOT NULL DEFAULT 0   CHECK (guaranteed_share_pct BETWEEN 0 AND 100),
    monthly_slice_hours   INTEGER NOT NULL DEFAULT 500 CHECK (monthly_slice_hours BETWEEN 0 AND 10000000),
    max_booking_hours     INTEGER NOT NULL DEFAULT 24  CHECK (max_booking_hours BETWEEN 1 AND 2160),
    allowed_models        TEXT[]  NOT NULL DEFAULT '{}',
    allowed_profiles      TEXT[]  NOT NULL DEFAULT '{}',
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT tenants_slug_key UNIQUE (slug),
    CONSTRAINT tenants_slug_format CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,38}[a-z0-9]$')
);

CREATE TABLE users (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email               TEXT NOT NULL CHECK (email = lower(email)),
    display_name        TEXT NOT NULL,
    password_hash       TEXT NOT NULL,
    global_role         TEXT NOT NULL DEFAULT 'none' CHECK (global_role IN ('none', 'admin', 'finance')),
    disabled            BOOLEAN NOT NULL DEFAULT FALSE,
    -- Bumped when the password is reset or the account disabled: sessions
    -- carry the epoch they were made in and die when it moves.
    session_epoch       INTEGER NOT NULL DEFAULT 0,
    failed_logins       INTEGER NOT NULL DEFAULT 0,
    last_failed_login_at TIMESTAMPTZ,
    last_login_at       TIMESTAMPTZ,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT users_email_key UNIQUE (email)
);

CREATE TABLE memberships (
    user_id    BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    tenant_id  BIGINT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    role       TEXT NOT NULL CHECK (role IN ('member', 'manager')),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, tenant_id)
);
CREATE INDEX memberships_tenant_idx ON memberships (tenant_id);

CREATE TABLE api_tokens (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id      BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name         TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    -- SHA-256 of the token: tokens carry 256 random bits, so a fast hash is
    -- enough and lookups stay indexable.
    token_hash   TEXT NOT NULL,
    prefix       TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_used_at TIMESTAMPTZ,
    revoked_at   TIMESTAMPTZ,
    CONSTRAINT api_tokens_hash_key UNIQUE (token_hash)
);
CREATE INDEX api_tokens_user_idx ON api_tokens (user_id);

CREATE TABLE audit_log (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor_id    BIGINT REFERENCES users (id) ON DELETE SET NULL,
    actor_email TEXT,
    action      TEXT NOT NULL,
    target      TEXT NOT NULL DEFAULT '',
    detail      JSONB NOT NULL DEFAULT '{}'::jsonb,
    client_addr TEXT
);
CREATE INDEX audit_log_at_idx ON audit_log (at DESC);

-- Failed sign-ins per key ("ip:..." or "account:...") in a fixed window.
CREATE TABLE login_throttle (
    key          TEXT PRIMARY KEY,
    failures     INTEGER NOT NULL,
    window_start TIMESTAMPTZ NOT NULL
);

-- The table tower-sessions-sqlx-store reads and writes (same DDL as its
-- own migrate(), so the store finds it ready).
CREATE SCHEMA IF NOT EXISTS tower_sessions;
CREATE TABLE IF NOT EXISTS tower_sessions.session (
    id          TEXT PRIMARY KEY NOT NULL,
    data        BYTEA NOT NULL,
    expiry_date TIMESTAMPTZ NOT NULL
);
