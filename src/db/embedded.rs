//! The private PostgreSQL cluster gpuslice runs when no `DATABASE_URL` is set.
//!
//! Data lives in `<data dir>/pg`; the server listens only on a Unix socket in
//! that folder (`listen_addresses=''`), so it never collides with another
//! PostgreSQL on the machine and nothing outside the folder's owner (and root)
//! can reach it. PostgreSQL refuses to run as root, so when gpuslice runs as
//! root the cluster belongs to the `postgres` account (or `nobody` where that
//! does not exist). A second gpuslice process (a CLI call beside `serve`)
//! finds the running server and reuses it; only the process that started the
//! server stops it.

use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{anyhow, bail, Context, Result};
use sqlx::postgres::PgConnectOptions;

/// Name of the superuser and of the database gpuslice uses in its cluster.
pub const DB_NAME: &str = "gpuslice";

/// A running embedded cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    pgdata: PathBuf,
    bin_dir: PathBuf,
    run_as: Option<(nix::unistd::Uid, nix::unistd::Gid)>,
    /// Whether this process started the server (and so stops it).
    started_here: bool,
}

const INSTALL_HINT: &str = "PostgreSQL server programs (initdb, pg_ctl, postgres) were not found \
on PATH or under /usr/lib/postgresql/*/bin: install them (Debian/Ubuntu: `apt-get install \
postgresql`) or set DATABASE_URL to an existing PostgreSQL database";

/// Finds the folder holding `initdb`, `pg_ctl` and `postgres`.
pub fn find_bin_dir() -> Result<PathBuf> {
    let has_all = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let initdb = dir.join("initdb");
            if initdb.is_file() {
                // Follow symlinks (Debian links /usr/local/bin/initdb to the
                // versioned folder) so pg_ctl and postgres come from the same place.
                let real = fs::canonicalize(&initdb).unwrap_or(initdb);
                if let Some(parent) = real.parent() {
                    if has_all(parent) {
                        return Ok(parent.to_path_buf());
                    }
                }
                if has_all(&dir) {
                    return Ok(dir);
                }
            }
        }
    }
    let mut versioned: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            has_all(&bin).then_some((v, bin))
        })
        .collect();
    versioned.sort();
    versioned
        .pop()
        .map(|(_, p)| p)
        .ok_or_else(|| anyhow!(INSTALL_HINT))
}

impl Cluster {
    /// Starts the cluster under `data_dir` (creating it on first use), or
    /// attaches to the server another gpuslice process already started.
    pub async fn ensure(data_dir: &Path) -> Result<Cluster> {
        let data_dir = data_dir.to_path_buf();
        let cluster = tokio::task::spawn_blocking(move || Self::ensure_blocking(&data_dir))
            .await
            .context("embedded PostgreSQL start panicked")??;
        cluster.ensure_database().await?;
        Ok(cluster)
    }

