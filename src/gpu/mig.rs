//! NVIDIA's rules for creating a GPU instance on a MIG GPU, in one place:
//! the simulated backend and the stand-in `libnvidia-ml` both call
//! [`check_create`], so they cannot disagree.

use super::catalog::{Model, Placement, Profile};
use super::codes;

/// A GPU instance present on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Existing {
    pub profile_id: u32,
    pub placement: Placement,
}

/// Why NVML refuses a creation, with the NVML return code it maps to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigError {
    /// NVML_ERROR_NOT_SUPPORTED: the model has no such profile.
    #[error("{model} has no GPU-instance profile with id {profile_id}")]
    UnknownProfile { model: String, profile_id: u32 },
    /// NVML_ERROR_INVALID_ARGUMENT: not one of the profile's placements.
    #[error(
        "{profile} cannot be placed at slice {start} (size {size}); allowed starts: {allowed:?}"
    )]
    BadPlacement {
        profile: String,
        start: u8,
        size: u8,
        allowed: Vec<u8>,
    },
    /// NVML_ERROR_INSUFFICIENT_RESOURCES: the profile's maximum count is reached.
    #[error("{profile}: at most {max} per GPU")]
    MaxCount { profile: String, max: u8 },
    /// NVML_ERROR_INSUFFICIENT_RESOURCES: only one `+me` instance per GPU.
    #[error("{profile}: the media engines already belong to another +me instance")]
    MediaEnginesTaken { profile: String },
    /// NVML_ERROR_INSUFFICIENT_RESOURCES: memory slices already used.
    #[error("{profile} at slices {start}..{end} overlaps an existing instance at {other_start}..{other_end}")]
    Overlap {
        profile: String,
        start: u8,
        end: u8,
        other_start: u8,
        other_end: u8,
    },
    /// NVML_ERROR_INSUFFICIENT_RESOURCES: not enough compute slices left.
    #[error("{profile} needs {need} compute slices, {free} are free")]
    ComputeSlices { profile: String, need: u8, free: u8 },
}

impl MigError {
    /// The NVML return code NVIDIA's library gives for this refusal.
    pub fn nvml_code(&self) -> u32 {
        match self {
            MigError::UnknownProfile { .. } => codes::NOT_SUPPORTED,
            MigError::BadPlacement { .. } => codes::INVALID_ARGUMENT,
            _ => codes::INSUFFICIENT_RESOURCES,
        }
    }
}

fn profile_of(model: &Model, profile_id: u32) -> Result<&Profile, MigError> {
    model
        .profile_by_id(profile_id)
        .ok_or_else(|| MigError::UnknownProfile {
            model: model.id.to_string(),
            profile_id,
        })
}

/// Checks that a GPU instance of `profile_id` may be created at `placement`
/// next to `existing` instances.
pub fn check_create(
    model: &Model,
    existing: &[Existing],
    profile_id: u32,
    placement: Placement,
) -> Result<(), MigError> {
    let profile = profile_of(model, profile_id)?;
    if !profile.allows(placement) {
        return Err(MigError::BadPlacement {
            profile: profile.name.clone(),
            start: placement.start,
            size: placement.size,
            allowed: profile.starts.clone(),
        });
    }
    let same = existing
        .iter()
        .filter(|e| e.profile_id == profile_id)
        .count();
    if same >= usize::from(profile.max_count) {
        return Err(MigError::MaxCount {
            profile: profile.name.clone(),
            max: profile.max_count,
        });
    }
    if profile.media_extensions
        && existing.iter().any(|e| {
            model
                .profile_by_id(e.profile_id)
                .is_some_and(|p| p.media_extensions)
        })
    {
        return Err(MigError::MediaEnginesTaken {
            profile: profile.name.clone(),
        });
    }
    if let Some(other) = existing.iter().find(|e| e.placement.overlaps(placement)) {
        return Err(MigError::Overlap {
            profile: profile.name.clone(),
            start: placement.start,
            end: placement.end(),
            other_start: other.placement.start,
            other_end: other.placement.end(),
        });
    }
    // Summed wide: a long window may count more bookings than a GPU
    // holds at once (each on its own time), past what a u8 carries.
    let used: u32 = existing
        .iter()
        .filter_map(|e| model.profile_by_id(e.profile_id))
        .map(|p| u32::from(p.compute_slices))
        .sum();
    let free = u8::try_from(u32::from(model.compute_slices).saturating_sub(used)).unwrap_or(0);
    if profile.compute_slices > free {
        return Err(MigError::ComputeSlices {
            profile: profile.name.clone(),
            need: profile.compute_slices,
            free,
        });
    }
    Ok(())
}

