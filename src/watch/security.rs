//! The security monitor (the design source's `SecurityMonitor`): detectors
//! around the system report evidence against a suspect (a booking, an
//! account, an address, a Unix account on a node, a device); each adds
//! to the suspect's open incident, and at the `security_incident` rule's
//! threshold (5 by default, editable with the other alert rules) a HIGH
//! alert fires with the evidence. Admins close incidents with a note on
//! `/admin/security`. Reporting never fails the caller: a detector that
//! cannot write logs and goes on.

use sqlx::PgPool;

use crate::db;
use crate::domain::alerts::Subject;
use crate::domain::security::{Detector, Suspect};

/// The alert rule an incident raises.
pub const RULE: &str = "security_incident";

/// One piece of evidence.
#[derive(Debug, Clone)]
pub struct Report {
    pub suspect: Suspect,
    pub booking_id: Option<i64>,
    pub user_id: Option<i64>,
    pub node: Option<String>,
    pub detector: Detector,
    pub detail: String,
}

impl Report {
    pub fn new(suspect: Suspect, detector: Detector, detail: impl Into<String>) -> Report {
        Report {
            booking_id: match &suspect {
                Suspect::Booking(id) => Some(*id),
                _ => None,
            },
            user_id: match &suspect {
                Suspect::Account(id) => Some(*id),
                _ => None,
            },
            node: match &suspect {
                Suspect::Uid { node, .. } => Some(node.clone()),
                _ => None,
            },
            suspect,
            detector,
            detail: detail.into(),
        }
    }

    pub fn on_node(mut self, node: &str) -> Report {
        self.node = Some(node.to_string());
        self
    }

    pub fn by_user(mut self, user: Option<i64>) -> Report {
        self.user_id = self.user_id.or(user);
        self
    }
}

/// What a report led to.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub incident_id: i64,
    pub score: i32,
    /// The incident has reached the threshold (now or before).
    pub alerting: bool,
}

/// Records the evidence and raises the alert at the threshold. Errors are
/// logged; `None` then.
pub async fn report(pool: &PgPool, r: Report) -> Option<Outcome> {
    match try_report(pool, &r).await {
        Ok(o) => Some(o),
        Err(e) => {
            tracing::warn!(subject = %r.suspect.key(), detector = r.detector.as_str(), error = format!("{e:#}"), "cannot record security evidence");
            None
        }
    }
}

/// Records the evidence in the background (a web request does not wait
/// for the monitor).
pub fn report_later(pool: &PgPool, r: Report) {
    let pool = pool.clone();
    tokio::spawn(async move {
        report(&pool, r).await;
    });
}

async fn try_report(pool: &PgPool, r: &Report) -> anyhow::Result<Outcome> {
    tracing::warn!(subject = %r.suspect.key(), detector = r.detector.as_str(), detail = %r.detail, "security evidence");
    let mut tx = pool.begin().await?;
    let key = r.suspect.key();
    let added = db::security::add(
        &mut tx,
        &key,
        r.booking_id,
        r.user_id,
        r.node.as_deref(),
        r.detector,
        &r.detail,
    )
    .await?;
    let rule = db::alerts::rule(&mut *tx, RULE)
        .await?
        .filter(|rule| rule.enabled);
    let mut alerting = added.alert_id.is_some();
    if let Some(rule) = rule {
        if added.alert_id.is_none() && f64::from(added.score) >= rule.threshold {
            let subject = Subject {
                node: r.node.clone(),
                gpu_uuid: match &r.suspect {
                    Suspect::Device(uuid) => Some(uuid.clone()),
                    _ => None,
                },
                booking_id: r.booking_id,
            };
            let message = format!(
                "security incident #{} on {key}: suspicion {} reached {}; latest: {} ({}). See /admin/security",
                added.incident_id,
                added.score,
                rule.threshold,
                r.detail,
                r.detector.label()
            );
            let id = match db::alerts::open(
                &mut tx,
                &rule,
                &subject,
                f64::from(added.score),
                &message,
                true,
            )
            .await?
            {
                Some(id) => {
                    super::announce(&mut tx, &rule, id, &subject, &message, true).await?;
                    id
                }
                // Another incident with the same alert subject (an account
                // and an address have none) is already alerting: this one
                // joins its alert.
                None => {
                    let open = db::alerts::open_of(&mut tx, RULE).await?;
                    let Some(o) = open.into_iter().find(|o| o.subject == subject) else {
                        anyhow::bail!("the open security alert vanished");
                    };
                    db::alerts::update_value(&mut tx, o.id, f64::from(added.score)).await?;
                    o.id
                }
            };
            db::security::set_alert(&mut tx, added.incident_id, id).await?;
            alerting = true;
        }
    }
    tx.commit().await?;
    Ok(Outcome {
        incident_id: added.incident_id,
        score: added.score,
        alerting,
    })
}

/// Records what a node did by itself (in the incident and the audit log).
pub async fn responded(pool: &PgPool, incident: i64, node: &str, action: &str, detail: &str) {
    let done = async {
        let mut tx = pool.begin().await?;
        let subject = db::security::subject_of(&mut *tx, incident).await?;
        db::security::add(
            &mut tx,
            &subject,
            None,
            None,
            Some(node),
            Detector::Response,
            detail,
        )
        .await?;
        db::audit::record(
            &mut *tx,
            &db::audit::Actor::system(&format!("worker:{node}")),
            action,
            &subject,
            serde_json::json!({"incident": incident, "detail": detail}),
        )
        .await?;
        tx.commit().await?;
        anyhow::Ok(())
    };
    if let Err(e) = done.await {
        tracing::warn!(
            incident,
            error = format!("{e:#}"),
            "cannot record the security response"
        );
    }
}

/// Closes an incident with an admin's note (audited); its alert resolves
/// once no open incident shares it. `false` when it was not open.
pub async fn close(
    pool: &PgPool,
    id: i64,
    actor: &db::audit::Actor,
    note: &str,
) -> anyhow::Result<bool> {
    let mut tx = pool.begin().await?;
    let Some((alert, score)) = db::security::close(&mut tx, id, actor.user_id, note).await? else {
        return Ok(false);
    };
    if let Some(alert) = alert {
        if !db::security::alert_in_use(&mut tx, alert).await?
            && db::alerts::resolve(&mut tx, alert, f64::from(score)).await?
        {
            if let (Some(rule), Some(a)) = (
                db::alerts::rule(&mut *tx, RULE).await?,
                db::alerts::get(&mut *tx, alert).await?,
            ) {
                let msg = format!("resolved: incident #{id} closed by an admin");
                super::announce(&mut tx, &rule, alert, &a.subject(), &msg, false).await?;
            }
        }
    }
    db::audit::record(
        &mut *tx,
        actor,
        "security.close_incident",
        &format!("incident:{id}"),
        serde_json::json!({"note": note}),
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}
