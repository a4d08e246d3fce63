//! Watching the fleet: the alert rules evaluated over the latest
//! telemetry, the retention of the samples, and (in
//! [`notifier`]) the sending of notifications.
//!
//! The watcher runs in every process that serves or drives GPUs; one
//! evaluation at a time holds an advisory lock, so several processes
//! neither double alerts (the unique index would refuse them anyway)
//! nor race on the same alert. A node that stops reporting cannot raise
//! its own alert, which is why this runs beside the web application too.

pub mod idle;
pub mod notifier;
pub mod optimizer;
pub mod security;

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};
use time::OffsetDateTime;

use crate::db;
use crate::db::notify::Message;
use crate::domain::alerts::{evaluate, Change, Observation, Rule, Severity, Subject};

/// How the watcher runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often rules are evaluated (the telemetry interval).
    pub every: Duration,
    /// How often the retention runs.
    pub prune_every: Duration,
    pub retention: db::telemetry::Retention,
    /// Months of usage rows kept (0: all).
    pub usage_retention_months: i32,
    /// Idle reclaim: a device under this utilisation (%) without processes
    /// is idle.
    pub idle_threshold_pct: f32,
    /// The optimizer lowers quiet shares to low priority (and restores them).
    pub lower_idle_shares: bool,
}

impl Settings {
    pub fn new(telemetry_interval_secs: u64) -> Settings {
        Settings {
            every: Duration::from_secs(telemetry_interval_secs.max(1)),
            prune_every: Duration::from_secs(60),
            retention: db::telemetry::Retention::default(),
            usage_retention_months: 13,
            idle_threshold_pct: 5.0,
            lower_idle_shares: false,
        }
    }
}

/// Evaluates the rules every `settings.every` and applies the retention
/// every `settings.prune_every`, until the task is dropped.
pub async fn run(pool: PgPool, settings: Settings) {
    let mut tick = tokio::time::interval(settings.every);
    let mut last_prune = std::time::Instant::now() - settings.prune_every;
    loop {
        tick.tick().await;
        if let Err(e) = evaluate_all(&pool, settings.every.as_secs_f64()).await {
            tracing::warn!(error = format!("{e:#}"), "alert evaluation failed");
        }
        // A sample counts for idle reclaim while no two newer ones are missing.
        let fresh = (3.0 * settings.every.as_secs_f64()).max(30.0);
        match idle::round(&pool, settings.idle_threshold_pct, fresh).await {
            Ok(r) if r != idle::Round::default() => tracing::info!(?r, "idle reclaim"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = format!("{e:#}"), "idle reclaim failed"),
        }
        if last_prune.elapsed() >= settings.prune_every {
            if settings.lower_idle_shares {
                match optimizer::round(&pool).await {
                    Ok((0, 0)) => {}
                    Ok((lowered, restored)) => {
                        tracing::info!(lowered, restored, "optimizer: share priorities")
                    }
                    Err(e) => tracing::warn!(error = format!("{e:#}"), "optimizer round failed"),
                }
            }
            last_prune = std::time::Instant::now();
            match db::telemetry::prune(&pool, settings.retention).await {
                Ok(n) if n > 0 => tracing::debug!(deleted = n, "telemetry retention"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "telemetry retention failed"),
            }
            match db::usage::maintain(&pool, settings.usage_retention_months).await {
                Ok(n) if n > 0 => {
                    tracing::info!(dropped = n, "usage retention: monthly partitions dropped")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "usage partitions failed"),
            }
            match db::bookings::trim_changes(&pool).await {
                Ok(n) if n > 0 => tracing::debug!(deleted = n, "placement change log trimmed"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "placement change log trim failed"),
            }
        }
    }
}

/// A GPU's value for a rule, from its latest sample.
type ValueOf = fn(&db::telemetry::Latest) -> Option<f64>;

fn gpu_subject(node: &str, uuid: &str) -> Subject {
    Subject {
        node: Some(node.to_string()),
        gpu_uuid: Some(uuid.to_string()),
        booking_id: None,
    }
}

