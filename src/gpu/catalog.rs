//! The GPU catalog: every model gpuslice knows, and for MIG-capable models
//! every GPU-instance profile with its NVML ids, slices, memory, maximum
//! count and allowed placements.
//!
//! Source: the project's `mig.md` (NVIDIA MIG User Guide, "Supported MIG
//! Profiles" and `nvidia-smi mig -lgipp` placement listings; `nvml.h` for the
//! profile enum). Placements for H200, GH200 144GB and B200 are not confirmed
//! by a listing there and assumed to equal the other 8-slice GPUs; on real
//! hardware the NVML backend asks the driver and prefers what it says.

/// A placement of a GPU instance: `size` memory slices from `start`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Placement {
    pub start: u8,
    pub size: u8,
}

impl Placement {
    pub fn end(self) -> u8 {
        self.start + self.size
    }

    /// Whether two placements share a memory slice.
    pub fn overlaps(self, other: Placement) -> bool {
        self.start < other.end() && other.start < self.end()
    }
}

/// One GPU-instance profile of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Name as NVIDIA writes it, e.g. `3g.40gb` or `1g.10gb+me`.
    pub name: String,
    /// The profile id NVML returns in `nvmlGpuInstanceProfileInfo_t.id` and
    /// takes for placement and creation calls.
    pub nvml_id: u32,
    /// The `NVML_GPU_INSTANCE_PROFILE_*` enum index passed to
    /// `nvmlDeviceGetGpuInstanceProfileInfo` (not the id).
    pub nvml_enum: u32,
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub memory_gib: f64,
    pub max_count: u8,
    /// Holds the GPU's media engines (decoders, JPEG, OFA); at most one.
    pub media_extensions: bool,
    /// Allowed start slices; every placement has `memory_slices` slices.
    pub starts: Vec<u8>,
}

impl Profile {
    pub fn placements(&self) -> impl Iterator<Item = Placement> + '_ {
        self.starts.iter().map(|&start| Placement {
            start,
            size: self.memory_slices,
        })
    }

    pub fn allows(&self, p: Placement) -> bool {
        p.size == self.memory_slices && self.starts.contains(&p.start)
    }
}

/// One GPU model.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// Catalog id used in the fleet file, the API and the database.
    pub id: &'static str,
    pub memory_gib: f64,
    /// Memory slices of a MIG GPU (8, or 4 on A30); 0 when not MIG-capable.
    pub memory_slices: u8,
    /// Compute slices of a MIG GPU (7, or 4 on A30).
    pub compute_slices: u8,
    pub profiles: Vec<Profile>,
    /// Upper-case fragments of NVML product names that mean this family.
    family: &'static str,
    /// A product name the driver reports for this model (the stand-in
    /// `libnvidia-ml` uses it).
    pub product: &'static str,
}

/// How far a model's MIG rows are known: what NVIDIA documents with a
/// placement listing, what is assumed by analogy, and what gpuslice has
/// itself seen on hardware (`gpu-check` on a real GPU; none yet: no GPU
/// machine has been lent to the project). Profile memory sizes are nominal
/// everywhere: the driver's figures (a real H100 reports about 19.62 /
/// 39.50 / 79.25 GiB for 2g / 3g–4g / 7g) are read at run time, per MIG
/// device, for telemetry and the memory alert, and printed next to the
/// catalog's by `gpu-check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Provenance {
    /// NVIDIA's MIG user guide lists the placements.
    Documented,
    /// Placements assumed to be those of the A100/H100 80GB (mig.md).
    PlacementsAssumed,
    /// Seen by `gpu-check` on a real GPU of this model.
    ConfirmedOnHardware,
    /// Not MIG-capable: nothing to confirm.
    NotMig,
}

impl Provenance {
    pub fn as_str(self) -> &'static str {
        match self {
            Provenance::Documented => "documented by NVIDIA, not yet seen on hardware by gpuslice",
            Provenance::PlacementsAssumed => {
                "placements assumed (as A100/H100 80GB), not confirmed"
            }
            Provenance::ConfirmedOnHardware => "confirmed on hardware by gpu-check",
            Provenance::NotMig => "no MIG",
        }
    }
}

impl Model {
    pub fn mig_capable(&self) -> bool {
        !self.profiles.is_empty()
    }

