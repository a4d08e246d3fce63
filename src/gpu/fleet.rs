//! The fleet file (TOML) that configures the simulated backend, and the
//! built-in demo fleet used when `GPUSLICE_FLEET` is unset.
//!
//! ```toml
//! [[node]]
//! name = "gpu-node-1"
//! [[node.gpu]]
//! model = "H100-80GB"
//! mode = "mig"          # mig | timeslice
//! count = 2
//! max_shares = 4        # time-slice mode only (default 4)
//! ```

use serde::Deserialize;

use super::catalog;

/// Whether a GPU is cut into MIG instances or shared by time-slicing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Mig,
    Timeslice,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Mig => "mig",
            Mode::Timeslice => "timeslice",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fleet {
    #[serde(rename = "node")]
    pub nodes: Vec<Node>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    #[serde(rename = "gpu", default)]
    pub gpus: Vec<GpuGroup>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuGroup {
    pub model: String,
    pub mode: Mode,
    #[serde(default = "one")]
    pub count: u32,
    #[serde(default = "four")]
    pub max_shares: u32,
}

fn one() -> u32 {
    1
}
fn four() -> u32 {
    4
}

/// Two nodes: MIG H100s and A100s on one, time-sliced L40S and an A30 in
/// MIG mode on the other.
pub const DEMO_FLEET: &str = r#"
[[node]]
name = "gpu-node-1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 2
[[node.gpu]]
model = "A100-80GB"
mode = "mig"
count = 1

[[node]]
name = "gpu-node-2"
[[node.gpu]]
model = "L40S-48GB"
mode = "timeslice"
count = 2
max_shares = 4
[[node.gpu]]
model = "A30-24GB"
mode = "mig"
count = 1
"#;

impl Fleet {
    /// Parses and checks a fleet file: known models, MIG only on
    /// MIG-capable ones, unique node names, sane counts.
    pub fn parse(text: &str) -> Result<Fleet, String> {
        let fleet: Fleet =
            toml::from_str(text).map_err(|e| format!("fleet file: {}", e.message()))?;
        if fleet.nodes.is_empty() {
            return Err("fleet file: it names no [[node]]".into());
        }
        let mut names = std::collections::HashSet::new();
        for node in &fleet.nodes {
            if node.name.trim().is_empty() || !names.insert(node.name.as_str()) {
                return Err(format!(
                    "fleet file: node name \"{}\" is empty or repeated",
                    node.name
                ));
            }
            for g in &node.gpus {
                let model = catalog::model(&g.model).ok_or_else(|| {
                    format!(
                        "fleet file: node {}: unknown GPU model \"{}\"",
                        node.name, g.model
                    )
                })?;
                if g.mode == Mode::Mig && !model.mig_capable() {
                    return Err(format!(
                        "fleet file: node {}: {} cannot run in MIG mode",
                        node.name, g.model
                    ));
                }
                if g.count == 0 || g.count > 16 {
                    return Err(format!(
                        "fleet file: node {}: count must be 1 to 16",
                        node.name
                    ));
                }
                if g.max_shares == 0 || g.max_shares > 64 {
                    return Err(format!(
                        "fleet file: node {}: max_shares must be 1 to 64",
                        node.name
                    ));
                }
            }
        }
        Ok(fleet)
    }

    pub fn demo() -> Fleet {
        // The built-in text is checked by a test.
        Fleet::parse(DEMO_FLEET).unwrap_or(Fleet { nodes: Vec::new() })
    }

    /// Reads `GPUSLICE_FLEET`'s file, or the demo fleet when unset.
    pub fn load(path: Option<&std::path::Path>) -> Result<Fleet, String> {
        match path {
            None => Ok(Fleet::demo()),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read the fleet file {}: {e}", p.display()))?;
                Fleet::parse(&text)
            }
        }
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_fleet_parses_and_mixes_modes() {
        let f = Fleet::parse(DEMO_FLEET).unwrap();
        assert_eq!(f.nodes.len(), 2);
        let modes: Vec<_> = f
            .nodes
            .iter()
            .flat_map(|n| n.gpus.iter().map(|g| g.mode))
            .collect();
        assert!(modes.contains(&Mode::Mig) && modes.contains(&Mode::Timeslice));
    }

    #[test]
    fn bad_fleet_files_say_what_is_wrong() {
        let bad = |t: &str| Fleet::parse(t).unwrap_err();
        assert!(
            bad("[[node]]\nname = \"a\"\n[[node.gpu]]\nmodel = \"H900\"\nmode = \"mig\"")
                .contains("unknown GPU model \"H900\"")
        );
        assert!(
            bad("[[node]]\nname = \"a\"\n[[node.gpu]]\nmodel = \"T4-16GB\"\nmode = \"mig\"")
                .contains("cannot run in MIG mode")
        );
        assert!(bad("[[node]]\nname = \"a\"\n[[node]]\nname = \"a\"").contains("repeated"));
        assert!(bad(
            "[[node]]\nname = \"a\"\n[[node.gpu]]\nmodel = \"T4-16GB\"\nmode = \"shared\""
        )
        .contains("fleet file"));
        assert!(bad("").contains("fleet file"));
    }
}
