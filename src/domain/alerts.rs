//! Alerts: their rules, severities and lifecycle, and the one pure step
//! that turns what the fleet looks like now into alert changes.
//!
//! An alert is `pending` while its condition holds but not yet for the
//! rule's duration, `firing` once it has, and `resolved` when the
//! condition no longer holds. There is at most one open (pending or
//! firing) alert per rule and subject, so a condition that persists is one
//! alert, not a flood; the database holds that with a unique index.

use time::OffsetDateTime;

text_enum! {
    /// How bad an alert is. `high` is the security monitor's.
    pub enum Severity {
        Info = "info",
        Warning = "warning",
        Critical = "critical",
        High = "high",
    }
}

text_enum! {
    /// Where an alert is in its life.
    pub enum AlertState {
        Pending = "pending",
        Firing = "firing",
        Resolved = "resolved",
    }
}

/// The default rules (names are a contract; thresholds are admins' to edit).
pub const RULES: [&str; 10] = [
    "gpu_temperature_high",
    "gpu_utilization_high",
    "instance_memory_near_limit",
    "gpu_xid_error",
    "gpu_ecc_uncorrectable",
    "gpu_lost",
    "node_heartbeat_stale",
    "metering_spool_full",
    "database_restarted",
    "security_incident",
];

/// What an alert is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize, utoipa::ToSchema)]
pub struct Subject {
    pub node: Option<String>,
    pub gpu_uuid: Option<String>,
    pub booking_id: Option<i64>,
}

/// A rule as configured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Rule {
    pub name: String,
    pub description: String,
    pub threshold: f64,
    pub for_secs: i32,
    pub severity: Severity,
    pub enabled: bool,
}

/// A change to a rule's settings, as typed in a form or on the command
/// line; `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub struct RuleEdit {
    pub threshold: Option<String>,
    pub for_secs: Option<String>,
    pub severity: Option<String>,
    pub enabled: Option<bool>,
}

impl Rule {
    /// How long the condition must hold before the alert fires. For an
    /// event rule (`gpu_xid_error`) the duration is the window events are
    /// counted in instead, and the alert fires at the first one.
    pub fn pending_secs(&self) -> i32 {
        if self.name == "gpu_xid_error" {
            0
        } else {
            self.for_secs
        }
    }

    /// The rule with `edit` applied, or one message per bad field.
    pub fn edited(&self, edit: &RuleEdit) -> Result<Rule, Vec<(&'static str, String)>> {
        let mut out = self.clone();
        let mut errors = Vec::new();
        if let Some(t) = &edit.threshold {
            match t.trim().parse::<f64>() {
                Ok(v) if v.is_finite() && v.abs() <= 1e9 => out.threshold = v,
                _ => errors.push((
                    "threshold",
                    format!("threshold: \"{}\" is not a number", t.trim()),
                )),
            }
        }
        if let Some(f) = &edit.for_secs {
            match f.trim().parse::<i32>() {
                Ok(v) if (0..=604_800).contains(&v) => out.for_secs = v,
                _ => errors.push((
                    "for_secs",
                    "duration: give whole seconds from 0 to 604800 (a week)".to_string(),
                )),
            }
        }
        if let Some(s) = &edit.severity {
            match Severity::named(s.trim()) {
                Some(v) => out.severity = v,
                None => errors.push((
                    "severity",
                    format!(
                        "severity: \"{}\" is not one of info, warning, critical, high",
                        s.trim()
                    ),
                )),
            }
        }
        if let Some(e) = edit.enabled {
            out.enabled = e;
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(errors)
        }
    }
}

/// What one rule saw of one subject now: its value and whether that
/// breaks the rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub subject: Subject,
    pub value: f64,
    pub breach: bool,
    pub message: String,
}

/// An open alert of the rule, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Open {
    pub id: i64,
    pub subject: Subject,
    pub state: AlertState,
    pub started_at: OffsetDateTime,
}

/// A change to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A new alert: pending, or firing at once when the rule has no duration.
    Open {
        subject: Subject,
        value: f64,
        message: String,
        firing: bool,
    },
    /// A pending alert has held for the duration.
    Fire {
        id: i64,
        value: f64,
        message: String,
    },
    /// Still open; the value moved.
    Update { id: i64, value: f64 },
    /// A firing alert whose condition cleared.
    Resolve { id: i64, value: f64 },
    /// A pending alert whose condition cleared before it fired: forgotten,
    /// as Prometheus forgets it.
    Drop { id: i64 },
}

