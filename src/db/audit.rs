//! The audit log: who changed what, when, from where.

use serde_json::Value;
use sqlx::PgExecutor;
use time::OffsetDateTime;

/// Who did something: a signed-in user, or the command line / the system.
#[derive(Debug, Clone, Default)]
pub struct Actor {
    pub user_id: Option<i64>,
    pub email: Option<String>,
    pub client_addr: Option<String>,
}

impl Actor {
    /// A part of gpuslice acting on its own (idle reclaim, the planner).
    pub fn system(name: &str) -> Self {
        Actor {
            user_id: None,
            email: Some(name.into()),
            client_addr: None,
        }
    }

    /// The command line on the server (no user, no address).
    pub fn cli() -> Self {
        Actor {
            user_id: None,
            email: Some("cli".into()),
            client_addr: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub id: i64,
    pub at: OffsetDateTime,
    pub actor_email: Option<String>,
    pub action: String,
    pub target: String,
    pub detail: Value,
    pub client_addr: Option<String>,
}

pub async fn record(
    db: impl PgExecutor<'_>,
    actor: &Actor,
    action: &str,
    target: &str,
    detail: Value,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO audit_log (actor_id, actor_email, action, target, detail, client_addr)
         VALUES ($1, $2, $3, $4, $5, $6)",
        actor.user_id,
        actor.email,
        action,
        target,
        detail,
        actor.client_addr
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The newest entries, optionally only those whose action starts with
/// `action_prefix`.
/// The newest entries whose action starts with `action_prefix`, after
/// `(at, id)` (the last entry of the previous page).
pub async fn recent(
    db: impl PgExecutor<'_>,
    action_prefix: &str,
    after: (OffsetDateTime, i64),
    limit: i64,
) -> sqlx::Result<Vec<Entry>> {
    sqlx::query_as!(
        Entry,
        "SELECT id, at, actor_email, action, target, detail, client_addr
         FROM audit_log WHERE starts_with(action, $1) AND (at, id) < ($2, $3)
         ORDER BY at DESC, id DESC LIMIT $4",
        action_prefix,
        after.0,
        after.1,
        limit
    )
    .fetch_all(db)
    .await
}
