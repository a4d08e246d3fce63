//! `gpuslice alert rules` and `gpuslice alert rule NAME ...`: the alert
//! rules on the command line, audited like the form.

use anyhow::{anyhow, bail, Result};
use serde_json::json;
use sqlx::PgPool;

use super::args::AlertCommand;
use crate::db;
use crate::domain::alerts::RuleEdit;

pub async fn alert(pool: &PgPool, cmd: &AlertCommand) -> Result<String> {
    match cmd {
        AlertCommand::Rules => {
            let mut out = format!(
                "{:<28} {:>10} {:>8} {:<9} {}\n",
                "RULE", "THRESHOLD", "FOR (s)", "SEVERITY", "ON"
            );
            for r in db::alerts::rules(pool).await? {
                out.push_str(&format!(
                    "{:<28} {:>10} {:>8} {:<9} {}\n",
                    r.name,
                    r.threshold,
                    r.for_secs,
                    r.severity.as_str(),
                    if r.enabled { "yes" } else { "no" }
                ));
            }
            Ok(out)
        }
        AlertCommand::Rule {
            name,
            threshold,
            for_secs,
            severity,
            enable,
            disable,
        } => {
            let rule = db::alerts::rule(pool, name.trim()).await?.ok_or_else(|| {
                anyhow!(
                    "there is no alert rule named \"{}\" (see gpuslice alert rules)",
                    name.trim()
                )
            })?;
            let edit = RuleEdit {
                threshold: threshold.clone(),
                for_secs: for_secs.clone(),
                severity: severity.clone(),
                enabled: if *enable {
                    Some(true)
                } else if *disable {
                    Some(false)
                } else {
                    None
                },
            };
            let new = rule.edited(&edit).map_err(|errs| {
                anyhow!(errs.into_iter().map(|e| e.1).collect::<Vec<_>>().join("; "))
            })?;
            if new == rule {
                bail!("nothing to change: give --threshold, --for-secs, --severity, --enable or --disable");
            }
            let mut tx = pool.begin().await?;
            db::alerts::update_rule(&mut *tx, &new).await?;
            db::audit::record(
                &mut *tx,
                &db::audit::Actor::cli(),
                "alert_rule.update",
                &new.name,
                json!({"before": rule, "after": new}),
            )
            .await?;
            tx.commit().await?;
            Ok(format!(
                "{}: above {} for {} s, {}, {}",
                new.name,
                new.threshold,
                new.for_secs,
                new.severity.as_str(),
                if new.enabled { "on" } else { "off" }
            ))
        }
    }
}
