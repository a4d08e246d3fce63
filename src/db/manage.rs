//! What managers do for their tenant: invitations by e-mail, allocation
//! requests (and admins' decisions on them), and each member's use this
//! month.

use serde_json::Value;
use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::{Allocation, TenantRole};

/// An open invitation.
#[derive(Debug, Clone)]
pub struct Invitation {
    pub id: i64,
    pub tenant_id: i64,
    pub tenant_slug: String,
    pub tenant_name: String,
    pub email: String,
    pub role: String,
    pub invited_by: Option<String>,
    pub created_at: OffsetDateTime,
    pub expires_at: OffsetDateTime,
}

/// Invites `email` to a tenant (a second invitation to the same address
/// renews the first: new link, role and expiry). Returns its id.
pub async fn invite(
    tx: &mut Transaction<'_, Postgres>,
    tenant_id: i64,
    email: &str,
    role: TenantRole,
    token_hash: &str,
    invited_by: i64,
    expires_at: OffsetDateTime,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO invitations (tenant_id, email, role, token_hash, invited_by, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (tenant_id, email) WHERE accepted_at IS NULL AND revoked_at IS NULL
         DO UPDATE SET role = EXCLUDED.role, token_hash = EXCLUDED.token_hash,
             invited_by = EXCLUDED.invited_by, expires_at = EXCLUDED.expires_at, created_at = now()
         RETURNING id",
        tenant_id,
        email,
        role.as_str(),
        token_hash,
        invited_by,
        expires_at
    )
    .fetch_one(&mut **tx)
    .await
}

/// A tenant's open (not accepted, revoked nor expired) invitations.
pub async fn open_invitations(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
) -> sqlx::Result<Vec<Invitation>> {
    sqlx::query_as!(
        Invitation,
        r#"SELECT i.id, i.tenant_id, t.slug AS tenant_slug, t.name AS tenant_name, i.email, i.role,
                u.email AS "invited_by?", i.created_at, i.expires_at
         FROM invitations i JOIN tenants t ON t.id = i.tenant_id
         LEFT JOIN users u ON u.id = i.invited_by
         WHERE i.tenant_id = $1 AND i.accepted_at IS NULL AND i.revoked_at IS NULL
           AND i.expires_at > now()
         ORDER BY i.created_at DESC"#,
        tenant_id
    )
    .fetch_all(db)
    .await
}

/// The open invitation a link's secret (its hash) names.
pub async fn invitation_by_token(
    db: impl PgExecutor<'_>,
    token_hash: &str,
) -> sqlx::Result<Option<Invitation>> {
    sqlx::query_as!(
        Invitation,
        r#"SELECT i.id, i.tenant_id, t.slug AS tenant_slug, t.name AS tenant_name, i.email, i.role,
                u.email AS "invited_by?", i.created_at, i.expires_at
         FROM invitations i JOIN tenants t ON t.id = i.tenant_id
         LEFT JOIN users u ON u.id = i.invited_by
         WHERE i.token_hash = $1 AND i.accepted_at IS NULL AND i.revoked_at IS NULL
           AND i.expires_at > now() AND NOT t.archived"#,
        token_hash
    )
    .fetch_optional(db)
    .await
}

/// Revokes an open invitation of a tenant; false when there is none.
pub async fn revoke_invitation(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    id: i64,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "UPDATE invitations SET revoked_at = now()
         WHERE id = $1 AND tenant_id = $2 AND accepted_at IS NULL AND revoked_at IS NULL
         RETURNING email",
        id,
        tenant_id
    )
    .fetch_optional(db)
    .await
}

/// Turns every open invitation of `email` into a membership of `user_id`
/// (a manager's invitation never lowers a role the person already has).
/// Returns (tenant slug, role) of each.
pub async fn accept_invitations(
    tx: &mut Transaction<'_, Postgres>,
    user_id: i64,
    email: &str,
) -> sqlx::Result<Vec<(String, String)>> {
    let rows = sqlx::query!(
        r#"WITH taken AS (
               UPDATE invitations i SET accepted_at = now()
               FROM tenants t
               WHERE t.id = i.tenant_id AND NOT t.archived AND i.email = $2
                 AND i.accepted_at IS NULL AND i.revoked_at IS NULL AND i.expires_at > now()
               RETURNING i.tenant_id, i.role, t.slug),
           joined AS (
               INSERT INTO memberships (user_id, tenant_id, role, source)
               SELECT $1, tenant_id, role, 'manual' FROM taken
               ON CONFLICT (user_id, tenant_id) DO UPDATE
                 SET role = CASE WHEN memberships.role = 'manager' THEN 'manager' ELSE EXCLUDED.role END,
                     source = 'manual'
               RETURNING tenant_id, role)
           SELECT taken.slug AS "slug!", joined.role AS "role!"
           FROM taken JOIN joined USING (tenant_id)"#,
        user_id,
        email
    )
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows.into_iter().map(|r| (r.slug, r.role)).collect())
}

/// Slice-hours each member of a tenant used from the UTC day `since` on,
/// by user id.
pub async fn member_usage(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    since: time::Date,
) -> sqlx::Result<Vec<(i64, f64)>> {
    let rows = sqlx::query!(
        r#"SELECT b.user_id, COALESCE(sum(r.slice_seconds), 0) / 3600.0 AS "hours!"
         FROM usage_daily r JOIN bookings b ON b.id = r.booking_id
         WHERE b.tenant_id = $1 AND r.day >= $2
         GROUP BY b.user_id"#,
        tenant_id,
        since
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.user_id, r.hours)).collect())
}

