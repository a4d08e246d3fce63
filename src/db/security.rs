//! The security monitor's incidents and evidence, and the addresses API
//! tokens were used from.

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::security::Detector;

/// Evidence kept per incident (its score counts on past it).
const EVIDENCE_KEPT: i64 = 100;

/// An incident as the admin page shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Incident {
    pub id: i64,
    pub subject: String,
    pub booking_id: Option<i64>,
    pub user_id: Option<i64>,
    pub user_email: Option<String>,
    pub node: Option<String>,
    pub score: i32,
    pub state: String,
    pub alert_id: Option<i64>,
    pub held: bool,
    #[serde(with = "time::serde::rfc3339")]
    pub opened_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub last_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub closed_at: Option<OffsetDateTime>,
    pub closed_by_email: Option<String>,
    pub close_note: Option<String>,
}

/// One piece of evidence.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Evidence {
    pub incident_id: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub detector: Detector,
    pub detail: String,
}

/// What adding evidence left: the incident, its score, its alert.
#[derive(Debug, Clone, Copy)]
pub struct Added {
    pub incident_id: i64,
    pub score: i32,
    pub alert_id: Option<i64>,
}

/// Adds evidence to the subject's open incident (opening one if none).
#[allow(clippy::too_many_arguments)]
pub async fn add(
    tx: &mut Transaction<'_, Postgres>,
    subject: &str,
    booking_id: Option<i64>,
    user_id: Option<i64>,
    node: Option<&str>,
    detector: Detector,
    detail: &str,
) -> sqlx::Result<Added> {
    let detail: String = detail.chars().take(2000).collect();
    let row = sqlx::query!(
        r#"INSERT INTO security_incidents (subject, booking_id, user_id, node, score)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (subject) WHERE state = 'open'
           DO UPDATE SET score = LEAST(security_incidents.score + EXCLUDED.score, 1000000), last_at = now(),
                         booking_id = coalesce(security_incidents.booking_id, EXCLUDED.booking_id),
                         user_id = coalesce(security_incidents.user_id, EXCLUDED.user_id),
                         node = coalesce(security_incidents.node, EXCLUDED.node)
           RETURNING id, score, alert_id"#,
        subject,
        booking_id,
        user_id,
        node,
        detector.weight()
    )
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query!(
        "INSERT INTO security_evidence (incident_id, detector, detail)
         SELECT $1, $2, $3
         WHERE (SELECT count(*) FROM security_evidence WHERE incident_id = $1) < $4",
        row.id,
        detector.as_str(),
        detail,
        EVIDENCE_KEPT
    )
    .execute(&mut **tx)
    .await?;
    Ok(Added {
        incident_id: row.id,
        score: row.score,
        alert_id: row.alert_id,
    })
}

