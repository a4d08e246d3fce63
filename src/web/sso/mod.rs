//! Single sign-on: OpenID Connect ([`oidc`]) and LDAP ([`ldap`]), and what
//! both share: a mapping from the provider's groups to tenants and roles,
//! applied at every sign-in (just-in-time accounts, memberships kept in
//! step, everything audited), and whether local passwords still work.
//!
//! The mapping owns only what it granted: memberships it made (source
//! `sso`) follow the groups; memberships set by hand, by invitation or by
//! a manager are never touched; a platform role it granted is taken back
//! when the group goes, one set by hand stays.

pub mod ldap;
pub mod oidc;

use std::collections::BTreeMap;

use serde_json::json;

use super::error::AppError;
use super::AppState;
use crate::db::{self, audit::Actor};
use crate::domain::{parse_name, Email, GlobalRole, TenantRole};

/// What a group grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    Tenant(String, TenantRole),
    Platform(GlobalRole),
}

/// Groups to grants, from `GPUSLICE_SSO_GROUPS`:
/// `group=tenant-slug[:member|manager]` or `group=platform:admin|finance`,
/// separated by commas or new lines. Group names compare without case.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupMapping(pub Vec<(String, Grant)>);

impl GroupMapping {
    pub fn parse(raw: &str) -> Result<GroupMapping, String> {
        let mut rules = Vec::new();
        for item in raw
            .split([',', '\n'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (group, grant) = item.split_once('=').ok_or_else(|| {
                format!("\"{item}\": write group=tenant-slug[:member|manager] or group=platform:admin|finance")
            })?;
            let (group, grant) = (group.trim(), grant.trim());
            if group.is_empty() {
                return Err(format!("\"{item}\": the group name is empty"));
            }
            let grant = match grant.split_once(':') {
                Some(("platform", role)) => match GlobalRole::parse(role)? {
                    GlobalRole::None => {
                        return Err(format!("\"{item}\": platform roles are admin or finance"))
                    }
                    r => Grant::Platform(r),
                },
                Some((slug, role)) => Grant::Tenant(
                    crate::domain::Slug::parse(slug)
                        .map_err(|e| format!("\"{item}\": {e}"))?
                        .as_str()
                        .to_string(),
                    TenantRole::parse(role)?,
                ),
                None => Grant::Tenant(
                    crate::domain::Slug::parse(grant)
                        .map_err(|e| format!("\"{item}\": {e}"))?
                        .as_str()
                        .to_string(),
                    TenantRole::Member,
                ),
            };
            rules.push((group.to_string(), grant));
        }
        Ok(GroupMapping(rules))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What `groups` grant: the highest platform role (admin over finance)
    /// and per tenant the highest role (manager over member).
    pub fn grants(&self, groups: &[String]) -> (GlobalRole, BTreeMap<String, TenantRole>) {
        let mut role = GlobalRole::None;
        let mut tenants: BTreeMap<String, TenantRole> = BTreeMap::new();
        for (group, grant) in &self.0 {
            if !groups.iter().any(|g| g.eq_ignore_ascii_case(group)) {
                continue;
            }
            match grant {
                Grant::Platform(r) => role = higher_role(role, *r),
                Grant::Tenant(slug, r) => {
                    let e = tenants.entry(slug.clone()).or_insert(*r);
                    if *r == TenantRole::Manager {
                        *e = TenantRole::Manager;
                    }
                }
            }
        }
        (role, tenants)
    }
}

fn rank(r: GlobalRole) -> u8 {
    match r {
        GlobalRole::None => 0,
        GlobalRole::Finance => 1,
        GlobalRole::Admin => 2,
    }
}

fn higher_role(a: GlobalRole, b: GlobalRole) -> GlobalRole {
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// Single sign-on as configured.
#[derive(Default)]
pub struct Sso {
    pub oidc: Option<oidc::Oidc>,
    pub ldap: Option<ldap::Ldap>,
    pub mapping: GroupMapping,
    /// `None`: local passwords work for everyone; `Some(addr)`: only for
    /// this break-glass admin (`Some("")`: for no one).
    pub password_only_for: Option<String>,
}

impl Sso {
    /// New accounts may be made with a password (invitations).
    pub fn local_passwords(&self) -> bool {
        self.password_only_for.is_none()
    }

    /// Whether `email` may sign in with a local password.
    pub fn password_allowed(&self, email: &str) -> bool {
        match &self.password_only_for {
            None => true,
            Some(only) => !only.is_empty() && only.eq_ignore_ascii_case(email),
        }
    }

    /// Someone may sign in with a local password.
    pub fn password_allowed_for_anyone(&self) -> bool {
        self.password_only_for.as_deref() != Some("")
    }

    /// The sign-in button's label when OpenID Connect is on.
    pub fn button_label(&self) -> Option<String> {
        self.oidc
            .as_ref()
            .map(|o| format!("Sign in with {}", o.settings.name))
    }
}

impl Sso {
    /// Single sign-on from the command line's settings; a mistake is a
    /// sentence naming the setting.
    pub fn from_args(a: &crate::cli::args::SsoArgs) -> anyhow::Result<Sso> {
        let nonempty = |o: &Option<String>| {
            o.as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let oidc = match nonempty(&a.oidc_issuer) {
            None => None,
            Some(issuer) => {
                let client_id = nonempty(&a.oidc_client_id).ok_or_else(|| {
                    anyhow::anyhow!(
                        "GPUSLICE_OIDC_CLIENT_ID: give the client id registered at the provider"
                    )
                })?;
                Some(oidc::Oidc::new(oidc::OidcSettings {
                    issuer,
                    client_id,
                    client_secret: nonempty(&a.oidc_client_secret),
                    scopes: a
                        .oidc_scopes
                        .split_whitespace()
                        .map(str::to_string)
                        .collect(),
                    email_claim: a.oidc_email_claim.trim().to_string(),
                    groups_claim: a.oidc_groups_claim.trim().to_string(),
                    name: a.oidc_name.trim().to_string(),
                    redirect_url: nonempty(&a.oidc_redirect_url),
                    trust_email: a.oidc_trust_email,
                })?)
            }
        };
        let ldap = match nonempty(&a.ldap_url) {
            None => None,
            Some(url) => Some(ldap::Ldap::new(ldap::LdapSettings {
                url,
                starttls: a.ldap_starttls,
                ca_file: a.ldap_ca_file.clone(),
                bind_dn: nonempty(&a.ldap_bind_dn),
                bind_password: a.ldap_bind_password.clone(),
                user_base: a.ldap_user_base.trim().to_string(),
                user_filter: a.ldap_user_filter.clone(),
                group_base: nonempty(&a.ldap_group_base),
                group_filter: a.ldap_group_filter.clone(),
                group_attr: a.ldap_group_attr.trim().to_string(),
                email_attr: a.ldap_email_attr.trim().to_string(),
                name_attr: a.ldap_name_attr.trim().to_string(),
                uid_attr: a.ldap_uid_attr.trim().to_string(),
            })?),
        };
        let mapping = GroupMapping::parse(&a.sso_groups)
            .map_err(|e| anyhow::anyhow!("GPUSLICE_SSO_GROUPS: {e}"))?;
        let password_only_for = match a.local_passwords.as_str() {
            "off" => {
                if oidc.is_none() && ldap.is_none() {
                    anyhow::bail!("GPUSLICE_LOCAL_PASSWORDS=off needs OpenID Connect or LDAP, or nobody could sign in");
                }
                Some(
                    nonempty(&a.break_glass_admin)
                        .map(|e| e.to_lowercase())
                        .unwrap_or_default(),
                )
            }
            _ => None,
        };
        Ok(Sso {
            oidc,
            ldap,
            mapping,
            password_only_for,
        })
    }
}

/// Who the provider says signed in.
#[derive(Debug, Clone)]
pub struct Identity {
    /// `oidc` or `ldap`.
    pub provider: &'static str,
    /// The provider's stable id (OIDC `iss` + `sub`, the LDAP entry's DN).
    pub subject: String,
    pub email: Email,
    /// The provider vouches for the address (OIDC `email_verified`; LDAP
    /// directories are the campus's own record). Only a verified address
    /// is linked to an existing account.
    pub email_verified: bool,
    pub name: String,
    pub groups: Vec<String>,
}

/// An account no password opens (single sign-on only): not a PHC string,
/// so every password check fails.
const NO_PASSWORD: &str = "!sso";

/// Finds or makes the account of `who`, keeps its memberships and role in
/// step with its groups, and returns (user id, session epoch). Refuses a
/// disabled account, and an unverified address that names an existing
/// account.
pub async fn provision(
    state: &AppState,
    who: &Identity,
    client_addr: &str,
) -> Result<(i64, i32), AppError> {
    let mut actor = Actor {
        user_id: None,
        email: Some(who.email.as_str().to_string()),
        client_addr: Some(client_addr.to_string()),
    };
    let mut tx = state.pool.begin().await?;
    let user_id = match db::sso::user_of(&mut tx, who.provider, &who.subject).await? {
        Some(id) => id,
        // A new identity gets an account, or is linked to the account of
        // its address, only when the provider vouches for the address:
        // else whoever can set an address at the provider would own it here.
        None if !who.email_verified => {
            return Err(AppError::Forbidden(
                "the identity provider did not confirm your e-mail address, which gpuslice needs to know who you are; ask your admins"
                    .into(),
            ));
        }
        None => match db::users::id_by_email(&mut *tx, &who.email).await? {
            Some(id) => {
                // The break-glass account stays a password account, and an
                // account already tied to another identity of this provider
                // is not taken over by a second one.
                let break_glass =
                    state.sso.password_only_for.as_deref().is_some_and(|b| {
                        !b.is_empty() && b.eq_ignore_ascii_case(who.email.as_str())
                    });
                if break_glass || db::sso::linked_to(&mut tx, who.provider, id).await? {
                    return Err(AppError::Forbidden(
                        "this address belongs to an account that cannot be opened this way; ask a platform admin"
                            .into(),
                    ));
                }
                db::sso::link(&mut tx, who.provider, &who.subject, id).await?;
                db::audit::record(
                    &mut *tx,
                    &Actor {
                        user_id: Some(id),
                        ..actor.clone()
                    },
                    "sso.linked",
                    who.email.as_str(),
                    json!({"provider": who.provider, "subject": who.subject}),
                )
                .await?;
                id
            }
            None => {
                let name = parse_name(&who.name, "name").unwrap_or_else(|_| {
                    who.email
                        .as_str()
                        .split('@')
                        .next()
                        .unwrap_or("user")
                        .to_string()
                });
                let made =
                    db::users::insert(&mut *tx, &who.email, &name, NO_PASSWORD, GlobalRole::None)
                        .await;
                let id = match made {
                    Ok(id) => id,
                    Err(e) if db::is_unique_violation(&e, "users_email_key") => {
                        return Err(AppError::Conflict(
                            "another sign-in made this account at the same moment; sign in again"
                                .into(),
                        ))
                    }
                    Err(e) => return Err(e.into()),
                };
                db::sso::link(&mut tx, who.provider, &who.subject, id).await?;
                db::audit::record(
                    &mut *tx,
                    &Actor {
                        user_id: Some(id),
                        ..actor.clone()
                    },
                    "user.created",
                    who.email.as_str(),
                    json!({"via": who.provider, "subject": who.subject}),
                )
                .await?;
                id
            }
        },
    };
    actor.user_id = Some(user_id);
    let account = db::sso::account_for_update(&mut tx, user_id).await?;
    if account.disabled {
        return Err(AppError::Forbidden(
            "this account is disabled; ask a platform admin".into(),
        ));
    }
    // Always, even with no mapping: then what it once granted goes.
    apply_mapping(&mut tx, &state.sso.mapping, who, user_id, &account, &actor).await?;
    tx.commit().await?;
    Ok((user_id, account.session_epoch))
}

async fn apply_mapping(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    mapping: &GroupMapping,
    who: &Identity,
    user_id: i64,
    account: &db::sso::Account,
    actor: &Actor,
) -> Result<(), AppError> {
    let (role, tenants) = mapping.grants(&who.groups);
    let current = GlobalRole::parse(&account.global_role).unwrap_or(GlobalRole::None);
    let manual = account.role_source == "manual";
    // Grant a higher role; take back only a role the mapping granted.
    let next = if manual {
        (rank(role) > rank(current)).then_some(role)
    } else {
        (role != current).then_some(role)
    };
    if let Some(r) = next {
        db::sso::set_role(
            tx,
            user_id,
            r,
            if r == GlobalRole::None {
                "manual"
            } else {
                "sso"
            },
        )
        .await?;
        db::audit::record(
            &mut **tx,
            actor,
            "sso.role",
            who.email.as_str(),
            json!({"provider": who.provider, "role": r.as_str(), "was": current.as_str()}),
        )
        .await?;
    }
    let held = db::sso::memberships(tx, user_id).await?;
    let slugs: Vec<String> = tenants.keys().cloned().collect();
    let live = db::sso::tenant_ids(tx, &slugs).await?;
    for (tenant_id, slug) in &live {
        let want = tenants[slug];
        match held.iter().find(|h| h.tenant_id == *tenant_id) {
            Some(h) if h.source == "manual" || h.role == want.as_str() => {}
            h => {
                db::sso::grant(tx, user_id, *tenant_id, want).await?;
                db::audit::record(
                    &mut **tx,
                    actor,
                    "sso.membership",
                    who.email.as_str(),
                    json!({"provider": who.provider, "tenant": slug, "role": want.as_str(),
                           "was": h.map(|h| h.role.clone())}),
                )
                .await?;
            }
        }
    }
    for h in held.iter().filter(|h| h.source == "sso") {
        if !live.iter().any(|(id, _)| *id == h.tenant_id) {
            db::sso::revoke(tx, user_id, h.tenant_id).await?;
            db::audit::record(
                &mut **tx,
                actor,
                "sso.membership.removed",
                who.email.as_str(),
                json!({"provider": who.provider, "tenant": h.slug, "was": h.role}),
            )
            .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_grants_the_highest_roles() {
        let m = GroupMapping::parse(
            "gpu-vision-lab=vision-lab, gpu-vision-pis=vision-lab:manager\ngpu-admins=platform:admin,gpu-finance=platform:finance,cs101=cs-101:member",
        )
        .unwrap();
        let (role, tenants) = m.grants(&[
            "GPU-Vision-Lab".into(),
            "gpu-vision-pis".into(),
            "gpu-finance".into(),
        ]);
        assert_eq!(role, GlobalRole::Finance);
        assert_eq!(tenants.get("vision-lab"), Some(&TenantRole::Manager));
        assert!(!tenants.contains_key("cs-101"));
        let (role, _) = m.grants(&["gpu-finance".into(), "gpu-admins".into()]);
        assert_eq!(role, GlobalRole::Admin);
        assert_eq!(m.grants(&[]), (GlobalRole::None, BTreeMap::new()));
    }

    #[test]
    fn a_bad_mapping_says_which_item() {
        for bad in [
            "nogroup",
            "=lab",
            "g=Not A Slug",
            "g=lab:owner",
            "g=platform:none",
            "g=platform:root",
        ] {
            let e = GroupMapping::parse(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(GroupMapping::parse("").unwrap().is_empty());
    }

    #[test]
    fn passwords_can_be_kept_for_a_break_glass_admin_only() {
        let all = Sso::default();
        assert!(all.password_allowed("ana@uni.edu") && all.local_passwords());
        let only = Sso {
            password_only_for: Some("root@uni.edu".into()),
            ..Default::default()
        };
        assert!(only.password_allowed("ROOT@uni.edu"));
        assert!(!only.password_allowed("ana@uni.edu"));
        assert!(!only.local_passwords());
    }
}