    /// How far this model's rows are known (see [`Provenance`]).
    pub fn provenance(&self) -> Provenance {
        match self.id {
            _ if !self.mig_capable() => Provenance::NotMig,
            "H200-141GB" | "GH200-144GB" | "B200-180GB" => Provenance::PlacementsAssumed,
            _ => Provenance::Documented,
        }
    }

    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    pub fn profile_by_id(&self, nvml_id: u32) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.nvml_id == nvml_id)
    }

    pub fn profile_by_enum(&self, nvml_enum: u32) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.nvml_enum == nvml_enum)
    }

    /// Board power limit in watts, for the simulation's power model only
    /// (the figures of NVIDIA's product pages for the SXM/PCIe boards,
    /// rounded; real nodes report their own).
    pub fn tdp_w(&self) -> f64 {
        match self.id.split('-').next().unwrap_or("") {
            "H100" | "H200" => 700.0,
            "GH200" | "B200" => 1000.0,
            "A100" => 400.0,
            "A30" => 165.0,
            "L40S" => 350.0,
            "A10" => 150.0,
            "T4" => 70.0,
            _ => 300.0,
        }
    }
}

/// One row of the 8-slice table of mig.md: (profile id, enum index,
/// compute, memory, max, starts, +me).
type Row = (u32, u32, u8, u8, u8, &'static [u8], bool);

const EIGHT_SLICE_ROWS: [Row; 7] = [
    (19, 0, 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6], false),
    (20, 7, 1, 1, 1, &[0, 1, 2, 3, 4, 5, 6], true),
    (15, 9, 1, 2, 4, &[0, 2, 4, 6], false),
    (14, 1, 2, 2, 3, &[0, 2, 4], false),
    (9, 2, 3, 4, 2, &[0, 4], false),
    (5, 3, 4, 4, 1, &[0], false),
    (0, 4, 7, 8, 1, &[0], false),
];

fn eight_slice(names: [&str; 7], memory_gib: [f64; 7]) -> Vec<Profile> {
    EIGHT_SLICE_ROWS
        .iter()
        .zip(names.iter().zip(memory_gib))
        .map(|(&(id, en, c, m, max, starts, me), (name, gib))| Profile {
            name: name.to_string(),
            nvml_id: id,
            nvml_enum: en,
            compute_slices: c,
            memory_slices: m,
            memory_gib: gib,
            max_count: max,
            media_extensions: me,
            starts: starts.to_vec(),
        })
        .collect()
}

/// Nominal GiB from a profile name ("3g.40gb" -> 40): used where mig.md
/// gives no exact figure; NVML reports the exact size at run time.
fn nominal(names: [&str; 7]) -> [f64; 7] {
    names.map(|n| {
        n.split('.')
            .nth(1)
            .and_then(|s| s.trim_end_matches("+me").strip_suffix("gb"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0)
    })
}

fn mig8(
    id: &'static str,
    family: &'static str,
    memory_gib: f64,
    names: [&str; 7],
    gib: Option<[f64; 7]>,
) -> Model {
    Model {
        product: product_of(id),
        id,
        memory_gib,
        memory_slices: 8,
        compute_slices: 7,
        profiles: eight_slice(names, gib.unwrap_or_else(|| nominal(names))),
        family,
    }
}

/// The driver's product name for a catalog id, as `nvidia-smi` prints it.
fn product_of(id: &str) -> &'static str {
    match id {
        "A30-24GB" => "NVIDIA A30",
        "A100-40GB" => "NVIDIA A100-SXM4-40GB",
        "A100-80GB" => "NVIDIA A100-SXM4-80GB",
        "H100-80GB" => "NVIDIA H100 80GB HBM3",
        "H100-94GB" => "NVIDIA H100 NVL",
        "H100-96GB" => "NVIDIA H100 96GB HBM3",
        "H200-141GB" => "NVIDIA H200",
        "GH200-96GB" => "NVIDIA GH200 480GB",
        "GH200-144GB" => "NVIDIA GH200 144G HBM3e",
        "B200-180GB" => "NVIDIA B200",
        "L40S-48GB" => "NVIDIA L40S",
        "L4-24GB" => "NVIDIA L4",
        "A10-24GB" => "NVIDIA A10",
        "T4-16GB" => "Tesla T4",
        _ => "NVIDIA GPU",
    }
}

fn plain(id: &'static str, family: &'static str, memory_gib: f64) -> Model {
    Model {
        product: product_of(id),
        id,
        memory_gib,
        memory_slices: 0,
        compute_slices: 0,
        profiles: Vec::new(),
        family,
    }
}

