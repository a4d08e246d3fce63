//! All SQL of gpuslice. Functions take `impl PgExecutor` so that one function
//! serves a pool or a transaction; the embedded cluster lives in [`embedded`].

pub mod alerts;
pub mod audit;
pub mod bookings;
pub mod calendar;
pub mod embedded;
pub mod fleet;
pub mod idle;
pub mod manage;
pub mod notify;
pub mod optimizer;
pub mod security;
pub mod sso;
pub mod telemetry;
pub mod tenants;
pub mod throttle;
pub mod tokens;
pub mod usage;
pub mod users;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// Migrations compiled into the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Where the database is: an explicit URL, or the embedded cluster.
pub enum Database {
    Url(String),
    Embedded(embedded::Cluster),
}

impl Database {
    /// `DATABASE_URL` when given, else the embedded cluster under `data_dir`
    /// (started, or reused when another gpuslice process runs it).
    pub async fn open(url: Option<&str>, data_dir: &Path) -> Result<Database> {
        match url {
            Some(url) if !url.trim().is_empty() => Ok(Database::Url(url.to_string())),
            _ => Ok(Database::Embedded(
                embedded::Cluster::ensure(data_dir).await?,
            )),
        }
    }

    pub fn connect_options(&self) -> Result<PgConnectOptions> {
        match self {
            Database::Url(url) => url
                .parse()
                .context("DATABASE_URL is not a valid PostgreSQL URL"),
            Database::Embedded(c) => Ok(c.connect_options()),
        }
    }

    pub async fn pool(&self) -> Result<PgPool> {
        connect(self.connect_options()?).await
    }

    /// Stops the embedded server if this process started it.
    pub async fn close(self) -> Result<()> {
        match self {
            Database::Url(_) => Ok(()),
            Database::Embedded(c) => c.stop().await,
        }
    }
}

/// A connection pool with the settings every gpuslice process uses.
pub async fn connect(options: PgConnectOptions) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(16)
        // While the database is away a page answers 503 after this long.
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .context("cannot connect to PostgreSQL")
}

/// Applies pending migrations.
pub async fn migrate(pool: &PgPool) -> Result<()> {
    MIGRATOR
        .run(pool)
        .await
        .context("database migration failed")
}

/// Whether the database answers (for `/readyz`).
pub async fn ping(pool: &PgPool) -> bool {
    tokio::time::timeout(
        Duration::from_secs(2),
        sqlx::query_scalar!("SELECT 1 AS \"one!\"").fetch_one(pool),
    )
    .await
    .is_ok_and(|r| r.is_ok())
}

/// Deletes expired sessions and throttle windows that ended long ago.
pub async fn sessions_cleanup(pool: &PgPool) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM tower_sessions.session WHERE expiry_date < now()")
        .execute(pool)
        .await?;
    sqlx::query!("DELETE FROM login_throttle WHERE window_start < now() - interval '1 day'")
        .execute(pool)
        .await?;
    sqlx::query!("DELETE FROM sign_in_addresses WHERE last_at < now() - interval '90 days'")
        .execute(pool)
        .await?;
    Ok(())
}

/// Whether `e` is a unique violation of the named constraint (callers turn
/// it into a field message or a sentence).
pub fn is_unique_violation(e: &sqlx::Error, constraint: &str) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation() && d.constraint() == Some(constraint))
}

/// The exclusion constraint that keeps live MIG bookings on one GPU from
/// sharing a memory slice at overlapping times.
pub const NO_OVERLAP: &str = "bookings_no_overlap";

/// Another booking holds the slot: the schema's [`NO_OVERLAP`] guard fired.
pub fn is_exclusion_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.constraint() == Some(NO_OVERLAP))
}

/// PostgreSQL broke a deadlock by aborting this transaction (40P01): a
/// lost race, safe to plan again.
pub fn is_deadlock(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("40P01"))
}

/// Whether `e` means the database cannot be reached or is restarting (the
/// web layer answers 503 with `Retry-After` instead of an internal error):
/// no connection within the pool's timeout, a broken socket, or the server
/// shutting down or starting up (SQLSTATE class 08 and 57P01–57P03).
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(d) => d
            .code()
            .is_some_and(|c| c.starts_with("08") || matches!(&*c, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}
