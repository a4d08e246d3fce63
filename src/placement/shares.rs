//! Time-sliced GPUs over time: shares of a GPU (a slice of its memory and
//! a turn in the scheduler's round-robin), whole GPUs, and several whole
//! GPUs on one node, each for a time window.
//!
//! A share fits a GPU for a window when, counting every booking whose
//! window overlaps (conservatively, as for MIG), the booked memory plus the
//! new share stays within the GPU's memory and the number of shares stays
//! within its `max_shares`; a whole GPU needs no overlapping booking at all.

use super::mig::{Refusal, Window};

/// A booking on a time-sliced GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Held {
    /// GPU memory the share may use; the whole memory for a whole GPU.
    pub memory_gib: f64,
    /// The whole GPU (no other booking may overlap).
    pub exclusive: bool,
    pub window: Window,
}

/// A time-sliced GPU.
#[derive(Debug, Clone)]
pub struct SharedGpu {
    pub node: usize,
    pub model: String,
    pub memory_gib: f64,
    pub max_shares: u32,
    pub held: Vec<Held>,
}

/// Share sizes tenants ask for (GiB) and how often (weights sum to 1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShareShapes(pub Vec<(f64, f64)>);

impl ShareShapes {
    /// FGD's typical shapes from counts of asked sizes (GiB, count): most
    /// asked first, taken until they cover 95 % of the asks. With fewer
    /// than 20 asks there is no telling; the smallest share (1 GiB) stands
    /// for them, so the measure is the memory no share can use at all.
    pub fn from_counts(counts: &[(i32, i64)]) -> ShareShapes {
        let total: i64 = counts.iter().map(|c| c.1.max(0)).sum();
        if total < 20 {
            return ShareShapes(vec![(1.0, 1.0)]);
        }
        let mut list: Vec<(i32, i64)> = counts.iter().copied().filter(|c| c.1 > 0).collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        let mut taken = Vec::new();
        let mut covered = 0;
        for (gib, n) in list {
            if covered as f64 >= 0.95 * total as f64 {
                break;
            }
            covered += n;
            taken.push((gib, n));
        }
        ShareShapes(
            taken
                .into_iter()
                .map(|(gib, n)| (f64::from(gib), n as f64 / covered as f64))
                .collect(),
        )
    }
}

/// FGD's fragmentation of a time-sliced GPU over `w` (Weng et al., USENIX
/// ATC '23), as a fraction of the GPU: its free memory weighted by how many
/// of the asked share sizes cannot use it (a size that fits can use it; a
/// size that does not, or any size once the share limit is reached, cannot).
/// A GPU held whole has nothing free.
pub fn fragmentation(g: &SharedGpu, w: Window, shapes: &ShareShapes) -> f64 {
    g.usage(w)
        .map_or(0.0, |(used, count)| unusable(g, used, count, shapes))
}

/// FGD's fragmentation of `g` with `used` GiB booked by `count` shares.
fn unusable(g: &SharedGpu, used: f64, count: u32, shapes: &ShareShapes) -> f64 {
    let free = (g.memory_gib - used).max(0.0);
    if g.memory_gib <= 0.0 || free <= 0.0 {
        return 0.0;
    }
    let slot = count < g.max_shares;
    let weight: f64 = shapes
        .0
        .iter()
        .filter(|(gib, _)| !slot || *gib > free)
        .map(|(_, w)| w)
        .sum();
    weight * free / g.memory_gib
}

impl SharedGpu {
    fn overlapping(&self, w: Window) -> impl Iterator<Item = &Held> {
        self.held.iter().filter(move |h| h.window.overlaps(w))
    }

    /// Memory booked over `w` and by how many shares; None when the GPU
    /// is held whole.
    fn usage(&self, w: Window) -> Option<(f64, u32)> {
        let mut used = 0.0;
        let mut count = 0;
        for h in self.overlapping(w) {
            if h.exclusive {
                return None;
            }
            used += h.memory_gib;
            count += 1;
        }
        Some((used, count))
    }

