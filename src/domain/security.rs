//! The security monitor's vocabulary: what its detectors are called, what
//! a suspicion is counted against, and what a node may do by itself.

// What saw the evidence: a process on a GPU or MIG device in no active
// booking's cgroup; a process inside a booking under a Unix account that is
// not the owner's linked one (nor root); `gpuslice exec` refusing a Unix
// account; a share's process over its GPU memory after the warning;
// sign-ins for an account or from an address hitting the limit; an API
// token used from a new address; and what a node did by itself (a record,
// not suspicion).
text_enum! {
    /// The detector that saw a piece of evidence.
    pub enum Detector {
        IntruderProcess = "intruder_process",
        ForeignAccount = "foreign_account",
        ExecRefusals = "exec_refusals",
        ShareMemory = "share_memory",
        SignInFailures = "sign_in_failures",
        TokenNewAddress = "token_new_address",
        Response = "response",
        UnshimmedProcess = "unshimmed_process",
    }
}

impl Detector {
    /// In words, for the incident page.
    pub fn label(self) -> &'static str {
        match self {
            Detector::IntruderProcess => "process outside every booking",
            Detector::ForeignAccount => "process of another Unix account",
            Detector::ExecRefusals => "exec refused",
            Detector::ShareMemory => "share over its GPU memory",
            Detector::SignInFailures => "sign-in failures",
            Detector::TokenNewAddress => "API token from a new address",
            Detector::Response => "automatic response",
            Detector::UnshimmedProcess => "process on a share's GPU without the launch shim",
        }
    }

    /// How much one piece of evidence adds to the incident's score.
    pub fn weight(self) -> i32 {
        match self {
            Detector::Response => 0,
            _ => 1,
        }
    }
}

/// What an incident is counted against (its `subject` text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Suspect {
    Booking(i64),
    Account(i64),
    Address(String),
    /// A Unix account on a node.
    Uid {
        uid: u32,
        node: String,
    },
    /// A device no booking holds.
    Device(String),
}

impl Suspect {
    pub fn key(&self) -> String {
        match self {
            Suspect::Booking(id) => format!("booking:{id}"),
            Suspect::Account(id) => format!("account:{id}"),
            Suspect::Address(a) => format!("address:{a}"),
            Suspect::Uid { uid, node } => format!("uid:{uid}@{node}"),
            Suspect::Device(uuid) => format!("device:{uuid}"),
        }
    }
}

/// What a node does by itself when an incident on it reaches the
/// threshold (`GPUSLICE_SECURITY_RESPONSE`, comma-separated; default
/// none): `end-intruders` ends the processes outside every booking (SIGTERM,
/// then SIGKILL); `freeze-shares` freezes a share whose processes run
/// under another account or keep more GPU memory than booked, until an
/// admin closes the incident.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Response {
    pub end_intruders: bool,
    pub freeze_shares: bool,
}

impl Response {
    pub fn parse(raw: &str) -> Result<Response, String> {
        let mut r = Response::default();
        for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "none" | "off" => {}
                "end-intruders" => r.end_intruders = true,
                "freeze-shares" => r.freeze_shares = true,
                other => {
                    return Err(format!(
                        "--security-response: \"{other}\" is not a response; give none, end-intruders, freeze-shares or both separated by a comma"
                    ))
                }
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_and_refuse_unknown_words() {
        assert_eq!(Response::parse("").unwrap(), Response::default());
        assert_eq!(Response::parse("none").unwrap(), Response::default());
        let r = Response::parse("end-intruders, freeze-shares").unwrap();
        assert!(r.end_intruders && r.freeze_shares);
        let e = Response::parse("kill").unwrap_err();
        assert!(e.contains("\"kill\""), "{e}");
    }

    #[test]
    fn suspects_have_distinct_keys() {
        assert_eq!(Suspect::Booking(4).key(), "booking:4");
        assert_eq!(
            Suspect::Uid {
                uid: 1001,
                node: "n1".into()
            }
            .key(),
            "uid:1001@n1"
        );
        assert_ne!(Suspect::Account(4).key(), Suspect::Booking(4).key());
    }
}
