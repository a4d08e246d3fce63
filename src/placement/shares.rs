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

impl SharedGpu {
    fn overlapping(&self, w: Window) -> impl Iterator<Item = &Held> {
        self.held.iter().filter(move |h| h.window.overlaps(w))
    }

    /// Memory left for a new share over `w`, if a share fits at all.
    fn room_for_share(&self, w: Window) -> Option<f64> {
        let mut used = 0.0;
        let mut count = 0;
        for h in self.overlapping(w) {
            if h.exclusive {
                return None;
            }
            used += h.memory_gib;
            count += 1;
        }
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
) -> Option<usize> {
    // Best fit: the GPU left with the least memory after the share (packs,
    // keeping other GPUs free for whole-GPU bookings); first among equals.
    gpus.iter()
        .enumerate()
        .filter(|(_, g)| model_ok(g, model))
        .filter_map(|(i, g)| {
            g.room_for_share(w)
                .filter(|&room| room >= memory_gib)
                .map(|room| (i, room - memory_gib))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(i, _)| i)
}

/// Places a share of `memory_gib` for `window`.
pub fn place_share(
    gpus: &[SharedGpu],
    memory_gib: f64,
    model: Option<&str>,
    window: Window,
) -> Result<usize, Refusal> {
    if memory_gib.is_nan() || memory_gib <= 0.0 {
        return Err(Refusal {
            reason: "a share needs some GPU memory".into(),
            earliest_start: None,
        });
    }
    if let Some(i) = pick_share(gpus, memory_gib, model, window) {
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

    #[test]
    fn shares_pack_and_whole_gpus_stay_free() {
        let mut g = vec![l40s(0), l40s(0), l40s(1)];
        let i = place_share(&g, 10.0, None, W).unwrap();
        g[i].held.push(Held {
            memory_gib: 10.0,
            exclusive: false,
            window: W,
        });
        // The second share joins the first GPU rather than opening another.
        assert_eq!(place_share(&g, 10.0, None, W).unwrap(), i);
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
        )
        .unwrap_err();
        assert_eq!(r.earliest_start, Some(3600));
        let r = place_share(&g, 80.0, None, W).unwrap_err();
        assert!(r.reason.contains("has 80 GiB"), "{}", r.reason);
        assert_eq!(r.earliest_start, None);
        let r = place_whole(&g, 3, None, W).unwrap_err();
        assert_eq!(r.reason, "no node has 3 such GPUs");
        assert!(place_share(&g, 8.0, Some("A10-24GB"), W).is_err());
    }

    proptest! {
        /// Shares never exceed a GPU's memory or its share limit at any
        /// moment, and whole GPUs are never shared.
        #[test]
        fn shares_respect_memory_and_limits(reqs in proptest::collection::vec((1u32..40, 0i64..12, 1i64..6, any::<bool>()), 1..80)) {
            let mut g = vec![l40s(0), l40s(0), l40s(1)];
            for (mem, start, len, whole) in reqs {
                let w = Window { start: start * 600, end: (start + len) * 600 };
                if whole {
                    if let Ok(v) = place_whole(&g, 1, None, w) {
                        let gib = g[v[0]].memory_gib;
                        g[v[0]].held.push(Held { memory_gib: gib, exclusive: true, window: w });
                    }
                } else if let Ok(i) = place_share(&g, f64::from(mem), None, w) {
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