/// What each rule sees now. `interval_secs` is the sampling interval: a
/// sample older than [`db::telemetry::fresh_secs`] of it says nothing about now.
async fn observe(
    tx: &mut Transaction<'_, Postgres>,
    rules: &[Rule],
    interval_secs: f64,
) -> anyhow::Result<HashMap<String, Vec<Observation>>> {
    let fresh = db::telemetry::fresh_secs(interval_secs);
    let latest = db::telemetry::latest(&mut **tx, fresh).await?;
    let mut out: HashMap<String, Vec<Observation>> = HashMap::new();
    let threshold = |name: &str| {
        rules
            .iter()
            .find(|r| r.name == name)
            .map(|r| (r.threshold, r.for_secs))
    };
    let gpu_name = |l: &db::telemetry::Latest| format!("{} GPU {} ({})", l.node, l.idx, l.model);
    // The three value rules of an answering GPU: a fresh sample without
    // the value (no whole-GPU utilisation in MIG mode) clears the alert.
    let value_rules: [(&str, ValueOf, &str); 3] = [
        (
            "gpu_temperature_high",
            |l| l.temperature_c.map(f64::from),
            "is at {v} °C (above {t} °C)",
        ),
        (
            "gpu_utilization_high",
            |l| l.utilization_pct.map(f64::from),
            "is {v} % busy (above {t} %)",
        ),
        (
            "gpu_ecc_uncorrectable",
            |l| Some(l.ecc_uncorrectable.unwrap_or(0) as f64),
            "has {v} uncorrectable ECC errors since its last reset: drain it and reset it",
        ),
    ];
    for (rule, value, says) in value_rules {
        let Some((t, _)) = threshold(rule) else {
            continue;
        };
        let seen = latest
            .iter()
            .filter(|l| !l.lost)
            .map(|l| {
                let v = value(l);
                Observation {
                    subject: gpu_subject(&l.node, &l.uuid),
                    value: v.unwrap_or(0.0),
                    breach: v.is_some_and(|v| v > t),
                    message: format!(
                        "{} {}",
                        gpu_name(l),
                        says.replace("{v}", &format!("{:.0}", v.unwrap_or(0.0)))
                            .replace("{t}", &format!("{t:.0}"))
                    ),
                }
            })
            .collect();
        out.insert(rule.to_string(), seen);
    }
    if threshold("gpu_lost").is_some() {
        out.insert(
            "gpu_lost".into(),
            latest
                .iter()
                .map(|l| Observation {
                    subject: gpu_subject(&l.node, &l.uuid),
                    value: if l.lost { 1.0 } else { 0.0 },
                    breach: l.lost,
                    message: format!("{} has fallen off the bus (lost)", gpu_name(l)),
                })
                .collect(),
        );
    }
    if let Some((t, window)) = threshold("gpu_xid_error") {
        let counts = db::telemetry::xid_counts(&mut **tx, f64::from(window.max(1))).await?;
        out.insert(
            "gpu_xid_error".into(),
            latest
                .iter()
                .map(|l| {
                    let (n, last) = counts
                        .iter()
                        .find(|c| c.0 == l.gpu_id)
                        .map(|c| (c.1, c.2))
                        .unwrap_or((0, 0));
                    Observation {
                        subject: gpu_subject(&l.node, &l.uuid),
                        value: last as f64,
                        breach: n as f64 > t,
                        message: format!(
                            "{} reported XID {last} ({n} XID errors in the last {window} s)",
                            gpu_name(l)
                        ),
                    }
                })
                .collect(),
        );
    }
    if let Some((t, _)) = threshold("instance_memory_near_limit") {
        let held = db::telemetry::latest_bookings(&mut **tx, fresh).await?;
        let mut seen: Vec<Observation> = held
            .iter()
            .filter(|b| b.memory_limit_mib > 0)
            .map(|b| {
                let pct = b.memory_used_mib as f64 * 100.0 / b.memory_limit_mib as f64;
                Observation {
                    subject: Subject {
                        node: Some(b.node.clone()),
                        gpu_uuid: Some(b.gpu_uuid.clone()),
                        booking_id: Some(b.booking_id),
                    },
                    value: pct,
                    breach: pct >= t,
                    message: format!(
                        "booking #{} uses {} of its {} MiB of GPU memory ({pct:.0} %); it will fail to allocate soon",
                        b.booking_id, b.memory_used_mib, b.memory_limit_mib
                    ),
                }
            })
            .collect();
        // Alerts of bookings that ended resolve with them.
        let ended = db::telemetry::ended_with_open_memory_alerts(&mut **tx).await?;
        seen.extend(
            ended
                .into_iter()
                .map(|(node, gpu_uuid, booking_id)| Observation {
                    subject: Subject {
                        node,
                        gpu_uuid,
                        booking_id,
                    },
                    value: 0.0,
                    breach: false,
                    message: "the booking ended".into(),
                }),
        );
        out.insert("instance_memory_near_limit".into(), seen);
    }
    if let Some((t, _)) = threshold("node_heartbeat_stale") {
        out.insert(
            "node_heartbeat_stale".into(),
            db::alerts::node_ages(&mut **tx)
                .await?
                .into_iter()
                .map(|(node, age)| Observation {
                    subject: Subject {
                        node: Some(node.clone()),
                        ..Default::default()
                    },
                    value: age,
                    breach: age > t,
                    message: format!(
                        "node {node} has not reported for {age:.0} s: is its worker running?"
                    ),
                })
                .collect(),
        );
    }
    Ok(out)
}