    /// Memory left for a new share over `w`, if a share fits at all.
    fn room_for_share(&self, w: Window) -> Option<f64> {
        let (used, count) = self.usage(w)?;
        (count < self.max_shares).then_some(self.memory_gib - used)
    }

    fn free_for_whole(&self, w: Window) -> bool {
        self.overlapping(w).next().is_none()
    }
}

fn model_ok(g: &SharedGpu, model: Option<&str>) -> bool {
    model.is_none_or(|m| g.model == m)
}

fn earliest<F: Fn(Window) -> bool>(gpus: &[SharedGpu], window: Window, fits: F) -> Option<i64> {
    let mut ends: Vec<i64> = gpus
        .iter()
        .flat_map(|g| g.held.iter().map(|h| h.window.end))
        .filter(|&e| e > window.start)
        .collect();
    ends.sort_unstable();
    ends.dedup();
    ends.into_iter().find(|&s| {
        fits(Window {
            start: s,
            end: s + window.len(),
        })
    })
}

fn pick_share(
    gpus: &[SharedGpu],
    memory_gib: f64,
    model: Option<&str>,
    w: Window,
    shapes: &ShareShapes,
) -> Option<usize> {
    // FGD: the GPU whose fragmentation grows least; among equals best fit,
    // the GPU left with the least memory (packs, keeping other GPUs free for
    // large shares); then the first.
    let key = |i: usize, g: &SharedGpu, (used, count): (f64, u32)| {
        let before = unusable(g, used, count, shapes);
        let after = unusable(g, used + memory_gib, count + 1, shapes);
        // Rounded to 1/1000 of a GPU, so that float noise cannot outrank
        // the best fit.
        let growth = ((after - before) * 1000.0).round();
        (growth, g.memory_gib - used - memory_gib, i)
    };
    gpus.iter()
        .enumerate()
        .filter(|(_, g)| model_ok(g, model))
        .filter_map(|(i, g)| {
            let (used, count) = g.usage(w)?;
            (count < g.max_shares && g.memory_gib - used >= memory_gib)
                .then(|| key(i, g, (used, count)))
        })
        .min_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.1.total_cmp(&b.1))
                .then(a.2.cmp(&b.2))
        })
        .map(|k| k.2)
}

/// Places a share of `memory_gib` for `window`, keeping room for the share
/// sizes tenants ask for (`shapes`).
pub fn place_share(
    gpus: &[SharedGpu],
    memory_gib: f64,
    model: Option<&str>,
    window: Window,
    shapes: &ShareShapes,
) -> Result<usize, Refusal> {
    if memory_gib.is_nan() || memory_gib <= 0.0 {
        return Err(Refusal {
            reason: "a share needs some GPU memory".into(),
            earliest_start: None,
        });
    }
    if let Some(i) = pick_share(gpus, memory_gib, model, window, shapes) {
        return Ok(i);
    }
    let largest = gpus
        .iter()
        .filter(|g| model_ok(g, model))
        .map(|g| g.memory_gib)
        .fold(0.0, f64::max);
    if largest < memory_gib {
        return Err(Refusal {
            reason: format!(
                "no time-sliced GPU{} has {memory_gib} GiB",
                model.map(|m| format!(" of model {m}")).unwrap_or_default()
            ),
            earliest_start: None,
        });
    }
    Err(Refusal {
        reason: format!(
            "no time-sliced GPU has {memory_gib} GiB and a free share in the requested window"
        ),
        // Per GPU, as for MIG: only its own ends can make room on it.
        earliest_start: gpus
            .iter()
            .filter(|g| model_ok(g, model) && g.memory_gib >= memory_gib)
            .filter_map(|g| {
                earliest(std::slice::from_ref(g), window, |w| {
                    g.room_for_share(w).is_some_and(|room| room >= memory_gib)
                })
            })
            .min(),
    })
}

