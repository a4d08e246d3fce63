//! Alert rules and alerts.

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::alerts::{AlertState, Open, Rule, Severity, Subject};

pub async fn rules(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Rule>> {
    sqlx::query_as!(
        Rule,
        r#"SELECT name, description, threshold, for_secs, severity AS "severity: Severity", enabled
           FROM alert_rules ORDER BY name"#
    )
    .fetch_all(db)
    .await
}

pub async fn rule(db: impl PgExecutor<'_>, name: &str) -> sqlx::Result<Option<Rule>> {
    sqlx::query_as!(
        Rule,
        r#"SELECT name, description, threshold, for_secs, severity AS "severity: Severity", enabled
           FROM alert_rules WHERE name = $1"#,
        name
    )
    .fetch_optional(db)
    .await
}

/// Stores a rule's settings; false when there is no such rule.
pub async fn update_rule(db: impl PgExecutor<'_>, r: &Rule) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE alert_rules SET threshold = $2, for_secs = $3, severity = $4, enabled = $5, updated_at = now()
         WHERE name = $1",
        r.name,
        r.threshold,
        r.for_secs,
        r.severity.as_str(),
        r.enabled
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// An alert as stored.
#[derive(Debug, Clone)]
pub struct Alert {
    pub id: i64,
    pub rule: String,
    pub severity: Severity,
    pub state: AlertState,
    pub node: Option<String>,
    pub gpu_uuid: Option<String>,
    pub booking_id: Option<i64>,
    pub value: Option<f64>,
    pub message: String,
    pub started_at: OffsetDateTime,
    pub fired_at: Option<OffsetDateTime>,
    pub resolved_at: Option<OffsetDateTime>,
    pub acked_by: Option<String>,
    pub acked_at: Option<OffsetDateTime>,
    pub silenced_until: Option<OffsetDateTime>,
}

impl Alert {
    pub fn subject(&self) -> Subject {
        Subject {
            node: self.node.clone(),
            gpu_uuid: self.gpu_uuid.clone(),
            booking_id: self.booking_id,
        }
    }

    pub fn silenced(&self) -> bool {
        self.silenced_until
            .is_some_and(|t| t > OffsetDateTime::now_utc())
    }
}

/// Which alerts to list.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    /// `None`: every state.
    pub states: Option<Vec<AlertState>>,
    pub rule: Option<String>,
    pub node: Option<String>,
    pub gpu_uuid: Option<String>,
    pub severity: Option<Severity>,
    /// Only alerts on bookings of this user.
    pub owner: Option<i64>,
    pub booking_id: Option<i64>,
    pub id: Option<i64>,
    /// Alerts after this key in the list's order (open first, then newest):
    /// (open, started at, id) of the previous page's last; `None`: the first
    /// page.
    pub after: Option<(bool, OffsetDateTime, i64)>,
    pub limit: i64,
}

pub async fn list(db: impl PgExecutor<'_>, f: &Filter) -> sqlx::Result<Vec<Alert>> {
    // The first page: before every row.
    let after = f
        .after
        .unwrap_or((true, time::macros::datetime!(9999-12-31 0:00 UTC), i64::MAX));
    let states: Option<Vec<String>> = f
        .states
        .as_ref()
        .map(|s| s.iter().map(|s| s.as_str().to_string()).collect());
    sqlx::query_as!(
        Alert,
        r#"SELECT a.id, a.rule, a.severity AS "severity: Severity", a.state AS "state: AlertState",
                  a.node, a.gpu_uuid, a.booking_id, a.value, a.message, a.started_at, a.fired_at,
                  a.resolved_at, u.email AS "acked_by?", a.acked_at, a.silenced_until
           FROM alerts a
           LEFT JOIN users u ON u.id = a.acked_by
           LEFT JOIN bookings b ON b.id = a.booking_id
           WHERE ($1::text[] IS NULL OR a.state = ANY($1))
             AND ($2::text IS NULL OR a.rule = $2)
             AND ($3::text IS NULL OR a.node = $3)
             AND ($4::text IS NULL OR a.gpu_uuid = $4)
             AND ($5::text IS NULL OR a.severity = $5)
             AND ($6::bigint IS NULL OR b.user_id = $6)
             AND ($7::bigint IS NULL OR a.booking_id = $7)
             AND ($9::bigint IS NULL OR a.id = $9)
             AND ((a.state <> 'resolved'), a.started_at, a.id) < ($10, $11, $12)
           ORDER BY (a.state <> 'resolved') DESC, a.started_at DESC, a.id DESC
           LIMIT $8"#,
        states.as_deref(),
        f.rule,
        f.node,
        f.gpu_uuid,
        f.severity.map(Severity::as_str),
        f.owner,
        f.booking_id,
        f.limit,
        f.id,
        after.0,
        after.1,
        after.2
    )
    .fetch_all(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<Alert>> {
    let f = Filter {
        id: Some(id),
        limit: 1,
        ..Filter::default()
    };
    Ok(list(db, &f).await?.pop())
}

/// The open alerts of a rule.
pub async fn open_of(tx: &mut Transaction<'_, Postgres>, rule: &str) -> sqlx::Result<Vec<Open>> {
    let rows = sqlx::query!(
        r#"SELECT id, node, gpu_uuid, booking_id, state AS "state: AlertState", started_at
           FROM alerts WHERE rule = $1 AND state IN ('pending', 'firing')"#,
        rule
    )
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Open {
            id: r.id,
            subject: Subject {
                node: r.node,
                gpu_uuid: r.gpu_uuid,
                booking_id: r.booking_id,
            },
            state: r.state,
            started_at: r.started_at,
        })
        .collect())
}

/// Opens an alert (pending or firing); `None` when one is already open
/// for the rule and subject (another evaluator got there first).
pub async fn open(
    tx: &mut Transaction<'_, Postgres>,
    rule: &Rule,
    subject: &Subject,
    value: f64,
    message: &str,
    firing: bool,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        "INSERT INTO alerts (rule, severity, state, node, gpu_uuid, booking_id, value, message, fired_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $9 THEN now() END)
         ON CONFLICT (rule, subject) WHERE state IN ('pending', 'firing') DO NOTHING
         RETURNING id",
        rule.name,
        rule.severity.as_str(),
        if firing { "firing" } else { "pending" },
        subject.node,
        subject.gpu_uuid,
        subject.booking_id,
        value,
        message,
        firing
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Records an alert that began and ended while nobody could record it
/// (the metering spool filled while PostgreSQL was away).
pub async fn record_past(
    tx: &mut Transaction<'_, Postgres>,
    rule: &Rule,
    subject: &Subject,
    value: f64,
    message: &str,
    started_at: OffsetDateTime,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO alerts (rule, severity, state, node, gpu_uuid, booking_id, value, message,
                             started_at, fired_at, resolved_at)
         VALUES ($1, $2, 'resolved', $3, $4, $5, $6, $7, $8, $8, now())
         RETURNING id",
        rule.name,
        rule.severity.as_str(),
        subject.node,
        subject.gpu_uuid,
        subject.booking_id,
        value,
        message,
        started_at
    )
    .fetch_one(&mut **tx)
    .await
}

pub async fn fire(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    value: f64,
    message: &str,
) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE alerts SET state = 'firing', fired_at = now(), value = $2, message = $3
         WHERE id = $1 AND state = 'pending'",
        id,
        value,
        message
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(n == 1)
}

