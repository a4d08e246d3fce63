//! The notification outbox and each person's choices. A notification is
//! written in the transaction of the change that causes it (an alert
//! firing, a booking becoming active), so it exists exactly when the
//! change does; the notifier sends it later.

use sqlx::{PgExecutor, PgPool, Postgres, Transaction};
use time::OffsetDateTime;

/// What a person can be told by e-mail: (topic, label, who it concerns).
pub const TOPICS: [(&str, &str); 10] = [
    (
        "alert_critical",
        "Critical alerts anywhere in the fleet (admins)",
    ),
    ("booking_alert", "Alerts on my bookings"),
    (
        "booking_placed",
        "A booking of mine got a GPU, or moved to another GPU or slot before its start",
    ),
    ("booking_active", "A booking of mine is ready to use"),
    ("booking_ending", "A booking of mine ends in 15 minutes"),
    ("booking_ended", "A booking of mine ended"),
    ("booking_failed", "A booking of mine failed"),
    (
        "booking_idle",
        "A booking of mine is idle, or was released for it",
    ),
    (
        "membership",
        "I was added to a tenant, removed, or my role changed",
    ),
    (
        "allocation",
        "Allocation requests: decisions on my tenant's (managers), new ones to decide (admins)",
    ),
];

/// `(topic, wants e-mail)` for every topic; a topic never chosen is on.
pub async fn prefs(db: impl PgExecutor<'_>, user_id: i64) -> sqlx::Result<Vec<(String, bool)>> {
    let set = sqlx::query!(
        "SELECT topic, email FROM notification_prefs WHERE user_id = $1",
        user_id
    )
    .fetch_all(db)
    .await?;
    Ok(TOPICS
        .iter()
        .map(|(t, _)| {
            let on = set.iter().find(|r| r.topic == *t).is_none_or(|r| r.email);
            (t.to_string(), on)
        })
        .collect())
}

/// Stores a person's choices (topics not named are off).
pub async fn set_prefs(db: &PgPool, user_id: i64, on: &[String]) -> sqlx::Result<()> {
    let topics: Vec<String> = TOPICS.iter().map(|(t, _)| t.to_string()).collect();
    let wants: Vec<bool> = topics.iter().map(|t| on.contains(t)).collect();
    sqlx::query!(
        "INSERT INTO notification_prefs (user_id, topic, email)
         SELECT $1, t, e FROM unnest($2::text[], $3::bool[]) AS x (t, e)
         ON CONFLICT (user_id, topic) DO UPDATE SET email = EXCLUDED.email",
        user_id,
        &topics,
        &wants
    )
    .execute(db)
    .await?;
    Ok(())
}

/// What a notification says and what it is about.
pub struct Message<'a> {
    pub topic: &'a str,
    pub subject: &'a str,
    pub body: &'a str,
    pub alert_id: Option<i64>,
    pub booking_id: Option<i64>,
}

/// Queues an e-mail to a person, if they want this topic and can sign in.
pub async fn email_user(
    tx: &mut Transaction<'_, Postgres>,
    user_id: i64,
    m: &Message<'_>,
) -> sqlx::Result<bool> {
    Ok(email(tx, Some(user_id), m).await? == 1)
}