/// An allocation request.
#[derive(Debug, Clone)]
pub struct AllocationRequest {
    pub id: i64,
    pub tenant_id: i64,
    pub tenant_slug: String,
    pub tenant_name: String,
    pub requested_by: Option<i64>,
    pub requested_by_email: Option<String>,
    pub created_at: OffsetDateTime,
    pub current: Value,
    pub asked: Value,
    pub justification: String,
    pub state: String,
    pub granted: Option<Value>,
    pub decided_by_email: Option<String>,
    pub decided_at: Option<OffsetDateTime>,
    pub decision_note: Option<String>,
}

impl AllocationRequest {
    fn amounts(v: &Value) -> Option<Allocation> {
        serde_json::from_value(v.clone()).ok()
    }

    /// The quota when asked.
    pub fn current(&self) -> Option<Allocation> {
        Self::amounts(&self.current)
    }

    /// What was asked for.
    pub fn asked(&self) -> Option<Allocation> {
        Self::amounts(&self.asked)
    }

    /// What was granted (approved or amended).
    pub fn granted(&self) -> Option<Allocation> {
        self.granted.as_ref().and_then(Self::amounts)
    }

    /// (label, when asked, asked, granted) per amount, for tables.
    pub fn lines(&self) -> Vec<(&'static str, String, String, String)> {
        let (Some(current), Some(asked)) = (self.current(), self.asked()) else {
            return Vec::new();
        };
        let granted = self.granted();
        current
            .rows()
            .iter()
            .zip(asked.rows())
            .enumerate()
            .map(|(i, (c, a))| {
                (
                    c.1,
                    c.2.to_string(),
                    a.2.to_string(),
                    granted
                        .map(|g| g.rows()[i].2.to_string())
                        .unwrap_or_default(),
                )
            })
            .collect()
    }
}

macro_rules! request_query {
    ($where:literal $(, $arg:expr)*) => {
        sqlx::query_as!(
            AllocationRequest,
            r#"SELECT r.id, r.tenant_id, t.slug AS tenant_slug, t.name AS tenant_name,
                    r.requested_by, ru.email AS "requested_by_email?", r.created_at, r.current, r.asked,
                    r.justification, r.state, r.granted, du.email AS "decided_by_email?", r.decided_at,
                    r.decision_note
             FROM allocation_requests r JOIN tenants t ON t.id = r.tenant_id
             LEFT JOIN users ru ON ru.id = r.requested_by
             LEFT JOIN users du ON du.id = r.decided_by
             "# + $where $(, $arg)*
        )
    };
}

/// Files a request. Fails on `allocation_requests_pending_idx` when the
/// tenant has one pending already.
pub async fn file_request(
    tx: &mut Transaction<'_, Postgres>,
    tenant_id: i64,
    user_id: i64,
    current: Allocation,
    asked: Allocation,
    justification: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO allocation_requests (tenant_id, requested_by, current, asked, justification)
         VALUES ($1, $2, $3, $4, $5) RETURNING id",
        tenant_id,
        user_id,
        serde_json::to_value(current).unwrap_or_default(),
        serde_json::to_value(asked).unwrap_or_default(),
        justification
    )
    .fetch_one(&mut **tx)
    .await
}

/// A tenant's requests, newest first.
pub async fn requests_of(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    limit: i64,
) -> sqlx::Result<Vec<AllocationRequest>> {
    request_query!(
        "WHERE r.tenant_id = $1 ORDER BY r.created_at DESC, r.id DESC LIMIT $2",
        tenant_id,
        limit
    )
    .fetch_all(db)
    .await
}

/// The admins' queue: pending requests oldest first, then the latest
/// decided ones.
pub async fn queue(db: impl PgExecutor<'_>, decided: i64) -> sqlx::Result<Vec<AllocationRequest>> {
    request_query!(
        "WHERE r.state = 'pending' OR r.id IN (SELECT id FROM allocation_requests WHERE state <> 'pending'
                                               ORDER BY decided_at DESC NULLS LAST, id DESC LIMIT $1)
         ORDER BY (r.state = 'pending') DESC,
                  CASE WHEN r.state = 'pending' THEN r.created_at END ASC,
                  r.decided_at DESC NULLS LAST, r.id DESC",
        decided
    )
    .fetch_all(db)
    .await
}

/// How many requests wait for an admin.
pub async fn pending_count(db: impl PgExecutor<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM allocation_requests WHERE state = 'pending'"#
    )
    .fetch_one(db)
    .await
}

/// One request, its row locked.
pub async fn request_for_update(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
) -> sqlx::Result<Option<AllocationRequest>> {
    request_query!("WHERE r.id = $1 FOR UPDATE OF r", id)
        .fetch_optional(&mut **tx)
        .await
}

/// Records a decision on a pending request; false when it was no longer
/// pending.
pub async fn decide(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    state: &str,
    granted: Option<Allocation>,
    by: Option<i64>,
    note: Option<&str>,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE allocation_requests SET state = $2, granted = $3, decided_by = $4, decided_at = now(),
             decision_note = $5
         WHERE id = $1 AND state = 'pending'",
        id,
        state,
        granted.map(|g| serde_json::to_value(g).unwrap_or_default()),
        by,
        note
    )
    .execute(&mut **tx)
    .await?;
    Ok(r.rows_affected() == 1)
}