fn a30() -> Model {
    let p = |name: &str, id, en, c, max, starts: &[u8], me| Profile {
        name: name.into(),
        nvml_id: id,
        nvml_enum: en,
        compute_slices: c,
        memory_slices: c,
        memory_gib: f64::from(c) * 6.0,
        max_count: max,
        media_extensions: me,
        starts: starts.to_vec(),
    };
    Model {
        id: "A30-24GB",
        memory_gib: 24.0,
        memory_slices: 4,
        compute_slices: 4,
        profiles: vec![
            p("1g.6gb", 14, 0, 1, 4, &[0, 1, 2, 3], false),
            p("1g.6gb+me", 21, 7, 1, 1, &[0, 1, 2, 3], true),
            p("2g.12gb", 5, 1, 2, 2, &[0, 2], false),
            p("2g.12gb+me", 6, 8, 2, 1, &[0, 2], true),
            p("4g.24gb", 0, 3, 4, 1, &[0], false),
        ],
        family: "A30",
        product: product_of("A30-24GB"),
    }
}

const A100_80_NAMES: [&str; 7] = [
    "1g.10gb",
    "1g.10gb+me",
    "1g.20gb",
    "2g.20gb",
    "3g.40gb",
    "4g.40gb",
    "7g.80gb",
];
const A100_80_GIB: [f64; 7] = [9.75, 9.75, 19.5, 19.5, 39.25, 39.25, 78.5];

/// Every model, MIG-capable first.
pub fn models() -> &'static [Model] {
    use std::sync::LazyLock;
    static MODELS: LazyLock<Vec<Model>> = LazyLock::new(|| {
        vec![
            a30(),
            mig8(
                "A100-40GB",
                "A100",
                40.0,
                [
                    "1g.5gb",
                    "1g.5gb+me",
                    "1g.10gb",
                    "2g.10gb",
                    "3g.20gb",
                    "4g.20gb",
                    "7g.40gb",
                ],
                None,
            ),
            mig8("A100-80GB", "A100", 80.0, A100_80_NAMES, Some(A100_80_GIB)),
            mig8("H100-80GB", "H100", 80.0, A100_80_NAMES, Some(A100_80_GIB)),
            mig8(
                "H100-94GB",
                "H100",
                94.0,
                [
                    "1g.12gb",
                    "1g.12gb+me",
                    "1g.24gb",
                    "2g.24gb",
                    "3g.47gb",
                    "4g.47gb",
                    "7g.94gb",
                ],
                None,
            ),
            mig8(
                "H100-96GB",
                "H100",
                96.0,
                [
                    "1g.12gb",
                    "1g.12gb+me",
                    "1g.24gb",
                    "2g.24gb",
                    "3g.48gb",
                    "4g.48gb",
                    "7g.96gb",
                ],
                None,
            ),
            mig8(
                "H200-141GB",
                "H200",
                141.0,
                [
                    "1g.18gb",
                    "1g.18gb+me",
                    "1g.35gb",
                    "2g.35gb",
                    "3g.71gb",
                    "4g.71gb",
                    "7g.141gb",
                ],
                None,
            ),
            mig8(
                "GH200-96GB",
                "GH200",
                96.0,
                [
                    "1g.12gb",
                    "1g.12gb+me",
                    "1g.24gb",
                    "2g.24gb",
                    "3g.48gb",
                    "4g.48gb",
                    "7g.96gb",
                ],
                None,
            ),
            mig8(
                "GH200-144GB",
                "GH200",
                144.0,
                [
                    "1g.18gb",
                    "1g.18gb+me",
                    "1g.36gb",
                    "2g.36gb",
                    "3g.72gb",
                    "4g.72gb",
                    "7g.144gb",
                ],
                None,
            ),
            mig8(
                "B200-180GB",
                "B200",
                180.0,
                [
                    "1g.23gb",
                    "1g.23gb+me",
                    "1g.45gb",
                    "2g.45gb",
                    "3g.90gb",
                    "4g.90gb",
                    "7g.180gb",
                ],
                None,
            ),
            plain("L40S-48GB", "L40S", 48.0),
            plain("L4-24GB", "L4", 24.0),
            plain("A10-24GB", "A10", 24.0),
            plain("T4-16GB", "T4", 16.0),
        ]
    });
    &MODELS
}