    fn ensure_blocking(data_dir: &Path) -> Result<Cluster> {
        let bin_dir = find_bin_dir()?;
        fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create data directory {}", data_dir.display()))?;
        let data_dir = fs::canonicalize(data_dir)?;
        // Serialise start-up between gpuslice processes sharing the folder.
        let lock = File::create(data_dir.join(".pg.lock"))
            .with_context(|| format!("cannot write to {}", data_dir.display()))?;
        lock.lock().context("cannot lock the data directory")?;

        let run_as = service_account()?;
        let pgdata = data_dir.join("pg");
        let mut cluster = Cluster {
            pgdata: pgdata.clone(),
            bin_dir,
            run_as,
            started_here: false,
        };
        if !pgdata.join("PG_VERSION").exists() {
            cluster.init()?;
        }
        if cluster.pg_ctl(&["status"])?.status.success() {
            tracing::info!(pgdata = %pgdata.display(), "reusing the running embedded PostgreSQL");
        } else {
            cluster.start()?;
            cluster.started_here = true;
        }
        drop(lock);
        Ok(cluster)
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        cmd.current_dir(&self.pgdata).env("LC_ALL", "C.UTF-8");
        if let Some((uid, gid)) = self.run_as {
            // std drops root's supplementary groups itself when uid is set.
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<Output> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(&self.pgdata).args(args);
        cmd.output().context("cannot run pg_ctl")
    }

    fn init(&self) -> Result<()> {
        // A half-made folder from an interrupted initdb would make it refuse.
        if self.pgdata.exists() {
            fs::remove_dir_all(&self.pgdata)?;
        }
        fs::create_dir_all(&self.pgdata)?;
        fs::set_permissions(&self.pgdata, fs::Permissions::from_mode(0o700))?;
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(&self.pgdata, Some(uid), Some(gid))
                .context("cannot hand the database folder to the postgres account")?;
        }
        tracing::info!(pgdata = %self.pgdata.display(), "creating the embedded PostgreSQL cluster");
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(&self.pgdata)
            .args(["-U", DB_NAME, "-E", "UTF8", "--locale=C.UTF-8"])
            .args([
                "--auth-local=trust",
                "--auth-host=reject",
                "--no-instructions",
            ])
            .output()
            .context("cannot run initdb")?;
        if !out.status.success() {
            bail!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn start(&self) -> Result<()> {
        let socket_dir = self.pgdata.to_string_lossy().replace('\'', "");
        let opts = format!(
            "-c listen_addresses='' -c unix_socket_directories='{socket_dir}' \
             -c unix_socket_permissions=0700 -c max_connections=200"
        );
        let log = self.pgdata.join("server.log");
        let out = self.pg_ctl(&[
            "start",
            "-w",
            "-t",
            "60",
            "-s",
            "-l",
            &log.to_string_lossy(),
            "-o",
            &opts,
        ])?;
        if !out.status.success() {
            let tail = fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            bail!(
                "the embedded PostgreSQL did not start: {} {}",
                String::from_utf8_lossy(&out.stderr).trim(),
                tail
            );
        }
        tracing::info!(pgdata = %self.pgdata.display(), "embedded PostgreSQL started");
        Ok(())
    }

    async fn ensure_database(&self) -> Result<()> {
        use sqlx::ConnectOptions;
        let mut conn = self
            .options_for("postgres")
            .connect()
            .await
            .context("cannot connect to the embedded PostgreSQL")?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(DB_NAME)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            // Two processes may race here; the loser sees "already exists".
            if let Err(e) = sqlx::query(&format!("CREATE DATABASE {DB_NAME}"))
                .execute(&mut conn)
                .await
            {
                if !e.to_string().contains("already exists") {
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// Connection options for a database of this cluster.
    pub fn options_for(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.pgdata)
            .username(DB_NAME)
            .database(database)
    }

    /// Connection options for gpuslice's own database.
    pub fn connect_options(&self) -> PgConnectOptions {
        self.options_for(DB_NAME)
    }

    /// Whether this process started the server.
    pub fn started_here(&self) -> bool {
        self.started_here
    }

    /// Stops the server if this process started it ("fast" shutdown: open
    /// transactions roll back, committed data is safe).
    pub async fn stop(self) -> Result<()> {
        if !self.started_here {
            return Ok(());
        }
        tokio::task::spawn_blocking(move || {
            let out = self.pg_ctl(&["stop", "-m", "fast", "-w", "-s"])?;
            if !out.status.success() {
                bail!(
                    "pg_ctl stop failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            tracing::info!("embedded PostgreSQL stopped");
            Ok(())
        })
        .await?
    }
}

impl Cluster {
    /// Watches the server every `every` and starts it again when its
    /// postmaster is gone (killed, out of memory): `serve` runs on the
    /// embedded cluster by default, and nothing else would bring it back.
    /// Each restart is logged and raised as the `database_restarted` alert
    /// once the database answers again. A start that fails (the dead
    /// server's children still hold its shared memory for a moment) is
    /// tried again at the next look.
    pub fn supervise(
        &self,
        pool: sqlx::PgPool,
        every: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let watcher = Cluster {
            started_here: false,
            ..self.clone()
        };
        tokio::spawn(async move {
            let mut down_since: Option<time::OffsetDateTime> = None;
            loop {
                tokio::time::sleep(every).await;
                let c = watcher.clone();
                let running = tokio::task::spawn_blocking(move || {
                    c.pg_ctl(&["status"]).map(|o| o.status.success())
                })
                .await
                .unwrap_or(Ok(true))
                .unwrap_or(true);
                if running {
                    continue;
                }
                let since = *down_since.get_or_insert_with(time::OffsetDateTime::now_utc);
                tracing::error!(pgdata = %watcher.pgdata.display(), "the embedded PostgreSQL is not running; starting it again");
                let c = watcher.clone();
                match tokio::task::spawn_blocking(move || c.start()).await {
                    Ok(Ok(())) => {
                        down_since = None;
                        tracing::warn!("the embedded PostgreSQL was started again");
                        raise_restarted(&pool, since).await;
                    }
                    Ok(Err(e)) => tracing::error!(
                        error = format!("{e:#}"),
                        "the embedded PostgreSQL did not start; trying again"
                    ),
                    Err(e) => tracing::error!(error = %e, "the embedded PostgreSQL start panicked"),
                }
            }
        })
    }
}

/// Raises `database_restarted` (tries for a minute while the pool reconnects).
async fn raise_restarted(pool: &sqlx::PgPool, since: time::OffsetDateTime) {
    let node = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok());
    let message = format!(
        "the embedded PostgreSQL stopped (noticed {}) and gpuslice started it again; see its server.log",
        since.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
    );
    for _ in 0..30 {
        let done = async {
            let mut tx = pool.begin().await?;
            crate::watch::raise_past(
                &mut tx,
                "database_restarted",
                &crate::domain::alerts::Subject {
                    node: node.clone(),
                    ..Default::default()
                },
                1.0,
                &message,
            )
            .await?;
            tx.commit().await?;
            anyhow::Ok(())
        }
        .await;
        match done {
            Ok(()) => return,
            Err(e) => tracing::debug!(error = format!("{e:#}"), "cannot record the restart yet"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    tracing::error!("the database restart could not be recorded as an alert");
}

/// The account the server runs as: none (the current user) unless we are
/// root, which PostgreSQL refuses.
fn service_account() -> Result<Option<(nix::unistd::Uid, nix::unistd::Gid)>> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        if let Some(user) = nix::unistd::User::from_name(name)? {
            return Ok(Some((user.uid, user.gid)));
        }
    }
    bail!("running as root, but neither a `postgres` nor a `nobody` account exists to run PostgreSQL; create one or set DATABASE_URL")
}