/// Evaluates every rule once. Returns the number of changes made (0 when
/// another process holds the evaluation).
pub async fn evaluate_all(pool: &PgPool, interval_secs: f64) -> anyhow::Result<usize> {
    let mut tx = pool.begin().await?;
    if !db::alerts::try_evaluation_lock(&mut tx).await? {
        return Ok(0);
    }
    let rules = db::alerts::rules(&mut *tx).await?;
    let seen = observe(&mut tx, &rules, interval_secs).await?;
    let now = db::alerts::now(&mut tx).await?;
    let mut changes = 0;
    for rule in &rules {
        let Some(obs) = seen.get(&rule.name) else {
            continue;
        };
        let open = db::alerts::open_of(&mut tx, &rule.name).await?;
        for change in evaluate(rule, now, obs, &open) {
            changes += 1;
            apply(&mut tx, rule, change).await?;
        }
    }
    tx.commit().await?;
    Ok(changes)
}

async fn apply(
    tx: &mut Transaction<'_, Postgres>,
    rule: &Rule,
    change: Change,
) -> anyhow::Result<()> {
    match change {
        Change::Open {
            subject,
            value,
            message,
            firing,
        } => {
            if let Some(id) = db::alerts::open(tx, rule, &subject, value, &message, firing).await? {
                if firing {
                    announce(tx, rule, id, &subject, &message, true).await?;
                }
            }
        }
        Change::Fire { id, value, message } => {
            if db::alerts::fire(tx, id, value, &message).await? {
                let subject = db::alerts::get(&mut **tx, id)
                    .await?
                    .map(|a| a.subject())
                    .unwrap_or_default();
                announce(tx, rule, id, &subject, &message, true).await?;
            }
        }
        Change::Update { id, value } => db::alerts::update_value(tx, id, value).await?,
        Change::Resolve { id, value } => {
            if db::alerts::resolve(tx, id, value).await? {
                if let Some(a) = db::alerts::get(&mut **tx, id).await? {
                    let msg = format!("resolved: {}", a.message);
                    announce(tx, rule, id, &a.subject(), &msg, false).await?;
                }
            }
        }
        Change::Drop { id } => db::alerts::drop_pending(tx, id).await?,
    }
    Ok(())
}

/// Queues the notifications of an alert that fired (or resolved): the
/// webhook hears of every change; admins get critical ones by e-mail; a
/// booking's owner gets those of their booking. Silenced alerts stay quiet.
async fn announce(
    tx: &mut Transaction<'_, Postgres>,
    rule: &Rule,
    id: i64,
    subject: &Subject,
    message: &str,
    firing: bool,
) -> anyhow::Result<()> {
    // Silenced, or the same rule and subject already told people in the
    // last ten minutes (a flapping condition): stay quiet.
    if db::alerts::quiet(&mut **tx, id, firing).await? {
        return Ok(());
    }
    let mark = if firing { "FIRING" } else { "RESOLVED" };
    let where_ = subject
        .node
        .as_deref()
        .map(|n| format!(" on {n}"))
        .unwrap_or_default();
    let title = format!(
        "[gpuslice] {mark} {} {}{where_}",
        rule.severity.as_str().to_uppercase(),
        rule.name
    );
    let body = format!(
        "{message}\n\nRule: {} ({})\nAlert #{id}; see /admin/alerts and the GPU's page.\n",
        rule.name, rule.description
    );
    let m = Message {
        topic: "alert",
        subject: &title,
        body: &body,
        alert_id: Some(id),
        booking_id: subject.booking_id,
    };
    db::notify::webhook(tx, &m).await?;
    if !firing {
        return Ok(());
    }
    if matches!(rule.severity, Severity::Critical | Severity::High) {
        db::notify::email_admins(
            tx,
            &Message {
                topic: "alert_critical",
                ..m
            },
        )
        .await?;
    }
    if let Some(b) = subject.booking_id {
        let owner = db::notify::owner_of(&mut **tx, b).await?;
        db::notify::email_user(
            tx,
            owner,
            &Message {
                topic: "booking_alert",
                ..m
            },
        )
        .await?;
    }
    Ok(())
}

/// Records an alert about something that happened while it could not be
/// recorded (`metering_spool_full`), if the rule is on and `value` reaches
/// its threshold, and announces it.
pub async fn raise_past(
    tx: &mut Transaction<'_, Postgres>,
    rule: &str,
    subject: &Subject,
    value: f64,
    message: &str,
) -> anyhow::Result<()> {
    let Some(rule) = db::alerts::rule(&mut **tx, rule).await? else {
        return Ok(());
    };
    if !rule.enabled || value < rule.threshold {
        return Ok(());
    }
    let id = db::alerts::record_past(
        tx,
        &rule,
        subject,
        value,
        message,
        OffsetDateTime::now_utc(),
    )
    .await?;
    announce(tx, &rule, id, subject, message, true).await
}