/// The model with this catalog id.
pub fn model(id: &str) -> Option<&'static Model> {
    models().iter().find(|m| m.id == id)
}

/// Maps an NVML product name ("NVIDIA H100 80GB HBM3") and the memory the
/// driver reports to a catalog id: the family from the name, then the
/// member of that family whose memory is closest (names alone do not tell
/// an H100 NVL from a 96 GB H100, nor the two GH200s apart).
pub fn model_for_product(product: &str, total_memory_gib: f64) -> Option<&'static Model> {
    let upper = product.to_uppercase();
    let words: Vec<&str> = upper
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    // Longest family name first, so "GH200" is not read as "H200" and
    // "L40S" not as "L4".
    let mut families: Vec<&str> = models().iter().map(|m| m.family).collect();
    families.sort_by_key(|f| std::cmp::Reverse(f.len()));
    families.dedup();
    let family = families.into_iter().find(|f| words.contains(f))?;
    models()
        .iter()
        .filter(|m| m.family == family)
        .min_by(|a, b| {
            (a.memory_gib - total_memory_gib)
                .abs()
                .total_cmp(&(b.memory_gib - total_memory_gib).abs())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model's profiles as mig.md's table rows: (id, compute, memory,
    /// max, starts).
    fn table_rows(m: &Model) -> Vec<(u32, u8, u8, u8, Vec<u8>)> {
        m.profiles
            .iter()
            .map(|p| {
                (
                    p.nvml_id,
                    p.compute_slices,
                    p.memory_slices,
                    p.max_count,
                    p.starts.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn every_model_of_the_contract_is_there() {
        for id in [
            "A30-24GB",
            "A100-40GB",
            "A100-80GB",
            "H100-80GB",
            "H100-94GB",
            "H100-96GB",
            "H200-141GB",
            "GH200-96GB",
            "GH200-144GB",
            "B200-180GB",
        ] {
            let m = model(id).unwrap_or_else(|| panic!("{id} missing"));
            assert!(m.mig_capable(), "{id}");
        }
        for id in ["L40S-48GB", "A10-24GB", "T4-16GB"] {
            assert!(!model(id).unwrap().mig_capable(), "{id}");
        }
    }

    /// The 8-slice table of mig.md, row by row.
    #[test]
    fn eight_slice_profiles_match_mig_md() {
        let h100 = model("H100-80GB").unwrap();
        let rows = table_rows(h100);
        assert_eq!(
            rows,
            vec![
                (19, 1, 1, 7, vec![0, 1, 2, 3, 4, 5, 6]),
                (20, 1, 1, 1, vec![0, 1, 2, 3, 4, 5, 6]),
                (15, 1, 2, 4, vec![0, 2, 4, 6]),
                (14, 2, 2, 3, vec![0, 2, 4]),
                (9, 3, 4, 2, vec![0, 4]),
                (5, 4, 4, 1, vec![0]),
                (0, 7, 8, 1, vec![0]),
            ]
        );
        let enums: Vec<_> = h100.profiles.iter().map(|p| p.nvml_enum).collect();
        assert_eq!(enums, [0, 7, 9, 1, 2, 3, 4]);
        let gib: Vec<_> = h100.profiles.iter().map(|p| p.memory_gib).collect();
        assert_eq!(gib, [9.75, 9.75, 19.5, 19.5, 39.25, 39.25, 78.5]);
        assert_eq!(h100.profile("1g.10gb+me").unwrap().max_count, 1);
        assert!(h100.profile("1g.10gb+me").unwrap().media_extensions);
    }

    #[test]
    fn profile_names_per_model_match_mig_md() {
        let names = |id: &str| {
            model(id)
                .unwrap()
                .profiles
                .iter()
                .map(|p| p.name.clone())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            names("A100-40GB"),
            "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb"
        );
        assert_eq!(
            names("H100-94GB"),
            "1g.12gb 1g.12gb+me 1g.24gb 2g.24gb 3g.47gb 4g.47gb 7g.94gb"
        );
        assert_eq!(
            names("H200-141GB"),
            "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb"
        );
        assert_eq!(
            names("GH200-144GB"),
            "1g.18gb 1g.18gb+me 1g.36gb 2g.36gb 3g.72gb 4g.72gb 7g.144gb"
        );
        assert_eq!(
            names("B200-180GB"),
            "1g.23gb 1g.23gb+me 1g.45gb 2g.45gb 3g.90gb 4g.90gb 7g.180gb"
        );
        assert_eq!(
            names("A30-24GB"),
            "1g.6gb 1g.6gb+me 2g.12gb 2g.12gb+me 4g.24gb"
        );
        assert_eq!(
            model("H200-141GB")
                .unwrap()
                .profile("3g.71gb")
                .unwrap()
                .memory_gib,
            71.0
        );
    }

    #[test]
    fn a30_matches_mig_md() {
        let a30 = model("A30-24GB").unwrap();
        assert_eq!((a30.memory_slices, a30.compute_slices), (4, 4));
        let rows = table_rows(a30);
        assert_eq!(
            rows,
            vec![
                (14, 1, 1, 4, vec![0, 1, 2, 3]),
                (21, 1, 1, 1, vec![0, 1, 2, 3]),
                (5, 2, 2, 2, vec![0, 2]),
                (6, 2, 2, 1, vec![0, 2]),
                (0, 4, 4, 1, vec![0]),
            ]
        );
    }

    #[test]
    fn product_names_map_to_catalog_ids() {
        let id = |name, gib| model_for_product(name, gib).map(|m| m.id);
        assert_eq!(id("NVIDIA H100 80GB HBM3", 79.6), Some("H100-80GB"));
        assert_eq!(id("NVIDIA H100 PCIe", 79.6), Some("H100-80GB"));
        assert_eq!(id("NVIDIA H100 NVL", 93.6), Some("H100-94GB"));
        assert_eq!(id("NVIDIA H200", 139.8), Some("H200-141GB"));
        assert_eq!(id("NVIDIA GH200 480GB", 95.0), Some("GH200-96GB"));
        assert_eq!(id("NVIDIA GH200 144G HBM3e", 143.0), Some("GH200-144GB"));
        assert_eq!(id("NVIDIA A100-SXM4-40GB", 39.4), Some("A100-40GB"));
        assert_eq!(id("NVIDIA A100 80GB PCIe", 79.2), Some("A100-80GB"));
        assert_eq!(id("NVIDIA A30", 23.5), Some("A30-24GB"));
        assert_eq!(id("NVIDIA L40S", 44.5), Some("L40S-48GB"));
        assert_eq!(id("NVIDIA L4", 22.5), Some("L4-24GB"));
        assert_eq!(id("Tesla T4", 15.0), Some("T4-16GB"));
        assert_eq!(id("NVIDIA B200", 179.0), Some("B200-180GB"));
        assert_eq!(id("NVIDIA GeForce RTX 4090", 24.0), None);
        // Every model's own product name maps back to it.
        for m in models() {
            assert_eq!(
                id(m.product, m.memory_gib - 0.5),
                Some(m.id),
                "{}",
                m.product
            );
        }
    }

    /// Reads mig.md itself when the shared folder is beside the checkout
    /// (as in CI) and checks every 8-slice placement row against the catalog.
    #[test]
    fn catalog_agrees_with_the_shared_mig_md() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/design/mig.md");
        let Ok(text) = std::fs::read_to_string(&path) else {
            eprintln!(
                "*** SKIPPED: {} not found; the table tests above still hold ***",
                path.display()
            );
            return;
        };
        let h100 = model("H100-80GB").unwrap();
        let mut checked = 0;
        for line in text
            .lines()
            .filter(|l| l.starts_with("| ") && l.contains(") |"))
        {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // | 19 (1g) | 1 | 1 | 7 | {0,...} : 1 |
            let Some(id) = cells[1]
                .split_whitespace()
                .next()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let p = h100
                .profile_by_id(id)
                .unwrap_or_else(|| panic!("profile id {id} of mig.md missing"));
            assert_eq!(cells[2].parse::<u8>().unwrap(), p.compute_slices, "{line}");
            assert_eq!(cells[3].parse::<u8>().unwrap(), p.memory_slices, "{line}");
            assert_eq!(cells[4].parse::<u8>().unwrap(), p.max_count, "{line}");
            let starts: Vec<u8> = cells[5]
                .split(':')
                .next()
                .unwrap()
                .trim_matches(|c| c == '{' || c == '}' || c == ' ')
                .split(',')
                .map(|s| s.trim().parse().unwrap())
                .collect();
            assert_eq!(starts, p.starts, "{line}");
            checked += 1;
        }
        assert_eq!(checked, 7, "all seven 8-slice rows were read");
    }
}