/// Queues an e-mail to an address that has no account yet (an invitation).
pub async fn email_address(
    tx: &mut Transaction<'_, Postgres>,
    address: &str,
    m: &Message<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO notifications (channel, recipient, topic, subject, body)
         VALUES ('email', $1, $2, $3, $4)",
        address,
        m.topic,
        m.subject,
        m.body
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Queues an e-mail to every admin who wants this topic.
pub async fn email_admins(
    tx: &mut Transaction<'_, Postgres>,
    m: &Message<'_>,
) -> sqlx::Result<u64> {
    email(tx, None, m).await
}

/// One person (`Some`) or every admin (`None`), each if they want the
/// topic (no choice made means yes) and are not disabled.
async fn email(
    tx: &mut Transaction<'_, Postgres>,
    user_id: Option<i64>,
    m: &Message<'_>,
) -> sqlx::Result<u64> {
    let n = sqlx::query!(
        "INSERT INTO notifications (channel, recipient, user_id, topic, subject, body, alert_id, booking_id)
         SELECT 'email', u.email, u.id, $2, $3, $4, $5, $6 FROM users u
         WHERE NOT u.disabled
           AND (u.id = $1 OR ($1::bigint IS NULL AND u.global_role = 'admin'))
           AND COALESCE((SELECT email FROM notification_prefs p WHERE p.user_id = u.id AND p.topic = $2), true)",
        user_id,
        m.topic,
        m.subject,
        m.body,
        m.alert_id,
        m.booking_id
    )
    .execute(&mut **tx)
    .await?;
    Ok(n.rows_affected())
}

/// Queues a webhook post.
pub async fn webhook(tx: &mut Transaction<'_, Postgres>, m: &Message<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO notifications (channel, recipient, topic, subject, body, alert_id, booking_id)
         VALUES ('webhook', '', $1, $2, $3, $4, $5)",
        m.topic,
        m.subject,
        m.body,
        m.alert_id,
        m.booking_id
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A notification as stored.
#[derive(Debug, Clone)]
pub struct Notification {
    pub id: i64,
    pub created_at: OffsetDateTime,
    pub channel: String,
    pub recipient: String,
    pub topic: String,
    pub subject: String,
    pub body: String,
    pub state: String,
    pub attempts: i32,
    pub sent_at: Option<OffsetDateTime>,
    pub last_error: Option<String>,
}

/// Claims the next due notification of `channel` for sending. The claim
/// is committed before anything is sent, so a sender that dies after
/// sending leaves a `sending` row, which is never sent again blindly.
pub async fn claim(db: &PgPool, channel: &str, by: &str) -> sqlx::Result<Option<Notification>> {
    sqlx::query_as!(
        Notification,
        "UPDATE notifications SET state = 'sending', claimed_at = now(), claimed_by = $2,
                                  attempts = attempts + 1
         WHERE id = (SELECT id FROM notifications
                     WHERE state = 'pending' AND channel = $1 AND next_attempt_at <= now()
                     ORDER BY next_attempt_at, id FOR UPDATE SKIP LOCKED LIMIT 1)
         RETURNING id, created_at, channel, recipient, topic, subject, body, state, attempts, sent_at, last_error",
        channel,
        by
    )
    .fetch_optional(db)
    .await
}

/// Marks a notification this sender claimed as sent.
pub async fn mark_sent(db: &PgPool, id: i64, by: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE notifications SET state = 'sent', sent_at = now(), last_error = NULL
         WHERE id = $1 AND state = 'sending' AND claimed_by = $2",
        id,
        by
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The send was refused (nothing left): try again after `backoff`, or
/// give up after `max_attempts`.
pub async fn mark_retry(
    db: &PgPool,
    id: i64,
    by: &str,
    error: &str,
    backoff_secs: f64,
    max_attempts: i32,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE notifications SET last_error = $2,
                state = CASE WHEN attempts >= $4 THEN 'failed' ELSE 'pending' END,
                next_attempt_at = now() + make_interval(secs => $3)
         WHERE id = $1 AND state = 'sending' AND claimed_by = $5",
        id,
        error,
        backoff_secs,
        max_attempts,
        by
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Claims older than `lease_secs` whose sender never marked them: the
/// message may or may not have left, so they are not sent again but
/// shown as `unconfirmed` for an admin to resend. Returns how many.
pub async fn settle_orphans(db: &PgPool, lease_secs: f64) -> sqlx::Result<u64> {
    let n = sqlx::query!(
        "UPDATE notifications SET state = 'unconfirmed',
                last_error = 'the sender stopped between claiming and confirming; it may have been sent'
         WHERE state = 'sending' AND claimed_at < now() - make_interval(secs => $1)",
        lease_secs
    )
    .execute(db)
    .await?;
    Ok(n.rows_affected())
}

/// Notifications nobody sent within a day (no process has their channel
/// configured) are given up, so that turning a channel on later does not
/// send a backlog of stale mail. Returns how many.
pub async fn expire_unsent(db: impl PgExecutor<'_>) -> sqlx::Result<u64> {
    let n = sqlx::query!(
        "UPDATE notifications SET state = 'failed',
                last_error = 'not sent within a day: no running gpuslice has this channel configured'
         WHERE state = 'pending' AND created_at < now() - interval '1 day'"
    )
    .execute(db)
    .await?;
    Ok(n.rows_affected())
}

/// The owner of a booking.
pub async fn owner_of(db: impl PgExecutor<'_>, booking_id: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar!("SELECT user_id FROM bookings WHERE id = $1", booking_id)
        .fetch_one(db)
        .await
}

/// An admin sends a failed or unconfirmed notification again.
pub async fn resend(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE notifications SET state = 'pending', next_attempt_at = now(), attempts = 0
         WHERE id = $1 AND state IN ('failed', 'unconfirmed')",
        id
    )
    .execute(db)
    .await?;
    Ok(n.rows_affected() == 1)
}

/// The latest notifications (for admins).
pub async fn recent(db: impl PgExecutor<'_>, limit: i64) -> sqlx::Result<Vec<Notification>> {
    sqlx::query_as!(
        Notification,
        "SELECT id, created_at, channel, recipient, topic, subject, body, state, attempts, sent_at, last_error
         FROM notifications ORDER BY id DESC LIMIT $1",
        limit
    )
    .fetch_all(db)
    .await
}

/// A booking's lifecycle notice for its owner, if this move is one
/// people expect to hear about.
pub async fn booking_moved(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    to: crate::domain::lifecycle::Status,
    from: crate::domain::lifecycle::Status,
    reason: Option<&str>,
) -> sqlx::Result<()> {
    use crate::domain::lifecycle::Status;
    let (topic, what) = match (from, to) {
        (Status::Queued, Status::Scheduled) => ("booking_placed", "got a GPU"),
        // Only a move of a booking ahead to another GPU or slot (same time).
        (Status::Scheduled, Status::Scheduled) => (
            "booking_placed",
            "moved to another GPU or slot before its start",
        ),
        (_, Status::Active) => ("booking_active", "is ready to use"),
        (Status::Releasing, Status::Released | Status::Expired) => ("booking_ended", "ended"),
        (Status::Releasing, Status::Failed) => ("booking_failed", "failed"),
        _ => return Ok(()),
    };
    let b = sqlx::query!(
        r#"SELECT b.user_id, b.kind, b.profile, b.memory_gib, b.model, b.device_uuid,
                  lower(b.during) AS "start!", upper(b.during) AS "end!", b.reason
           FROM bookings b WHERE b.id = $1"#,
        id
    )
    .fetch_one(&mut **tx)
    .await?;
    let size = match &b.profile {
        Some(p) => p.clone(),
        None => format!("{} GiB share", b.memory_gib),
    };
    let subject = format!("gpuslice: booking #{id} ({size}) {what}");
    let mut body = format!(
        "Your booking #{id}, {size} of {}, {what}.\n\nFrom {} to {} (UTC).\n",
        b.model.as_deref().unwrap_or("a GPU"),
        crate::booking::when(b.start),
        crate::booking::when(b.end)
    );
    if to == Status::Active {
        body.push_str(&format!(
            "\nUse it on its node with:\n  gpuslice exec {id} -- python train.py\n(device {})\n",
            b.device_uuid.as_deref().unwrap_or("-")
        ));
    }
    if let Some(r) = reason.or(b.reason.as_deref()).filter(|r| !r.is_empty()) {
        body.push_str(&format!("\nReason: {r}\n"));
    }
    email_user(
        tx,
        b.user_id,
        &Message {
            topic,
            subject: &subject,
            body: &body,
            alert_id: None,
            booking_id: Some(id),
        },
    )
    .await?;
    Ok(())
}