pub async fn update_value(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    value: f64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE alerts SET value = $2 WHERE id = $1 AND state IN ('pending', 'firing')",
        id,
        value
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub async fn resolve(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    value: f64,
) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE alerts SET state = 'resolved', resolved_at = now(), value = $2
         WHERE id = $1 AND state = 'firing'",
        id,
        value
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// A pending alert that cleared before firing is forgotten.
pub async fn drop_pending(tx: &mut Transaction<'_, Postgres>, id: i64) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM alerts WHERE id = $1 AND state = 'pending'", id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// An admin acknowledges an open alert; false when it is not open.
pub async fn acknowledge(db: impl PgExecutor<'_>, id: i64, by: i64) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE alerts SET acked_by = $2, acked_at = now() WHERE id = $1 AND state <> 'resolved'",
        id,
        by
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// An admin silences an alert's notifications until `until` (`None`: unsilence).
pub async fn silence(
    db: impl PgExecutor<'_>,
    id: i64,
    until: Option<OffsetDateTime>,
) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE alerts SET silenced_until = $2 WHERE id = $1",
        id,
        until
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// Firing alerts counted by rule and severity (for `/metrics`).
pub async fn firing_counts(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<(String, Severity, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT rule, severity AS "severity: Severity", count(*) AS "n!"
           FROM alerts WHERE state = 'firing' GROUP BY 1, 2"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.rule, r.severity, r.n))
        .collect())
}

/// Nodes and how long since each reported.
pub async fn node_ages(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<(String, f64)>> {
    let rows = sqlx::query!(
        r#"SELECT name, EXTRACT(EPOCH FROM now() - last_heartbeat)::float8 AS "age!" FROM nodes"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.name, r.age)).collect())
}

/// Takes the evaluation's lock for this transaction; false when another
/// process is evaluating.
pub async fn try_evaluation_lock(tx: &mut Transaction<'_, Postgres>) -> sqlx::Result<bool> {
    sqlx::query_scalar!(r#"SELECT pg_try_advisory_xact_lock(7715002) AS "got!""#)
        .fetch_one(&mut **tx)
        .await
}

/// The database's clock (the transaction's start).
pub async fn now(tx: &mut Transaction<'_, Postgres>) -> sqlx::Result<OffsetDateTime> {
    sqlx::query_scalar!(r#"SELECT now() AS "now!""#)
        .fetch_one(&mut **tx)
        .await
}

/// Whether alert `id` should send nothing now: it is silenced, or (when
/// it fires) another alert of the same rule and subject fired in the last
/// ten minutes, so a flapping condition does not flood people.
pub async fn quiet(db: impl PgExecutor<'_>, id: i64, firing: bool) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT COALESCE(a.silenced_until > now(), false)
                  OR ($2 AND EXISTS (SELECT 1 FROM alerts o
                                     WHERE o.rule = a.rule AND o.subject = a.subject AND o.id <> a.id
                                       AND o.fired_at > now() - interval '10 minutes')) AS "q!"
           FROM alerts a WHERE a.id = $1"#,
        id,
        firing
    )
    .fetch_one(db)
    .await
}