/// One evaluation of `rule`: `seen` is what the rule observed now,
/// `open` its open alerts. A subject the rule did not observe keeps its
/// alert as it is (a silent node is `node_heartbeat_stale`'s business,
/// not a reason to call its GPUs cool). A disabled rule resolves
/// everything it had open.
pub fn evaluate(
    rule: &Rule,
    now: OffsetDateTime,
    seen: &[Observation],
    open: &[Open],
) -> Vec<Change> {
    let mut out = Vec::new();
    for o in seen {
        let current = open.iter().find(|a| a.subject == o.subject);
        let breach = o.breach && rule.enabled;
        match (current, breach) {
            (None, true) => out.push(Change::Open {
                subject: o.subject.clone(),
                value: o.value,
                message: o.message.clone(),
                firing: rule.pending_secs() == 0,
            }),
            (None, false) => {}
            (Some(a), true) => {
                let held = (now - a.started_at).as_seconds_f64();
                if a.state == AlertState::Pending && held >= f64::from(rule.pending_secs()) {
                    out.push(Change::Fire {
                        id: a.id,
                        value: o.value,
                        message: o.message.clone(),
                    });
                } else {
                    out.push(Change::Update {
                        id: a.id,
                        value: o.value,
                    });
                }
            }
            (Some(a), false) => out.push(match a.state {
                AlertState::Pending => Change::Drop { id: a.id },
                _ => Change::Resolve {
                    id: a.id,
                    value: o.value,
                },
            }),
        }
    }
    if !rule.enabled {
        for a in open {
            if !out.iter().any(
                |c| matches!(c, Change::Drop { id } | Change::Resolve { id, .. } if *id == a.id),
            ) {
                out.push(match a.state {
                    AlertState::Pending => Change::Drop { id: a.id },
                    _ => Change::Resolve {
                        id: a.id,
                        value: 0.0,
                    },
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::Duration;

    fn rule(for_secs: i32) -> Rule {
        Rule {
            name: "gpu_temperature_high".into(),
            description: String::new(),
            threshold: 85.0,
            for_secs,
            severity: Severity::Critical,
            enabled: true,
        }
    }

    fn gpu(n: &str) -> Subject {
        Subject {
            node: Some("n".into()),
            gpu_uuid: Some(n.into()),
            booking_id: None,
        }
    }

    fn seen(s: &str, value: f64) -> Observation {
        Observation {
            subject: gpu(s),
            value,
            breach: value > 85.0,
            message: format!("{value}"),
        }
    }

    #[test]
    fn pending_then_firing_then_resolved() {
        let r = rule(60);
        let t0 = OffsetDateTime::now_utc();
        let c = evaluate(&r, t0, &[seen("a", 92.0)], &[]);
        assert!(matches!(&c[..], [Change::Open { firing: false, .. }]));
        let open = [Open {
            id: 1,
            subject: gpu("a"),
            state: AlertState::Pending,
            started_at: t0,
        }];
        let c = evaluate(&r, t0 + Duration::seconds(30), &[seen("a", 93.0)], &open);
        assert_eq!(c, vec![Change::Update { id: 1, value: 93.0 }]);
        let c = evaluate(&r, t0 + Duration::seconds(60), &[seen("a", 93.0)], &open);
        assert!(matches!(&c[..], [Change::Fire { id: 1, .. }]));
        let firing = [Open {
            state: AlertState::Firing,
            ..open[0].clone()
        }];
        let c = evaluate(&r, t0 + Duration::seconds(90), &[seen("a", 70.0)], &firing);
        assert_eq!(c, vec![Change::Resolve { id: 1, value: 70.0 }]);
    }

    #[test]
    fn a_pending_alert_that_clears_is_dropped_and_unseen_subjects_keep_theirs() {
        let r = rule(60);
        let t0 = OffsetDateTime::now_utc();
        let open = [
            Open {
                id: 1,
                subject: gpu("a"),
                state: AlertState::Pending,
                started_at: t0,
            },
            Open {
                id: 2,
                subject: gpu("b"),
                state: AlertState::Firing,
                started_at: t0,
            },
        ];
        let c = evaluate(&r, t0, &[seen("a", 50.0)], &open);
        assert_eq!(c, vec![Change::Drop { id: 1 }]);
    }

    #[test]
    fn no_duration_fires_at_once_and_a_disabled_rule_resolves_all() {
        let c = evaluate(&rule(0), OffsetDateTime::now_utc(), &[seen("a", 99.0)], &[]);
        assert!(matches!(&c[..], [Change::Open { firing: true, .. }]));
        let mut off = rule(0);
        off.enabled = false;
        let open = [Open {
            id: 7,
            subject: gpu("z"),
            state: AlertState::Firing,
            started_at: OffsetDateTime::now_utc(),
        }];
        let c = evaluate(&off, OffsetDateTime::now_utc(), &[seen("a", 99.0)], &open);
        assert_eq!(c, vec![Change::Resolve { id: 7, value: 0.0 }]);
    }
}
