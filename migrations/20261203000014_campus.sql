-- Managers running their tenant, allocation requests, and single sign-on
-- (issue 19).

-- An e-mail address invited to a tenant by its manager (or an admin). The
-- link in the invitation e-mail carries a secret whose SHA-256 is kept;
-- following it creates the account (or, with single sign-on, the first
-- sign-in with that address does) and the membership.
CREATE TABLE invitations (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id   BIGINT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    email       TEXT NOT NULL CHECK (email = lower(email)),
    role        TEXT NOT NULL CHECK (role IN ('member', 'manager')),
    token_hash  TEXT NOT NULL UNIQUE,
    invited_by  BIGINT REFERENCES users (id) ON DELETE SET NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL,
    accepted_at TIMESTAMPTZ,
    revoked_at  TIMESTAMPTZ
);
-- One open invitation per address and tenant.
CREATE UNIQUE INDEX invitations_open_idx ON invitations (tenant_id, email)
    WHERE accepted_at IS NULL AND revoked_at IS NULL;
CREATE INDEX invitations_email_idx ON invitations (email)
    WHERE accepted_at IS NULL AND revoked_at IS NULL;

-- A manager asks for more quota with a justification; admins approve (as
-- asked), amend (grant other figures) or decline.
CREATE TABLE allocation_requests (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id           BIGINT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    requested_by        BIGINT REFERENCES users (id) ON DELETE SET NULL,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The quota in force when asked, and the quota asked for: the five
    -- amounts (JSON objects with the quota's field names).
    current             JSONB NOT NULL,
    asked               JSONB NOT NULL,
    justification       TEXT NOT NULL CHECK (length(justification) BETWEEN 1 AND 4000),
    state               TEXT NOT NULL DEFAULT 'pending'
                        CHECK (state IN ('pending', 'approved', 'amended', 'declined', 'withdrawn')),
    granted             JSONB,
    decided_by          BIGINT REFERENCES users (id) ON DELETE SET NULL,
    decided_at          TIMESTAMPTZ,
    decision_note       TEXT CHECK (decision_note IS NULL OR length(decision_note) <= 4000)
);
-- At most one pending request per tenant.
CREATE UNIQUE INDEX allocation_requests_pending_idx ON allocation_requests (tenant_id)
    WHERE state = 'pending';
CREATE INDEX allocation_requests_queue_idx ON allocation_requests (state, created_at);
CREATE INDEX allocation_requests_tenant_idx ON allocation_requests (tenant_id, created_at DESC);

-- Where a membership came from: set by hand (admins, managers,
-- invitations) or by a single sign-on group mapping, which keeps its own
-- memberships in step at each sign-in and never touches the others.
ALTER TABLE memberships ADD COLUMN source TEXT NOT NULL DEFAULT 'manual'
    CHECK (source IN ('manual', 'sso'));

-- Accounts known to an identity provider: (provider, subject) -> user.
CREATE TABLE external_identities (
    provider    TEXT NOT NULL CHECK (provider IN ('oidc', 'ldap')),
    subject     TEXT NOT NULL CHECK (length(subject) BETWEEN 1 AND 1000),
    user_id     BIGINT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, subject)
);
CREATE INDEX external_identities_user_idx ON external_identities (user_id);

-- Where a platform role came from: set by hand, or granted by a single
-- sign-on group mapping (which takes back only what it granted).
ALTER TABLE users ADD COLUMN role_source TEXT NOT NULL DEFAULT 'manual'
    CHECK (role_source IN ('manual', 'sso'));