/// The placements where `profile_id` could be created now, lowest first
/// (what `nvmlDeviceGetGpuInstanceRemainingCapacity` counts).
pub fn free_placements(model: &Model, existing: &[Existing], profile_id: u32) -> Vec<Placement> {
    match model.profile_by_id(profile_id) {
        Some(p) => p
            .placements()
            .filter(|&pl| check_create(model, existing, profile_id, pl).is_ok())
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::catalog::model;
    use proptest::prelude::*;

    fn at(model: &Model, name: &str, start: u8) -> Existing {
        let p = model.profile(name).unwrap();
        Existing {
            profile_id: p.nvml_id,
            placement: Placement {
                start,
                size: p.memory_slices,
            },
        }
    }

    fn create(
        m: &Model,
        existing: &mut Vec<Existing>,
        name: &str,
        start: u8,
    ) -> Result<(), MigError> {
        let e = at(m, name, start);
        check_create(m, existing, e.profile_id, e.placement)?;
        existing.push(e);
        Ok(())
    }

    #[test]
    fn the_valid_full_layouts_of_mig_md_fit() {
        let m = model("H100-80GB").unwrap();
        let mut g = Vec::new();
        for (name, start) in [
            ("3g.40gb", 4),
            ("2g.20gb", 0),
            ("1g.10gb", 2),
            ("1g.10gb", 3),
        ] {
            create(m, &mut g, name, start).unwrap();
        }
        let mut g = Vec::new();
        create(m, &mut g, "4g.40gb", 0).unwrap();
        create(m, &mut g, "3g.40gb", 4).unwrap();
        let mut g = Vec::new();
        for s in 0..7 {
            create(m, &mut g, "1g.10gb", s).unwrap();
        }
        // An eighth 1g has neither a placement nor a count left.
        assert!(matches!(
            create(m, &mut g, "1g.10gb", 7),
            Err(MigError::BadPlacement { .. })
        ));
    }

    #[test]
    fn fragmentation_example_of_mig_md() {
        let m = model("H100-80GB").unwrap();
        let mut g = Vec::new();
        create(m, &mut g, "1g.10gb", 2).unwrap();
        create(m, &mut g, "1g.10gb", 5).unwrap();
        // 5 compute and 6 memory slices free, yet no 3g or 4g fits.
        assert!(free_placements(m, &g, m.profile("3g.40gb").unwrap().nvml_id).is_empty());
        assert!(free_placements(m, &g, m.profile("4g.40gb").unwrap().nvml_id).is_empty());
        // First-fit 3g at 0 makes a later 4g impossible.
        let mut g = Vec::new();
        create(m, &mut g, "3g.40gb", 0).unwrap();
        assert!(matches!(
            create(m, &mut g, "4g.40gb", 0),
            Err(MigError::Overlap { .. })
        ));
    }

    #[test]
    fn refusals_carry_nvml_codes() {
        let m = model("A100-80GB").unwrap();
        let mut g = Vec::new();
        let e = create(m, &mut g, "3g.40gb", 2).unwrap_err();
        assert_eq!(e.nvml_code(), 2, "{e}");
        create(m, &mut g, "1g.10gb+me", 0).unwrap();
        let e = create(m, &mut g, "1g.10gb+me", 1).unwrap_err();
        assert_eq!(e.nvml_code(), 23);
        assert!(matches!(e, MigError::MaxCount { .. }));
        let e = create(m, &mut g, "2g.20gb", 0).unwrap_err();
        assert!(matches!(e, MigError::Overlap { .. }), "{e}");
        assert_eq!(
            check_create(m, &g, 99, Placement { start: 0, size: 1 })
                .unwrap_err()
                .nvml_code(),
            3
        );
        let a30 = model("A30-24GB").unwrap();
        let mut g = Vec::new();
        create(a30, &mut g, "2g.12gb+me", 0).unwrap();
        assert!(matches!(
            create(a30, &mut g, "1g.6gb+me", 2),
            Err(MigError::MediaEnginesTaken { .. })
        ));
    }

    proptest! {
        /// Whatever order of creations is tried, what gets accepted never
        /// overlaps, never exceeds counts or compute slices, and uses only
        /// allowed placements.
        #[test]
        fn accepted_layouts_are_always_valid(ops in proptest::collection::vec((0usize..7, 0u8..8), 1..40)) {
            let m = model("H100-80GB").unwrap();
            let mut g: Vec<Existing> = Vec::new();
            for (pi, start) in ops {
                let p = &m.profiles[pi];
                let _ = create(m, &mut g, &p.name, start);
            }
            for (i, a) in g.iter().enumerate() {
                let p = m.profile_by_id(a.profile_id).unwrap();
                prop_assert!(p.allows(a.placement));
                for b in &g[i + 1..] {
                    prop_assert!(!a.placement.overlaps(b.placement));
                }
                prop_assert!(g.iter().filter(|e| e.profile_id == a.profile_id).count() <= usize::from(p.max_count));
            }
            let compute: u8 = g.iter().map(|e| m.profile_by_id(e.profile_id).unwrap().compute_slices).sum();
            prop_assert!(compute <= 7);
        }
    }
}
