//! Sends the notification outbox: e-mail over SMTP and a Slack- or
//! Mattermost-compatible webhook, with retries and backoff.
//!
//! Each notification is claimed (committed as `sending`) before it is
//! sent and marked `sent` after. A sender killed between the two leaves a
//! `sending` row; after the lease it becomes `unconfirmed` and is not
//! sent again on its own, because the message may well have left: a
//! person gets each notice once, and a lost one shows on the alerts page
//! for an admin to resend. Refusals (the server said no, the network was
//! down) are retried with exponential backoff.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use sqlx::PgPool;

use crate::db;
use crate::db::notify::Notification;

/// Attempts before a notification is given up (`failed`).
pub const MAX_ATTEMPTS: i32 = 8;

/// Where notifications go; each channel is off when its setting is unset.
#[derive(Clone)]
pub struct Channels {
    pub smtp: Option<AsyncSmtpTransport<Tokio1Executor>>,
    /// For the log and the page, without the password.
    pub smtp_label: Option<String>,
    pub from: lettre::message::Mailbox,
    pub webhook: Option<reqwest::Url>,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channels")
            .field("smtp", &self.smtp_label)
            .field("from", &self.from.to_string())
            .field(
                "webhook",
                &self.webhook.as_ref().map(|u| u.host_str().unwrap_or("")),
            )
            .finish()
    }
}

impl Channels {
    /// Checks the settings: `GPUSLICE_SMTP_URL` (`smtp://host:25`,
    /// `smtps://user:pass@host:465`, `smtp://host:587?tls=required`),
    /// `GPUSLICE_MAIL_FROM` and `GPUSLICE_ALERT_WEBHOOK_URL`.
    pub fn from_settings(
        smtp_url: Option<&str>,
        mail_from: Option<&str>,
        webhook: Option<&str>,
    ) -> Result<Channels, String> {
        let from = mail_from.unwrap_or("gpuslice <gpuslice@localhost>");
        let from: lettre::message::Mailbox = from.parse().map_err(|e| {
            format!("GPUSLICE_MAIL_FROM: \"{from}\" is not an e-mail address ({e})")
        })?;
        let (smtp, smtp_label) = match smtp_url.map(str::trim).filter(|u| !u.is_empty()) {
            None => (None, None),
            Some(u) => {
                let parsed = reqwest::Url::parse(u)
                    .map_err(|e| format!("GPUSLICE_SMTP_URL: not a URL ({e}); write smtp://host:25 or smtps://user:pass@host:465"))?;
                if !matches!(parsed.scheme(), "smtp" | "smtps") {
                    return Err(format!(
                        "GPUSLICE_SMTP_URL: the scheme must be smtp or smtps, not \"{}\"",
                        parsed.scheme()
                    ));
                }
                let tls = parsed
                    .query_pairs()
                    .any(|(k, v)| k == "tls" && (v == "required" || v == "opportunistic"));
                if parsed.scheme() == "smtp" && !parsed.username().is_empty() && !tls {
                    return Err("GPUSLICE_SMTP_URL: a password would travel in clear text; use smtps:// or add ?tls=required".into());
                }
                let t = AsyncSmtpTransport::<Tokio1Executor>::from_url(u)
                    .map_err(|e| format!("GPUSLICE_SMTP_URL: {e}"))?
                    .timeout(Some(Duration::from_secs(20)))
                    .build();
                let label = format!(
                    "{}://{}:{}",
                    parsed.scheme(),
                    parsed.host_str().unwrap_or(""),
                    parsed
                        .port()
                        .unwrap_or(if parsed.scheme() == "smtps" { 465 } else { 25 })
                );
                (Some(t), Some(label))
            }
        };
        let webhook = match webhook.map(str::trim).filter(|u| !u.is_empty()) {
            None => None,
            Some(u) => {
                let url = reqwest::Url::parse(u)
                    .map_err(|e| format!("GPUSLICE_ALERT_WEBHOOK_URL: not a URL ({e})"))?;
                if !matches!(url.scheme(), "http" | "https") {
                    return Err("GPUSLICE_ALERT_WEBHOOK_URL: give an http or https URL".into());
                }
                Some(url)
            }
        };
        Ok(Channels {
            smtp,
            smtp_label,
            from,
            webhook,
        })
    }

    pub fn any(&self) -> bool {
        self.smtp.is_some() || self.webhook.is_some()
    }
}

