//! Decision latency of MIG placement on a large fleet with many bookings.
//!
//! A fleet of H100-80GB GPUs is filled with bookings of random profiles,
//! placements and time windows over a week (seeded), then single decisions
//! are timed for random requests in random windows. The fleet is not changed
//! by the timed decisions, so every decision sees the same load.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::gpu::catalog;
use crate::placement::mig::{Booked, MigFleet, MigGpu, MigPolicy, ProfileMix, Window};

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub policy: String,
    pub gpus: usize,
    pub bookings: usize,
    pub decisions: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Building the fleet's time index, once (not in the decisions).
    pub index_ms: f64,
}

const WEEK: i64 = 7 * 24 * 3600;
const PROFILES: [&str; 5] = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"];

/// Builds the loaded fleet.
pub fn fleet(gpus: usize, bookings: usize, seed: u64) -> (Vec<MigGpu>, ProfileMix) {
    let model = catalog::model("H100-80GB").unwrap_or(&catalog::models()[1]);
    let mix = ProfileMix(vec![
        ("1g.10gb".into(), 0.4),
        ("2g.20gb".into(), 0.2),
        ("3g.40gb".into(), 0.2),
        ("4g.40gb".into(), 0.1),
        ("7g.80gb".into(), 0.1),
    ]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut fleet: Vec<MigGpu> = (0..gpus)
        .map(|_| MigGpu {
            model,
            bookings: Vec::new(),
        })
        .collect();
    let mut made = 0;
    let mut attempts = 0;
    while made < bookings && attempts < bookings * 20 {
        attempts += 1;
        let g = rng.gen_range(0..gpus);
        let name = PROFILES[rng.gen_range(0..PROFILES.len())];
        let Some(p) = model.profile(name) else {
            continue;
        };
        let start = rng.gen_range(0..WEEK);
        let w = Window {
            start,
            end: start + rng.gen_range(1..=24) * 3600,
        };
        let present: Vec<_> = fleet[g]
            .bookings
            .iter()
            .filter(|b| b.window.overlaps(w))
            .map(|b| crate::gpu::mig::Existing {
                profile_id: b.profile_id,
                placement: b.placement,
            })
            .collect();
        if let Some(pl) = crate::gpu::mig::free_placements(model, &present, p.nvml_id).first() {
            fleet[g].bookings.push(Booked {
                profile_id: p.nvml_id,
                placement: *pl,
                window: w,
            });
            made += 1;
        }
    }
    (fleet, mix)
}

/// Times `decisions` placements per policy.
pub fn run(gpus: usize, bookings: usize, decisions: usize, seed: u64) -> Vec<Latency> {
    let (gpu_list, mix) = fleet(gpus, bookings, seed);
    let booked: usize = gpu_list.iter().map(|g| g.bookings.len()).sum();
    // Indexed once, as a long-lived scheduler holds it.
    let t = Instant::now();
    let fleet = MigFleet::new(&gpu_list);
    let index_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut out = Vec::new();
    for policy in MigPolicy::ALL {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 1);
        let mut times: Vec<f64> = Vec::with_capacity(decisions);
        for _ in 0..decisions {
            let name = PROFILES[rng.gen_range(0..PROFILES.len())];
            let start = rng.gen_range(0..WEEK);
            let w = Window {
                start,
                end: start + 4 * 3600,
            };
            let t = Instant::now();
            let r = fleet.place(name, None, w, policy, &mix);
            times.push(t.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(r.ok());
        }
        times.sort_by(f64::total_cmp);
        let pct = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
        out.push(Latency {
            policy: policy.name().to_string(),
            gpus,
            bookings: booked,
            decisions,
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            max_us: times.last().copied().unwrap_or(0.0),
            index_ms,
        });
    }
    out
}
