//! Pure domain types and rules. No IO, no async: everything here is parsed
//! once at the edge (forms, JSON, CLI) and trusted afterwards.

/// A closed set of names stored as lower-case text (in the schema, the
/// JSON and the OpenAPI document): the enum with its derives, each
/// variant's name given once, `ALL`, `as_str`, `named` and `Display`.
macro_rules! text_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            Hash,
            sqlx::Type,
            serde::Serialize,
            serde::Deserialize,
            utoipa::ToSchema,
        )]
        #[sqlx(type_name = "text")]
        // Every text is the variant's name in lower case; said once more
        // for the OpenAPI generator, which does not read the per-variant
        // renames through the macro.
        #[serde(rename_all = "lowercase")]
        pub enum $name {
            $(
                #[sqlx(rename = $text)]
                #[serde(rename = $text)]
                $variant,
            )+
        }

        impl $name {
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The variant called `raw`, exactly.
            pub fn named(raw: &str) -> Option<$name> {
                $name::ALL.into_iter().find(|v| v.as_str() == raw)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod alerts;
pub mod booking;
pub mod lifecycle;
mod password;
mod quota;
pub mod rightsize;
pub mod security;
pub mod usage;

pub use password::{hash as hash_password, verify as verify_password, Password, PasswordError};
pub use quota::{Allocation, AllocationInput, Quota, QuotaField, QuotaInput};

use std::fmt;

/// An e-mail address, trimmed and lower-cased so that lookups are
/// case-insensitive everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Email(String);

impl Email {
    /// Parses and normalises an address; the check is deliberately loose
    /// (one `@`, something on both sides, no spaces) because the only real
    /// test of an address is mail arriving there.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let s = raw.trim().to_lowercase();
        if s.is_empty() {
            return Err("enter an e-mail address".into());
        }
        if s.len() > 254 {
            return Err("an e-mail address has at most 254 characters".into());
        }
        let mut parts = s.split('@');
        let (local, domain) = match (parts.next(), parts.next(), parts.next()) {
            (Some(l), Some(d), None) => (l, d),
            _ => return Err(format!("\"{}\" is not an e-mail address", raw.trim())),
        };
        if local.is_empty()
            || domain.is_empty()
            || !domain.contains('.')
            || domain.starts_with('.')
            || domain.ends_with('.')
            || s.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!("\"{}\" is not an e-mail address", raw.trim()));
        }
        Ok(Self(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tenant's short name, used in URLs, the CLI and CSV reports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Slug(String);

impl Slug {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let s = raw.trim();
        if s.len() < 2 || s.len() > 40 {
            return Err("a slug has 2 to 40 characters".into());
        }
        let ok_chars = s
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ok_chars || s.starts_with('-') || s.ends_with('-') {
            return Err(
                "a slug uses lower-case letters, digits and inner hyphens only (e.g. \"vision-lab\")"
                    .into(),
            );
        }
        Ok(Self(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Slug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A person's display name or a tenant's name: trimmed, 1..=200 characters,
/// no control characters.
pub fn parse_name(raw: &str, what: &str) -> Result<String, String> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(format!("enter a {what}"));
    }
    if s.chars().count() > 200 {
        return Err(format!("a {what} has at most 200 characters"));
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(format!("a {what} may not contain control characters"));
    }
    Ok(s.to_string())
}

/// Platform-wide role of a user. Tenant roles are separate ([`TenantRole`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GlobalRole {
    None,
    Admin,
    Finance,
}

impl GlobalRole {
    pub const ALL: [GlobalRole; 3] = [GlobalRole::None, GlobalRole::Admin, GlobalRole::Finance];

    pub fn as_str(self) -> &'static str {
        match self {
            GlobalRole::None => "none",
            GlobalRole::Admin => "admin",
            GlobalRole::Finance => "finance",
        }
    }

    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw.trim() {
            "" | "none" => Ok(GlobalRole::None),
            "admin" => Ok(GlobalRole::Admin),
            "finance" => Ok(GlobalRole::Finance),
            other => Err(format!(
                "unknown role \"{other}\": use admin, finance or none"
            )),
        }
    }
}

/// A user's role inside one tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TenantRole {
    Member,
    Manager,
}

impl TenantRole {
    pub fn as_str(self) -> &'static str {
        match self {
            TenantRole::Member => "member",
            TenantRole::Manager => "manager",
        }
    }

    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw.trim() {
            "member" => Ok(TenantRole::Member),
            "manager" => Ok(TenantRole::Manager),
            other => Err(format!(
                "unknown tenant role \"{other}\": use member or manager"
            )),
        }
    }
}

text_enum! {
    /// Scheduling priority of a time-sliced share (and a tenant's default);
    /// lower-case text in the schema.
    pub enum Priority {
        High = "high",
        Normal = "normal",
        Low = "low",
    }
}