fn pick_whole(
    gpus: &[SharedGpu],
    count: usize,
    model: Option<&str>,
    w: Window,
) -> Option<Vec<usize>> {
    // The node with the fewest free GPUs that still has `count` (packs).
    let mut by_node: std::collections::BTreeMap<usize, Vec<usize>> =
        std::collections::BTreeMap::new();
    for (i, g) in gpus.iter().enumerate() {
        if model_ok(g, model) && g.free_for_whole(w) {
            by_node.entry(g.node).or_default().push(i);
        }
    }
    by_node
        .into_values()
        .filter(|free| free.len() >= count)
        .min_by_key(|free| free.len())
        .map(|free| free.into_iter().take(count).collect())
}

/// Places `count` whole GPUs on one node for `window`.
pub fn place_whole(
    gpus: &[SharedGpu],
    count: usize,
    model: Option<&str>,
    window: Window,
) -> Result<Vec<usize>, Refusal> {
    if count == 0 {
        return Err(Refusal {
            reason: "ask for at least one GPU".into(),
            earliest_start: None,
        });
    }
    if let Some(v) = pick_whole(gpus, count, model, window) {
        return Ok(v);
    }
    let mut per_node: std::collections::BTreeMap<usize, usize> = std::collections::BTreeMap::new();
    for g in gpus.iter().filter(|g| model_ok(g, model)) {
        *per_node.entry(g.node).or_default() += 1;
    }
    if per_node.values().all(|&n| n < count) {
        return Err(Refusal {
            reason: format!("no node has {count} such GPUs"),
            earliest_start: None,
        });
    }
    Err(Refusal {
        reason: format!("no node has {count} free GPUs in the requested window"),
        earliest_start: earliest(gpus, window, |w| {
            pick_whole(gpus, count, model, w).is_some()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn l40s(node: usize) -> SharedGpu {
        SharedGpu {
            node,
            model: "L40S-48GB".into(),
            memory_gib: 48.0,
            max_shares: 4,
            held: Vec::new(),
        }
    }

    const W: Window = Window {
        start: 0,
        end: 3600,
    };

    fn one_gib() -> ShareShapes {
        ShareShapes::from_counts(&[])
    }

    fn share(gib: f64) -> Held {
        Held {
            memory_gib: gib,
            exclusive: false,
            window: W,
        }
    }

    #[test]
    fn fragmentation_is_free_memory_the_asked_sizes_cannot_use() {
        // Half the asks are 8 GiB, half 24 GiB.
        let shapes = ShareShapes::from_counts(&[(8, 50), (24, 50)]);
        assert_eq!(shapes.0.len(), 2);
        let mut g = l40s(0);
        assert_eq!(
            fragmentation(&g, W, &shapes),
            0.0,
            "an empty GPU strands nothing"
        );
        g.held.push(share(32.0));
        // 16 GiB free: 8 GiB fits, 24 does not: half of a third of the GPU.
        assert!((fragmentation(&g, W, &shapes) - 0.5 * 16.0 / 48.0).abs() < 1e-9);
        // Share limit reached: no size can use what is left.
        g.held.extend([share(1.0), share(1.0), share(1.0)]);
        assert!((fragmentation(&g, W, &shapes) - 13.0 / 48.0).abs() < 1e-9);
        // Too few asks to tell: only memory no share can use counts.
        assert_eq!(ShareShapes::from_counts(&[(8, 3)]), one_gib());
        // The shapes cover 95 % of the asks, most asked first.
        let s = ShareShapes::from_counts(&[(4, 90), (8, 6), (40, 4)]);
        assert_eq!(s.0.iter().map(|x| x.0).collect::<Vec<_>>(), vec![4.0, 8.0]);
    }

    #[test]
    fn shares_go_where_they_strand_least() {
        // 24 GiB asks dominate. GPU 0 has 30 GiB free, GPU 1 has 40 GiB:
        // best fit would put a 16 GiB share on GPU 0 (14 left, too little
        // for 24), FGD puts it on GPU 1 (24 left, still usable).
        let shapes = ShareShapes::from_counts(&[(24, 80), (16, 20)]);
        let mut g = vec![l40s(0), l40s(0)];
        g[0].held.push(share(18.0));
        g[1].held.push(share(8.0));
        assert_eq!(place_share(&g, 16.0, None, W, &shapes).unwrap(), 1);
        assert_eq!(place_share(&g, 16.0, None, W, &one_gib()).unwrap(), 0);
    }

    #[test]
    fn shares_pack_and_whole_gpus_stay_free() {
        let mut g = vec![l40s(0), l40s(0), l40s(1)];
        let i = place_share(&g, 10.0, None, W, &one_gib()).unwrap();
        g[i].held.push(Held {
            memory_gib: 10.0,
            exclusive: false,
            window: W,
        });
        // The second share joins the first GPU rather than opening another.
        assert_eq!(place_share(&g, 10.0, None, W, &one_gib()).unwrap(), i);
        // Two whole GPUs on one node: node 0 still has one free, node 1 one:
        // neither has two.
        assert!(place_whole(&g, 2, None, W).is_err());
        assert_eq!(place_whole(&g, 1, None, W).unwrap().len(), 1);
    }

    #[test]
    fn refusals_say_why_and_when() {
        let mut g = vec![l40s(0)];
        g[0].held.push(Held {
            memory_gib: 48.0,
            exclusive: true,
            window: W,
        });
        let r = place_share(
            &g,
            8.0,
            None,
            Window {
                start: 600,
                end: 1200,
            },
            &one_gib(),
        )
        .unwrap_err();
        assert_eq!(r.earliest_start, Some(3600));
        let r = place_share(&g, 80.0, None, W, &one_gib()).unwrap_err();
        assert!(r.reason.contains("has 80 GiB"), "{}", r.reason);
        assert_eq!(r.earliest_start, None);
        let r = place_whole(&g, 3, None, W).unwrap_err();
        assert_eq!(r.reason, "no node has 3 such GPUs");
        assert!(place_share(&g, 8.0, Some("A10-24GB"), W, &one_gib()).is_err());
    }

    proptest! {
        /// Shares never exceed a GPU's memory or its share limit at any
        /// moment, and whole GPUs are never shared.
        #[test]
        fn shares_respect_memory_and_limits(
            reqs in proptest::collection::vec((1u32..40, 0i64..12, 1i64..6, any::<bool>()), 1..80),
            asked in proptest::collection::vec((1i32..48, 0i64..30), 0..6),
        ) {
            // Any asked sizes steer where shares go, never whether they fit.
            let shapes = ShareShapes::from_counts(&asked);
            let mut g = vec![l40s(0), l40s(0), l40s(1)];
            for (mem, start, len, whole) in reqs {
                let w = Window { start: start * 600, end: (start + len) * 600 };
                if whole {
                    if let Ok(v) = place_whole(&g, 1, None, w) {
                        let gib = g[v[0]].memory_gib;
                        g[v[0]].held.push(Held { memory_gib: gib, exclusive: true, window: w });
                    }
                } else if let Ok(i) = place_share(&g, f64::from(mem), None, w, &shapes) {
                    g[i].held.push(Held { memory_gib: f64::from(mem), exclusive: false, window: w });
                }
            }
            for gpu in &g {
                for t in (0..20).map(|k| k * 600 + 1) {
                    let now: Vec<&Held> = gpu.held.iter().filter(|h| h.window.start <= t && t < h.window.end).collect();
                    let mem: f64 = now.iter().map(|h| h.memory_gib).sum();
                    prop_assert!(mem <= gpu.memory_gib + 1e-9);
                    prop_assert!(now.len() as u32 <= gpu.max_shares);
                    if now.iter().any(|h| h.exclusive) {
                        prop_assert_eq!(now.len(), 1);
                    }
                }
            }
        }
    }
}
