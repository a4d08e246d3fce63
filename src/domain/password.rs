//! Password policy after NIST SP 800-63B rev. 4 §3.1.1.2: a minimum length,
//! a generous maximum, no composition rules, and a blocklist of passwords
//! that are common or derived from the account.

use std::fmt;

/// Shortest password accepted (NIST SP 800-63B rev. 4: at least 15 when the
/// password is the only factor).
pub const MIN_LEN: usize = 15;
/// Longest password accepted; NIST asks for at least 64.
pub const MAX_LEN: usize = 128;

/// Common passwords of 15 characters or more, written for this project from
/// the patterns that dominate public breach corpora (keyboard walks, repeated
/// words, digit runs). Shorter ones are already refused by [`MIN_LEN`].
const BLOCKLIST: &str = include_str!("common_passwords.txt");

/// A password that satisfied the policy. Debug output never shows it.
#[derive(Clone)]
pub struct Password(String);

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(***)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    #[error("a password needs at least {MIN_LEN} characters (a few unrelated words work well)")]
    TooShort,
    #[error("a password has at most {MAX_LEN} characters")]
    TooLong,
    #[error("this password is too common or too easy to guess; choose another")]
    Common,
    #[error("a password may not contain the e-mail address or its name part")]
    ContainsEmail,
}

impl Password {
    /// Checks a new password for `email`. Length counts Unicode characters,
    /// as NIST asks.
    pub fn new(raw: &str, email: Option<&str>) -> Result<Self, PasswordError> {
        let len = raw.chars().count();
        if len < MIN_LEN {
            return Err(PasswordError::TooShort);
        }
        if len > MAX_LEN {
            return Err(PasswordError::TooLong);
        }
        let folded: String = raw
            .to_lowercase()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if is_common(&folded) {
            return Err(PasswordError::Common);
        }
        if let Some(email) = email {
            let email = email.to_lowercase();
            let local = email.split('@').next().unwrap_or("");
            if folded.contains(&email) || (local.len() >= 4 && folded.contains(local)) {
                return Err(PasswordError::ContainsEmail);
            }
        }
        Ok(Self(raw.to_string()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

fn is_common(folded: &str) -> bool {
    // One character repeated, or a short unit repeated ("abcabcabc...").
    let chars: Vec<char> = folded.chars().collect();
    for unit in 1..=4 {
        if chars.len() >= unit * 3 && chars.iter().enumerate().all(|(i, c)| *c == chars[i % unit]) {
            return true;
        }
    }
    // Runs of consecutive characters ("123456789012345", "abcdefghijklmno").
    let ascending = chars
        .windows(2)
        .all(|w| (w[1] as u32) == (w[0] as u32) + 1 || (w[0] == '9' && w[1] == '0'));
    if ascending {
        return true;
    }
    BLOCKLIST
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .any(|l| l == folded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_limits() {
        assert_eq!(
            Password::new("short pass", None).unwrap_err(),
            PasswordError::TooShort
        );
        assert!(Password::new(&"correct horse battery staple ".repeat(2), None).is_ok());
        // 64 characters must be allowed.
        let sixty_four: String = "plum-violet-cedar-".repeat(4).chars().take(64).collect();
        assert!(Password::new(&sixty_four, None).is_ok());
        assert_eq!(
            Password::new(&"ab cd ef gh ".repeat(20), None).unwrap_err(),
            PasswordError::TooLong
        );
    }

    #[test]
    fn no_composition_rules_but_a_blocklist() {
        // All lower-case letters and spaces is fine.
        assert!(Password::new("purple monkey dishwasher", None).is_ok());
        for common in [
            "aaaaaaaaaaaaaaaa",
            "passwordpassword",
            "123456789012345",
            "abcabcabcabcabcabc",
            "qwertyuiopasdfgh",
            "Password Password",
        ] {
            assert_eq!(
                Password::new(common, None).unwrap_err(),
                PasswordError::Common,
                "{common}"
            );
        }
    }

    #[test]
    fn refuses_the_email_inside() {
        assert_eq!(
            Password::new("ada.lovelace-is-my-password", Some("ada.lovelace@uni.edu")).unwrap_err(),
            PasswordError::ContainsEmail
        );
    }

    #[test]
    fn debug_hides_the_secret() {
        let p = Password::new("purple monkey dishwasher", None).unwrap();
        assert!(!format!("{p:?}").contains("purple"));
    }
}

/// Hashes a password with argon2id at the crate's defaults, which are
/// OWASP's minimum (m = 19 MiB, t = 2, p = 1). CPU-heavy: call it off the
/// async runtime (`spawn_blocking`).
pub fn hash(password: &Password) -> String {
    use argon2::password_hash::{rand_core::OsRng, PasswordHasher, SaltString};
    let salt = SaltString::generate(&mut OsRng);
    argon2::Argon2::default()
        .hash_password(password.expose().as_bytes(), &salt)
        .map(|h| h.to_string())
        // Only fails for out-of-range parameters, which the defaults are not.
        .unwrap_or_default()
}

/// Checks `raw` against a stored PHC string. Any malformed hash is a
/// mismatch. CPU-heavy like [`hash`].
pub fn verify(stored: &str, raw: &str) -> bool {
    use argon2::password_hash::{PasswordHash, PasswordVerifier};
    match PasswordHash::new(stored) {
        Ok(parsed) => argon2::Argon2::default()
            .verify_password(raw.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod hash_tests {
    use super::*;

    #[test]
    fn hash_is_argon2id_with_owasp_parameters_and_verifies() {
        let p = Password::new("purple monkey dishwasher", None).unwrap();
        let h = hash(&p);
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify(&h, "purple monkey dishwasher"));
        assert!(!verify(&h, "purple monkey dishwashe"));
        assert!(!verify("not a hash", "purple monkey dishwasher"));
    }
}
