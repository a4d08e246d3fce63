//! Metering on a node: every booking that got a device produces one usage
//! row per interval (60 s by default) from its start to its end, the last
//! one ending exactly at the release or expiry. Rows are keyed by booking
//! and interval start, so a restart re-metering an interval changes
//! nothing, and `metered_until` lets a restarted worker catch up without a
//! gap. While PostgreSQL is unreachable, rows wait in a bounded spool file
//! on local disk and are written when it returns.
//!
//! Slice-seconds are compute slices x seconds; for a time-sliced share the
//! slices are its achieved share of the GPU x 7, as the node's scheduler
//! last published it (every 5 s), for the interval that just ended; where
//! there is no fresh figure (no cgroups on the node, a catch-up after a
//! restart) its booked fraction of the GPU (its memory, in sevenths).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use time::OffsetDateTime;

use crate::db::{self, usage::ToMeter};
use crate::domain::usage::{self, UsageRow};
use crate::gpu::GpuBackend;

/// How metering paces itself.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Interval length in seconds.
    pub interval_secs: i64,
    /// How often the meter looks (shorter than the interval, so rows land
    /// soon after their interval ends).
    pub tick: Duration,
    /// Rows the spool holds at most; at 80 % an alert is raised.
    pub spool_max_rows: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            interval_secs: 60,
            tick: Duration::from_secs(5),
            spool_max_rows: 100_000,
        }
    }
}

/// The meter of one node, with what it remembers between passes.
pub struct Meter {
    node: String,
    spool: PathBuf,
    settings: Settings,
    /// The bookings last read from the database, to go on metering while
    /// it is unreachable.
    known: HashMap<i64, ToMeter>,
    spool_rows: usize,
    warned_full: bool,
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub written: usize,
    pub spooled: usize,
    pub flushed: usize,
}

impl Meter {
    /// A meter keeping its spool under `spool_dir`.
    pub fn new(node: &str, spool_dir: &Path, settings: Settings) -> std::io::Result<Meter> {
        std::fs::create_dir_all(spool_dir)?;
        let spool = spool_dir.join(format!("usage-{node}.jsonl"));
        let spool_rows = std::fs::read_to_string(&spool)
            .map(|s| s.lines().count())
            .unwrap_or(0);
        // A spool found 80 % full (the worker restarted during an outage)
        // still owes its alert.
        let warned_full = spool_rows * 5 >= settings.spool_max_rows * 4 && spool_rows > 0;
        Ok(Meter {
            node: node.to_string(),
            spool,
            settings,
            known: HashMap::new(),
            spool_rows,
            warned_full,
        })
    }

    /// Rows waiting in the spool.
    pub fn spooled(&self) -> usize {
        self.spool_rows
    }

    /// One pass at time `now`: flush the spool if the database is back,
    /// then meter every due interval.
    pub async fn pass(
        &mut self,
        pool: &PgPool,
        backend: &Arc<dyn GpuBackend>,
        now: OffsetDateTime,
    ) -> anyhow::Result<Pass> {
        let mut out = Pass::default();
        if self.spool_rows > 0 {
            match self.flush(pool).await {
                Ok(n) => out.flushed = n,
                Err(e) => {
                    tracing::warn!(node = %self.node, error = %e, "usage spool not flushed yet")
                }
            }
        }
        let reachable = match db::usage::to_meter(pool, &self.node).await {
            Ok(list) => {
                self.known = list.into_iter().map(|b| (b.id, b)).collect();
                self.spool_rows == 0
            }
            Err(e) => {
                tracing::warn!(node = %self.node, error = %e, "database unreachable; metering into the spool");
                false
            }
        };
        let rows = self.due_rows(backend, now).await;
        if rows.is_empty() {
            return Ok(out);
        }
        if reachable {
            match self.write(pool, &rows).await {
                Ok(()) => {
                    out.written = rows.len();
                    self.advance(&rows);
                    return Ok(out);
                }
                Err(e) => {
                    tracing::warn!(node = %self.node, error = %e, "usage write failed; spooling")
                }
            }
        }
        out.spooled = self.spool_append(&rows)?;
        self.advance(&rows[..out.spooled]);
        Ok(out)
    }

    async fn due_rows(&self, backend: &Arc<dyn GpuBackend>, now: OffsetDateTime) -> Vec<UsageRow> {
        let step = self.settings.interval_secs;
        let mut rows = Vec::new();
        for b in self.known.values() {
            let due = usage::due_intervals(
                b.start.unix_timestamp(),
                b.end.unix_timestamp(),
                b.metered_until.map(|t| t.unix_timestamp()),
                now.unix_timestamp(),
                step,
            );
            let Some(&last) = due.last() else {
                continue;
            };
            // Measured values only for the interval that just ended; older
            // ones (a catch-up after a restart) have none to give.
            let measured = if now.unix_timestamp() - last.1 < step {
                self.measure(backend, b).await
            } else {
                (None, None)
            };
            // A share's achieved part of the GPU, if the scheduler said it
            // within the last interval.
            let achieved = (b.kind == "timeslice")
                .then_some(())
                .and(b.achieved_pct.zip(b.achieved_at))
                .filter(|(_, at)| now.unix_timestamp() - at <= step.max(10))
                .map(|(pct, _)| {
                    f64::from(crate::domain::booking::SLICES_PER_GPU) * pct.clamp(0.0, 100.0)
                        / 100.0
                });
            for (i, w) in due.iter().enumerate() {
                let last = i + 1 == due.len();
                let slices = match achieved {
                    Some(s) if last => s,
                    _ => f64::from(b.compute_slices),
                };
                let mut r = usage::usage_of(b.id, *w, slices, f64::from(b.memory_gib));
                if last {
                    r.utilization_pct = measured.0;
                    r.memory_used_mib = measured.1;
                }
                rows.push(r);
            }
        }
        rows.sort_by_key(|r| (r.booking_id, r.start));
        rows
    }