pub async fn set_alert(
    tx: &mut Transaction<'_, Postgres>,
    incident: i64,
    alert: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE security_incidents SET alert_id = $2 WHERE id = $1",
        incident,
        alert
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The subject of an incident.
pub async fn subject_of(db: impl PgExecutor<'_>, incident: i64) -> sqlx::Result<String> {
    sqlx::query_scalar!(
        "SELECT subject FROM security_incidents WHERE id = $1",
        incident
    )
    .fetch_one(db)
    .await
}

/// Marks the incident's share frozen by the node.
pub async fn hold(db: impl PgExecutor<'_>, incident: i64) -> sqlx::Result<bool> {
    // Only the first of several detectors' responses holds (and is
    // audited); the others find it held.
    let r = sqlx::query!(
        "UPDATE security_incidents SET held = true WHERE id = $1 AND NOT held",
        incident
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Open (`closed == false`) or closed incidents, latest first.
pub async fn list(
    db: impl PgExecutor<'_>,
    closed: bool,
    limit: i64,
) -> sqlx::Result<Vec<Incident>> {
    sqlx::query_as!(
        Incident,
        r#"SELECT i.id, i.subject, i.booking_id, i.user_id, u.email AS "user_email?", i.node, i.score,
                  i.state, i.alert_id, i.held, i.opened_at, i.last_at, i.closed_at,
                  c.email AS "closed_by_email?", i.close_note
           FROM security_incidents i
           LEFT JOIN users u ON u.id = i.user_id
           LEFT JOIN users c ON c.id = i.closed_by
           WHERE (i.state = 'closed') = $1
           ORDER BY i.last_at DESC, i.id DESC
           LIMIT $2"#,
        closed,
        limit
    )
    .fetch_all(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<Incident>> {
    sqlx::query_as!(
        Incident,
        r#"SELECT i.id, i.subject, i.booking_id, i.user_id, u.email AS "user_email?", i.node, i.score,
                  i.state, i.alert_id, i.held, i.opened_at, i.last_at, i.closed_at,
                  c.email AS "closed_by_email?", i.close_note
           FROM security_incidents i
           LEFT JOIN users u ON u.id = i.user_id
           LEFT JOIN users c ON c.id = i.closed_by
           WHERE i.id = $1"#,
        id
    )
    .fetch_optional(db)
    .await
}

/// The evidence of some incidents, oldest first.
pub async fn evidence(db: impl PgExecutor<'_>, incidents: &[i64]) -> sqlx::Result<Vec<Evidence>> {
    sqlx::query_as!(
        Evidence,
        r#"SELECT incident_id, at, detector AS "detector: Detector", detail
           FROM security_evidence WHERE incident_id = ANY($1)
           ORDER BY incident_id, at, id"#,
        incidents
    )
    .fetch_all(db)
    .await
}

/// Closes an open incident with a note; the closed incident, or `None`
/// when it was not open.
pub async fn close(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    by: Option<i64>,
    note: &str,
) -> sqlx::Result<Option<(Option<i64>, i32)>> {
    let row = sqlx::query!(
        "UPDATE security_incidents
         SET state = 'closed', closed_at = now(), closed_by = $2, close_note = $3, held = false
         WHERE id = $1 AND state = 'open'
         RETURNING alert_id, score",
        id,
        by,
        note
    )
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.map(|r| (r.alert_id, r.score)))
}

/// Whether another open incident still points at `alert`.
pub async fn alert_in_use(tx: &mut Transaction<'_, Postgres>, alert: i64) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM security_incidents WHERE alert_id = $1 AND state = 'open') AS "in_use!""#,
        alert
    )
    .fetch_one(&mut **tx)
    .await
}

/// Shares on a node that a security response froze (open incidents).
pub async fn held_bookings(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(
        r#"SELECT DISTINCT i.booking_id AS "id!" FROM security_incidents i
           WHERE i.state = 'open' AND i.held AND i.node = $1 AND i.booking_id IS NOT NULL"#,
        node
    )
    .fetch_all(db)
    .await
}

/// Notes that `token` was used from `addr`. `Some(n)` when the address is
/// new for the token, with `n` other addresses it was used from before;
/// `None` when it is known (its last use is refreshed at most hourly).
pub async fn token_used_from(
    db: impl PgExecutor<'_>,
    token: i64,
    addr: &str,
) -> sqlx::Result<Option<i64>> {
    let row = sqlx::query!(
        r#"WITH prior AS (
               SELECT count(*) AS n FROM token_addresses WHERE token_id = $1 AND client_addr <> $2),
           up AS (
               INSERT INTO token_addresses (token_id, client_addr) VALUES ($1, $2)
               ON CONFLICT (token_id, client_addr) DO UPDATE SET last_at = now()
               WHERE token_addresses.last_at < now() - interval '1 hour'
               RETURNING (xmax = 0) AS inserted)
           SELECT up.inserted AS "inserted!", prior.n AS "prior!" FROM up, prior"#,
        token,
        addr
    )
    .fetch_optional(db)
    .await?;
    Ok(row.filter(|r| r.inserted).map(|r| r.prior))
}

/// The user linked to a Unix account name (for exec refusals).
pub async fn user_of_unix(db: impl PgExecutor<'_>, unix_user: &str) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!("SELECT id FROM users WHERE unix_user = $1", unix_user)
        .fetch_optional(db)
        .await
}

/// An active booking on a node, as the node's detectors see it.
#[derive(Debug, Clone)]
pub struct NodeBooking {
    pub id: i64,
    pub kind: crate::domain::booking::Kind,
    pub gpu_uuid: String,
    pub device_uuid: String,
    pub owner_id: i64,
    pub owner_unix_user: Option<String>,
}

/// The node's active bookings with a device, and their owners' accounts.
pub async fn node_bookings(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<NodeBooking>> {
    sqlx::query_as!(
        NodeBooking,
        r#"SELECT b.id, b.kind AS "kind: crate::domain::booking::Kind", g.uuid AS gpu_uuid,
                  b.device_uuid AS "device_uuid!", u.id AS owner_id, u.unix_user AS owner_unix_user
           FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
           JOIN users u ON u.id = b.user_id
           WHERE n.name = $1 AND b.status = 'active' AND b.device_uuid IS NOT NULL
           ORDER BY b.id"#,
        node
    )
    .fetch_all(db)
    .await
}