/// Sends due notifications until the task is dropped. A claim older than
/// `lease_secs` whose sender never confirmed it becomes `unconfirmed`.
pub async fn run(pool: PgPool, channels: Channels, who: String, lease_secs: f64) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default();
    let crash_after_send = std::env::var("GPUSLICE_NOTIFY_CRASH").as_deref() == Ok("after-send");
    loop {
        if let Err(e) = db::notify::settle_orphans(&pool, lease_secs).await {
            tracing::warn!(error = %e, "notifier: cannot settle orphaned claims");
        }
        let mut sent_any = false;
        for channel in ["email", "webhook"] {
            let configured = match channel {
                "email" => channels.smtp.is_some(),
                _ => channels.webhook.is_some(),
            };
            if !configured {
                continue;
            }
            loop {
                let n = match db::notify::claim(&pool, channel, &who).await {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "notifier: cannot claim");
                        break;
                    }
                };
                sent_any = true;
                let result = send(&channels, &http, &n).await;
                if crash_after_send && result.is_ok() {
                    eprintln!(
                        "gpuslice: injected crash after sending notification {}",
                        n.id
                    );
                    std::process::abort();
                }
                let marked = match &result {
                    Ok(()) => db::notify::mark_sent(&pool, n.id, &who).await,
                    Err(e) => {
                        let backoff = 30.0 * 2f64.powi(n.attempts.clamp(1, 8) - 1);
                        tracing::warn!(id = n.id, channel, error = %e, attempts = n.attempts, "notification not sent; will retry");
                        db::notify::mark_retry(
                            &pool,
                            n.id,
                            &who,
                            e,
                            backoff.min(3600.0),
                            MAX_ATTEMPTS,
                        )
                        .await
                    }
                };
                if let Err(e) = marked {
                    tracing::warn!(id = n.id, error = %e, "notifier: cannot record the outcome");
                }
            }
        }
        if !sent_any {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
}

async fn send(channels: &Channels, http: &reqwest::Client, n: &Notification) -> Result<(), String> {
    match n.channel.as_str() {
        "email" => {
            let Some(smtp) = &channels.smtp else {
                return Err("no SMTP server configured".into());
            };
            let to: lettre::message::Mailbox = n
                .recipient
                .parse()
                .map_err(|e| format!("bad recipient {}: {e}", n.recipient))?;
            let host = channels.from.email.domain().to_string();
            let msg = lettre::Message::builder()
                .from(channels.from.clone())
                .to(to)
                .subject(n.subject.clone())
                // The same id on every attempt, so a mail system that sees
                // a message twice can tell.
                .message_id(Some(format!("<gpuslice-notification-{}@{host}>", n.id)))
                .header(ContentType::TEXT_PLAIN)
                .body(n.body.clone())
                .map_err(|e| e.to_string())?;
            smtp.send(msg).await.map(|_| ()).map_err(|e| e.to_string())
        }
        _ => {
            let Some(url) = &channels.webhook else {
                return Err("no webhook configured".into());
            };
            let body = serde_json::json!({
                "text": format!("*{}*\n{}", n.subject, n.body),
                "username": "gpuslice",
            });
            let r = http
                .post(url.clone())
                .header("X-Gpuslice-Notification", n.id.to_string())
                .json(&body)
                .send()
                .await
                // The URL holds the webhook's secret: keep it out of errors.
                .map_err(|e| e.without_url().to_string())?;
            if r.status().is_success() {
                Ok(())
            } else {
                Err(format!("the webhook answered {}", r.status()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Channels;

    #[test]
    fn settings_are_checked_with_a_sentence() {
        let err = |smtp: &str| Channels::from_settings(Some(smtp), None, None).unwrap_err();
        assert!(err("http://mail:25").contains("scheme must be smtp or smtps"));
        assert!(err("smtp://ada:secret@mail:25").contains("clear text"));
        assert!(Channels::from_settings(
            Some("smtp://ada:secret@mail:587?tls=required"),
            None,
            None
        )
        .is_ok());
        assert!(Channels::from_settings(Some("smtps://ada:secret@mail:465"), None, None).is_ok());
        assert!(Channels::from_settings(
            Some("smtp://mail:25"),
            Some("gpuslice <g@uni.edu>"),
            None
        )
        .is_ok());
        let bad_from = Channels::from_settings(None, Some("not an address"), None).unwrap_err();
        assert!(bad_from.contains("GPUSLICE_MAIL_FROM"), "{bad_from}");
        let bad_hook = Channels::from_settings(None, None, Some("ftp://x")).unwrap_err();
        assert!(bad_hook.contains("http or https"), "{bad_hook}");
        let none = Channels::from_settings(None, None, None).unwrap();
        assert!(!none.any());
    }
}