    /// Utilisation and memory in use, where the hardware reports them: the
    /// device's processes for MIG, the GPU's telemetry for a share.
    async fn measure(
        &self,
        backend: &Arc<dyn GpuBackend>,
        b: &ToMeter,
    ) -> (Option<f32>, Option<i64>) {
        let (be, kind, device, gpu) = (
            backend.clone(),
            b.kind.clone(),
            b.device_uuid.clone(),
            b.gpu_uuid.clone(),
        );
        tokio::task::spawn_blocking(move || {
            if kind == "mig" {
                let mem = be
                    .processes(&device)
                    .ok()
                    .map(|ps| ps.iter().map(|p| p.used_memory_mib as i64).sum());
                (None, mem)
            } else {
                match be.telemetry(&gpu) {
                    Ok(t) => (
                        t.utilization_pct.map(|u| u as f32),
                        Some(t.memory_used_mib as i64),
                    ),
                    Err(_) => (None, None),
                }
            }
        })
        .await
        .unwrap_or((None, None))
    }

    fn advance(&mut self, rows: &[UsageRow]) {
        for r in rows {
            if let Some(b) = self.known.get_mut(&r.booking_id) {
                let end = OffsetDateTime::from_unix_timestamp(r.end).ok();
                if end > b.metered_until {
                    b.metered_until = end;
                }
            }
        }
    }

    async fn write(&self, pool: &PgPool, rows: &[UsageRow]) -> sqlx::Result<()> {
        let mut tx = pool.begin().await?;
        db::usage::record(&mut tx, rows).await?;
        tx.commit().await
    }

    /// Appends what fits into the spool (fsynced); returns how many rows.
    fn spool_append(&mut self, rows: &[UsageRow]) -> anyhow::Result<usize> {
        let room = self.settings.spool_max_rows.saturating_sub(self.spool_rows);
        let take = rows.len().min(room);
        if take < rows.len() {
            // The rest is not lost: slice- and GiB-seconds follow from the
            // booking and are metered again once the database is back; only
            // the measured values of those intervals are.
            tracing::error!(node = %self.node, spool = %self.spool.display(),
                            "usage spool is full; later intervals wait for the database");
        }
        if take == 0 {
            return Ok(0);
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spool)?;
        let mut buf = Vec::new();
        for r in &rows[..take] {
            serde_json::to_writer(&mut buf, r)?;
            buf.push(b'\n');
        }
        f.write_all(&buf)?;
        f.sync_all()?;
        self.spool_rows += take;
        if self.spool_rows * 5 >= self.settings.spool_max_rows * 4 && !self.warned_full {
            self.warned_full = true;
            tracing::error!(node = %self.node, rows = self.spool_rows, max = self.settings.spool_max_rows,
                            "usage spool is 80 % full while the database is unreachable");
        }
        Ok(take)
    }

    /// Writes the spool to the database and empties it. A crash between
    /// the write and the removal writes it again later: a no-op.
    async fn flush(&mut self, pool: &PgPool) -> anyhow::Result<usize> {
        let text = std::fs::read_to_string(&self.spool)?;
        let rows: Vec<UsageRow> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let mut tx = pool.begin().await?;
        for chunk in rows.chunks(5_000) {
            db::usage::record(&mut tx, chunk).await?;
        }
        // The spool's peak, as a share of its room, against the rule.
        let pct = rows.len() as f64 * 100.0 / self.settings.spool_max_rows.max(1) as f64;
        crate::watch::raise_past(
            &mut tx,
            "metering_spool_full",
            &crate::domain::alerts::Subject {
                node: Some(self.node.clone()),
                ..Default::default()
            },
            pct,
            &format!(
                "the usage spool of {} reached {pct:.0} % of its {} rows while PostgreSQL was unreachable",
                self.node, self.settings.spool_max_rows
            ),
        )
        .await?;
        tx.commit().await?;
        std::fs::remove_file(&self.spool)?;
        self.spool_rows = 0;
        self.warned_full = false;
        tracing::info!(node = %self.node, rows = rows.len(), "usage spool written to the database");
        Ok(rows.len())
    }
}

/// Meters the node every tick until the task is dropped.
pub async fn run(
    pool: PgPool,
    node: String,
    backend: Arc<dyn GpuBackend>,
    spool_dir: PathBuf,
    settings: Settings,
) {
    let tick = settings.tick;
    let mut meter = match Meter::new(&node, &spool_dir, settings) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(node = %node, error = %e, dir = %spool_dir.display(), "cannot open the usage spool; metering is off");
            return;
        }
    };
    let mut t = tokio::time::interval(tick);
    loop {
        t.tick().await;
        if let Err(e) = meter.pass(&pool, &backend, OffsetDateTime::now_utc()).await {
            tracing::warn!(node = %node, error = format!("{e:#}"), "metering pass failed");
        }
    }
}
