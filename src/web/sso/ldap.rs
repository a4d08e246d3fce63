//! LDAP sign-in: the sign-in form's name (an address or a campus user
//! name) is looked up with a service account, the person is bound as
//! themselves with their password (over LDAPS or StartTLS only: a password
//! never crosses the network in the clear), and their groups are read for
//! the group mapping. The directory is the campus's own record, so its
//! address counts as verified.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ldap3::{ldap_escape, LdapConnAsync, LdapConnSettings, Scope, SearchEntry};

use super::Identity;
use crate::domain::Email;
use crate::web::error::AppError;

#[derive(Debug, Clone)]
pub struct LdapSettings {
    /// `ldaps://host:636`, or `ldap://host:389` with `starttls`.
    pub url: String,
    pub starttls: bool,
    /// PEM file of the CA that signed the directory's certificate (unset:
    /// the system's roots).
    pub ca_file: Option<PathBuf>,
    /// The service account that searches (unset: anonymous search).
    pub bind_dn: Option<String>,
    pub bind_password: Option<String>,
    pub user_base: String,
    /// `{login}` is replaced by the escaped name typed.
    pub user_filter: String,
    /// Where groups live (unset: no groups).
    pub group_base: Option<String>,
    /// `{dn}` is the person's entry, `{uid}` their user name (escaped).
    pub group_filter: String,
    pub group_attr: String,
    pub email_attr: String,
    pub name_attr: String,
    pub uid_attr: String,
}

pub struct Ldap {
    pub settings: LdapSettings,
    tls: Option<Arc<rustls::ClientConfig>>,
}

const TIMEOUT: Duration = Duration::from_secs(10);

fn unreachable_dir(e: impl std::fmt::Display) -> AppError {
    tracing::warn!(error = %e, "LDAP directory error");
    AppError::Unavailable(
        30,
        "the campus directory cannot be reached just now; try again in a minute".into(),
    )
}

impl Ldap {
    pub fn new(settings: LdapSettings) -> anyhow::Result<Ldap> {
        let url = settings.url.to_ascii_lowercase();
        if !(url.starts_with("ldaps://") || (url.starts_with("ldap://") && settings.starttls)) {
            anyhow::bail!(
                "GPUSLICE_LDAP_URL: use ldaps://, or ldap:// with GPUSLICE_LDAP_STARTTLS=true; passwords are never sent in the clear"
            );
        }
        if settings.user_base.trim().is_empty() {
            anyhow::bail!("GPUSLICE_LDAP_USER_BASE: say where people's entries live (e.g. ou=people,dc=uni,dc=edu)");
        }
        let tls = match &settings.ca_file {
            None => None,
            Some(path) => {
                use rustls::pki_types::{pem::PemObject, CertificateDer};
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_file_iter(path)
                    .map_err(|e| anyhow::anyhow!("GPUSLICE_LDAP_CA_FILE {}: {e}", path.display()))?
                {
                    roots.add(cert?)?;
                }
                if roots.is_empty() {
                    anyhow::bail!(
                        "GPUSLICE_LDAP_CA_FILE {} holds no certificate",
                        path.display()
                    );
                }
                let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
                Some(Arc::new(config))
            }
        };
        Ok(Ldap { settings, tls })
    }

    async fn connect(&self) -> Result<ldap3::Ldap, AppError> {
        let mut conn = LdapConnSettings::new()
            .set_conn_timeout(TIMEOUT)
            .set_starttls(self.settings.starttls);
        if let Some(tls) = &self.tls {
            conn = conn.set_config(tls.clone());
        }
        let (driver, ldap) = LdapConnAsync::with_settings(conn, &self.settings.url)
            .await
            .map_err(unreachable_dir)?;
        ldap3::drive!(driver);
        Ok(ldap)
    }

    /// Binds as the service account, when there is one (else the
    /// connection stays anonymous).
    async fn bind_service(&self, ldap: &mut ldap3::Ldap) -> Result<(), AppError> {
        if let (Some(dn), Some(pw)) = (&self.settings.bind_dn, &self.settings.bind_password) {
            ldap.with_timeout(TIMEOUT)
                .simple_bind(dn, pw)
                .await
                .and_then(|r| r.success())
                .map_err(unreachable_dir)?;
        }
        Ok(())
    }

    /// The person `login` names if `password` is theirs, with their
    /// groups; `None` when the name or the password is wrong.
    pub async fn authenticate(
        &self,
        login: &str,
        password: &str,
    ) -> Result<Option<Identity>, AppError> {
        let login = login.trim();
        // An empty password is an "unauthenticated bind", which succeeds.
        if login.is_empty() || password.is_empty() || login.len() > 254 {
            return Ok(None);
        }
        let s = &self.settings;
        // `with_timeout` covers the next operation only: one per operation.
        let mut ldap = self.connect().await?;
        self.bind_service(&mut ldap).await?;
        let filter = s.user_filter.replace("{login}", &ldap_escape(login));
        let attrs = vec![
            s.email_attr.as_str(),
            s.name_attr.as_str(),
            s.uid_attr.as_str(),
        ];
        let (entries, _) = ldap
            .with_timeout(TIMEOUT)
            .search(&s.user_base, Scope::Subtree, &filter, attrs)
            .await
            .and_then(|r| r.success())
            .map_err(unreachable_dir)?;
        // Exactly one person, or nobody.
        let [entry] = entries.as_slice() else {
            let _ = ldap.unbind().await;
            return Ok(None);
        };
        let entry = SearchEntry::construct(entry.clone());
        let first = |attr: &str| entry.attrs.get(attr).and_then(|v| v.first()).cloned();
        // The person's own bind proves the password.
        let bound = ldap
            .with_timeout(TIMEOUT)
            .simple_bind(&entry.dn, password)
            .await
            .map_err(unreachable_dir)?;
        if bound.rc != 0 {
            let _ = ldap.unbind().await;
            return Ok(None);
        }
        let uid = first(&s.uid_attr).unwrap_or_else(|| login.to_string());
        let mut groups = Vec::new();
        if let Some(base) = &s.group_base {
            // Read groups as the service account (people often may not).
            self.bind_service(&mut ldap).await?;
            let filter = s
                .group_filter
                .replace("{dn}", &ldap_escape(entry.dn.as_str()))
                .replace("{uid}", &ldap_escape(uid.as_str()));
            let (found, _) = ldap
                .with_timeout(TIMEOUT)
                .search(base, Scope::Subtree, &filter, vec![s.group_attr.as_str()])
                .await
                .and_then(|r| r.success())
                .map_err(unreachable_dir)?;
            for g in found {
                let g = SearchEntry::construct(g);
                groups.extend(g.attrs.get(&s.group_attr).cloned().unwrap_or_default());
            }
        }
        let _ = ldap.with_timeout(TIMEOUT).unbind().await;
        let Some(email) = first(&s.email_attr).and_then(|e| Email::parse(&e).ok()) else {
            return Err(AppError::Forbidden(format!(
                "the campus directory has no e-mail address (attribute {}) for you; ask your admins",
                s.email_attr
            )));
        };
        Ok(Some(Identity {
            provider: "ldap",
            subject: entry.dn.to_ascii_lowercase(),
            email,
            email_verified: true,
            name: first(&s.name_attr).unwrap_or_default(),
            groups,
        }))
    }
}
