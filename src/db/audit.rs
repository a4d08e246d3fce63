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
/// The newest entries whose action starts with `action_prefix`, older than
/// entry `before` when given (keyset pagination).
pub async fn recent(
    db: impl PgExecutor<'_>,
    action_prefix: &str,
    before: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<Entry>> {
    sqlx::query_as!(
        Entry,
        "SELECT a.id, a.at, a.actor_email, a.action, a.target, a.detail, a.client_addr
         FROM audit_log a WHERE starts_with(a.action, $1)
           AND ($2::bigint IS NULL
                OR (a.at, a.id) < (SELECT b.at, b.id FROM audit_log b WHERE b.id = $2))
         ORDER BY a.at DESC, a.id DESC LIMIT $3",
        action_prefix,
        before,
        limit
    )
    .fetch_all(db)
    .await
}