text_enum! {
    /// What idle reclaim does once a warned owner does not answer:
    /// `notify` (only tell them) or `release` (end the booking).
    pub enum IdleAction {
        Notify = "notify",
        Release = "release",
    }
}

/// A tenant's idle policy: a booking idle for `after_minutes` (0: never)
/// is warned, and `grace_minutes` later `action` follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct IdlePolicy {
    pub after_minutes: i32,
    pub grace_minutes: i32,
    pub action: IdleAction,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy {
            after_minutes: 0,
            grace_minutes: 30,
            action: IdleAction::Notify,
        }
    }
}

impl IdlePolicy {
    /// Parses the three settings as typed (form fields, CLI flags); empty
    /// keeps `base`'s value. One message per bad field.
    pub fn parse(
        base: IdlePolicy,
        after: &str,
        grace: &str,
        action: &str,
    ) -> Result<IdlePolicy, Vec<(&'static str, String)>> {
        let mut errors = Vec::new();
        let mut minutes = |raw: &str, field: &'static str, min: i32, now: i32| {
            let raw = raw.trim();
            if raw.is_empty() {
                return now;
            }
            match raw.parse::<i32>() {
                Ok(n) if (min..=10080).contains(&n) => n,
                _ => {
                    errors.push((
                        field,
                        format!("give whole minutes between {min} and 10080 (a week)"),
                    ));
                    now
                }
            }
        };
        let after_minutes = minutes(after, "idle_after_minutes", 0, base.after_minutes);
        let grace_minutes = minutes(grace, "idle_grace_minutes", 1, base.grace_minutes);
        let action = match action.trim() {
            "" => base.action,
            a => IdleAction::named(a).unwrap_or_else(|| {
                errors.push(("idle_action", "choose notify or release".into()));
                base.action
            }),
        };
        if errors.is_empty() {
            Ok(IdlePolicy {
                after_minutes,
                grace_minutes,
                action,
            })
        } else {
            Err(errors)
        }
    }
}

impl Priority {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        Priority::named(raw)
            .ok_or_else(|| format!("unknown priority \"{raw}\": use high, normal or low"))
    }

    /// Queue order: high first.
    pub fn rank(self) -> u8 {
        match self {
            Priority::High => 0,
            Priority::Normal => 1,
            Priority::Low => 2,
        }
    }
}

text_enum! {
    /// What a GPU is used for (`gpus.mode`, lower-case text): MIG instances,
    /// time-sliced shares, or nothing new (an admin drained it).
    pub enum GpuMode {
        Mig = "mig",
        Timeslice = "timeslice",
        Drained = "drained",
    }
}

impl GpuMode {
    /// The mode a GPU's hardware has: MIG on or off.
    pub fn of_hardware(mig_enabled: bool) -> GpuMode {
        if mig_enabled {
            GpuMode::Mig
        } else {
            GpuMode::Timeslice
        }
    }
}

/// A Unix account name for `gpuslice exec` (empty: no account). Lower-case
/// letters, digits, `_` and `-`, starting with a letter or `_`, at most 32.
pub fn parse_unix_user(raw: &str) -> Result<Option<String>, String> {
    let name = raw.trim();
    if name.is_empty() {
        return Ok(None);
    }
    let valid = name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if valid {
        Ok(Some(name.to_string()))
    } else {
        Err(format!(
            "\"{name}\" is not a Unix account name (lower-case letters, digits, _ and -, at most 32)"
        ))
    }
}

/// A `--tenant SLUG[:manager]` argument of the CLI.
pub fn parse_membership_arg(raw: &str) -> Result<(Slug, TenantRole), String> {
    match raw.split_once(':') {
        None => Ok((Slug::parse(raw)?, TenantRole::Member)),
        Some((slug, role)) => Ok((Slug::parse(slug)?, TenantRole::parse(role)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn email_is_normalised_and_checked() {
        assert_eq!(
            Email::parse("  Ada@Uni.EDU ").unwrap().as_str(),
            "ada@uni.edu"
        );
        for bad in [
            "",
            "ada",
            "ada@",
            "@uni.edu",
            "a@b@c.d",
            "ada@uni",
            "a da@uni.edu",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn slug_rules() {
        assert!(Slug::parse("vision-lab").is_ok());
        assert!(Slug::parse("cs101").is_ok());
        for bad in [
            "a",
            "-lab",
            "lab-",
            "Vision",
            "vision lab",
            "ü-lab",
            &"x".repeat(41),
        ] {
            assert!(Slug::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn membership_argument() {
        let (s, r) = parse_membership_arg("vision:manager").unwrap();
        assert_eq!((s.as_str(), r), ("vision", TenantRole::Manager));
        let (s, r) = parse_membership_arg("vision").unwrap();
        assert_eq!((s.as_str(), r), ("vision", TenantRole::Member));
        assert!(parse_membership_arg("vision:owner").is_err());
    }
}
