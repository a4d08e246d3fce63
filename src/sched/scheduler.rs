//! The time-slice scheduler of one shared GPU, as a pure state machine
//! driven by a virtual clock (milliseconds): a round-robin over the shares
//! that have processes, each running for its slice while the others are
//! frozen. Base slices follow priority (HIGH 100 ms, NORMAL 50 ms, LOW
//! 25 ms), so busy shares split the GPU 4:2:1. Every 5 s slices adapt to
//! load without breaking that ratio: a mostly idle share (used under 30 %
//! of the time it was given) shrinks x0.8 down to 10 ms, a busy one (over
//! 70 %) grows back x1.2 up to twice its base, never past 200 ms. QoS: a
//! hungry share whose achieved part of the GPU stays under 90 % of its
//! guarantee for more than 3 windows in a row is boosted to HIGH until it
//! reaches its guarantee again; good windows halve the run of violations
//! instead of clearing it (decay), so a share that keeps slipping back is
//! boosted again sooner.
//!
//! The caller measures how much of each slice a share used (CPU time of its
//! cgroup, or NVML per-process utilisation) and reports it at the slice's
//! end; nothing here reads a clock or the hardware.

use crate::domain::Priority;

/// The slowest and fastest any slice may be.
pub const MIN_SLICE_MS: f64 = 10.0;
pub const MAX_SLICE_MS: f64 = 200.0;
/// How often slices adapt and QoS is judged.
pub const WINDOW_MS: u64 = 5_000;

/// A priority's base slice.
pub fn base_slice_ms(p: Priority) -> f64 {
    match p {
        Priority::High => 100.0,
        Priority::Normal => 50.0,
        Priority::Low => 25.0,
    }
}

/// What a share asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareSpec {
    pub id: i64,
    pub priority: Priority,
    /// Guaranteed part of the GPU's time, percent (0: none).
    pub guaranteed_pct: f64,
    /// Optional bounds on its slice.
    pub min_slice_ms: Option<f64>,
    pub max_slice_ms: Option<f64>,
}

/// A share's scheduling state (what the booking JSON shows).
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    pub spec: ShareSpec,
    /// Multiplier on the base slice, adapted every window.
    pub factor: f64,
    pub boosted: bool,
    /// Windows in a row below 90 % of the guarantee.
    pub violations_in_row: u32,
    pub violations: u64,
    pub boosts: u64,
    /// Achieved part of the GPU in the last window, percent.
    pub achieved_pct: f64,
    // This window: time given, time used.
    given_ms: f64,
    used_ms: f64,
}

impl Share {
    fn new(spec: ShareSpec) -> Share {
        Share {
            spec,
            factor: 1.0,
            boosted: false,
            violations_in_row: 0,
            violations: 0,
            boosts: 0,
            achieved_pct: 0.0,
            given_ms: 0.0,
            used_ms: 0.0,
        }
    }

    /// The priority it runs at now (HIGH while boosted).
    pub fn effective_priority(&self) -> Priority {
        if self.boosted {
            Priority::High
        } else {
            self.spec.priority
        }
    }

    /// Its current slice in milliseconds.
    pub fn slice_ms(&self) -> f64 {
        let base = base_slice_ms(self.effective_priority());
        let mut s = (base * self.factor).clamp(MIN_SLICE_MS, (2.0 * base).min(MAX_SLICE_MS));
        if let Some(min) = self.spec.min_slice_ms {
            s = s.max(min);
        }
        if let Some(max) = self.spec.max_slice_ms {
            s = s.min(max);
        }
        s.clamp(MIN_SLICE_MS, MAX_SLICE_MS)
    }
}

/// What the enforcer should do now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// The share that runs (all others frozen); `None`: nobody to run.
    pub run: Option<i64>,
    /// Until when (virtual ms); the caller ticks again then.
    pub until: u64,
    /// Only one share is runnable: never freeze it.
    pub alone: bool,
}

/// One GPU's scheduler.
#[derive(Debug, Clone, Default)]
pub struct GpuScheduler {
    shares: Vec<Share>,
    /// Index of the running share and when its slice started.
    running: Option<(usize, u64)>,
    window_start: u64,
}

impl GpuScheduler {
    pub fn shares(&self) -> &[Share] {
        &self.shares
    }

    pub fn share(&self, id: i64) -> Option<&Share> {
        self.shares.iter().find(|s| s.spec.id == id)
    }

    /// Adds a share (a new booking on this GPU), or updates its spec.
    pub fn add(&mut self, spec: ShareSpec) {
        match self.shares.iter_mut().find(|s| s.spec.id == spec.id) {
            Some(s) => s.spec = spec,
            None => self.shares.push(Share::new(spec)),
        }
    }

    /// Removes a share (its booking ended).
    pub fn remove(&mut self, id: i64) {
        if let Some(i) = self.shares.iter().position(|s| s.spec.id == id) {
            self.shares.remove(i);
            self.running = match self.running {
                Some((r, _)) if r == i => None,
                Some((r, t)) if r > i => Some((r - 1, t)),
                other => other,
            };
        }
    }

    /// Advances to `now`. `used_ms` is how much of the slice that just ended
    /// (if one did) its share actually used; `runnable(id)` says whether a
    /// share has processes now. Returns who runs next and until when.
    pub fn tick(
        &mut self,
        now: u64,
        used_ms: Option<f64>,
        runnable: impl Fn(i64) -> bool,
    ) -> Decision {
        // Close the running slice.
        let mut last = None;
        if let Some((i, started)) = self.running.take() {
            let given = now.saturating_sub(started) as f64;
            if let Some(s) = self.shares.get_mut(i) {
                s.given_ms += given;
                s.used_ms += used_ms.unwrap_or(given).clamp(0.0, given);
            }
            last = Some(i);
        }
        if now >= self.window_start + WINDOW_MS {
            self.adapt(now);
        }
        let n = self.shares.len();
        let ready: Vec<usize> = (0..n)
            .filter(|&i| runnable(self.shares[i].spec.id))
            .collect();
        if ready.is_empty() {
            return Decision {
                run: None,
                until: now + MIN_SLICE_MS as u64,
                alone: false,
            };
        }
        // The next runnable share after the last one, round-robin.
        let next = match last {
            Some(l) => ready.iter().copied().find(|&i| i > l).unwrap_or(ready[0]),
            None => ready[0],
        };
        let slice = self.shares[next].slice_ms();
        self.running = Some((next, now));
        Decision {
            run: Some(self.shares[next].spec.id),
            until: now + slice.round().max(1.0) as u64,
            alone: ready.len() == 1,
        }
    }

    /// The end of a window: adapt slices, judge QoS, start a new window.
    fn adapt(&mut self, now: u64) {
        let window = now.saturating_sub(self.window_start).max(1) as f64;
        for s in &mut self.shares {
            let use_ratio = if s.given_ms > 0.0 {
                s.used_ms / s.given_ms
            } else {
                0.0
            };
            let base = base_slice_ms(s.effective_priority());
            if s.given_ms > 0.0 && use_ratio < 0.3 {
                s.factor = (s.factor * 0.8).max(MIN_SLICE_MS / base);
            } else if use_ratio > 0.7 {
                s.factor = (s.factor * 1.2).min(2.0);
            }
            s.achieved_pct = 100.0 * s.used_ms / window;
            let hungry = s.given_ms == 0.0 || use_ratio > 0.7;
            let guarantee = s.spec.guaranteed_pct;
            if guarantee > 0.0 && hungry && s.achieved_pct < 0.9 * guarantee {
                s.violations += 1;
                s.violations_in_row += 1;
                if s.violations_in_row > 3 && !s.boosted {
                    s.boosted = true;
                    s.boosts += 1;
                }
            } else {
                // Decay rather than forget: a share that keeps slipping
                // back below its guarantee is boosted again sooner.
                s.violations_in_row /= 2;
                if s.boosted && s.achieved_pct >= guarantee {
                    // Recovered: back to its own priority.
                    s.boosted = false;
                }
            }
            s.given_ms = 0.0;
            s.used_ms = 0.0;
        }
        self.window_start = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(id: i64, priority: Priority) -> ShareSpec {
        ShareSpec {
            id,
            priority,
            guaranteed_pct: 0.0,
            min_slice_ms: None,
            max_slice_ms: None,
        }
    }

    /// Runs `ms` of virtual time; `busy(id)` says whether a share uses all
    /// of its slice (else 10 % of it). Returns run time per share.
    fn simulate(
        s: &mut GpuScheduler,
        ms: u64,
        busy: impl Fn(i64) -> bool,
        runnable: impl Fn(i64) -> bool + Copy,
    ) -> std::collections::HashMap<i64, u64> {
        let mut ran = std::collections::HashMap::new();
        let mut now = 0;
        let mut d = s.tick(now, None, runnable);
        while now < ms {
            let next = d.until.min(ms);
            if let Some(id) = d.run {
                *ran.entry(id).or_insert(0) += next - now;
            }
            let used = d.run.map(|id| {
                let given = (next - now) as f64;
                if busy(id) {
                    given
                } else {
                    given * 0.1
                }
            });
            now = next;
            d = s.tick(now, used, runnable);
        }
        ran
    }

    #[test]
    fn busy_shares_split_the_gpu_4_2_1() {
        let mut s = GpuScheduler::default();
        s.add(spec(1, Priority::High));
        s.add(spec(2, Priority::Normal));
        s.add(spec(3, Priority::Low));
        let ran = simulate(&mut s, 10_000, |_| true, |_| true);
        let total: u64 = ran.values().sum();
        for (id, want) in [(1, 4.0 / 7.0), (2, 2.0 / 7.0), (3, 1.0 / 7.0)] {
            let got = ran[&id] as f64 / total as f64;
            assert!(
                (got - want).abs() / want < 0.05,
                "share {id}: {got} vs {want}"
            );
        }
        // All busy: slices grew x1.2 per window, ratio intact...
        assert!((s.share(1).unwrap().slice_ms() - 144.0).abs() < 1e-9);
        assert!(
            (s.share(1).unwrap().slice_ms() / s.share(3).unwrap().slice_ms() - 4.0).abs() < 1e-9
        );
        // ...up to twice their base.
        simulate(&mut s, 30_000, |_| true, |_| true);
        assert_eq!(s.share(1).unwrap().slice_ms(), 200.0);
        assert_eq!(s.share(3).unwrap().slice_ms(), 50.0);
    }

    #[test]
    fn an_idle_share_shrinks_and_a_lone_share_is_never_paused() {
        let mut s = GpuScheduler::default();
        s.add(spec(1, Priority::High));
        s.add(spec(2, Priority::High));
        simulate(&mut s, 20_000, |id| id == 1, |_| true);
        assert!(s.share(2).unwrap().slice_ms() < 60.0, "{:?}", s.share(2));
        assert!(s.share(2).unwrap().slice_ms() >= MIN_SLICE_MS);
        let d = s.tick(30_000, None, |id| id == 1);
        assert_eq!((d.run, d.alone), (Some(1), true));
        // Without processes a share is skipped.
        let d = s.tick(30_100, None, |id| id == 2);
        assert_eq!(d.run, Some(2));
        let d = s.tick(30_200, None, |_| false);
        assert_eq!(d.run, None);
    }

    #[test]
    fn a_starved_share_is_boosted_after_more_than_3_violations_and_returns() {
        let mut s = GpuScheduler::default();
        // Three busy HIGH shares take most of the GPU from a LOW one that
        // was promised 20 %.
        for id in 1..=3 {
            s.add(spec(id, Priority::High));
        }
        s.add(ShareSpec {
            guaranteed_pct: 20.0,
            ..spec(4, Priority::Low)
        });
        let runnable = |_| true;
        let mut now = 0;
        let mut d = s.tick(now, None, runnable);
        let mut boosted_at = None;
        let mut recovered = false;
        let mut was_boosted = false;
        while now < 60_000 {
            now = d.until;
            d = s.tick(now, Some(1e9), runnable);
            let low = s.share(4).unwrap();
            if low.boosted && boosted_at.is_none() {
                boosted_at = Some((now, low.violations));
            }
            if was_boosted && !low.boosted {
                // It came back because it reached its guarantee.
                assert!(low.achieved_pct >= 20.0, "{low:?}");
                recovered = true;
            }
            was_boosted = low.boosted;
        }
        let (at, violations) = boosted_at.expect("the starved share was never boosted");
        assert_eq!(violations, 4, "boosted after the 4th violation in a row");
        assert!(at >= 4 * WINDOW_MS);
        assert!(recovered, "the boost ended once the guarantee was met");
    }

    proptest! {
        #[test]
        fn no_runnable_share_starves(
            prios in proptest::collection::vec(0u8..3, 1..8),
            busy_mask in 0u32..256,
        ) {
            let mut s = GpuScheduler::default();
            for (i, p) in prios.iter().enumerate() {
                s.add(spec(i as i64, Priority::ALL[*p as usize]));
            }
            let ran = simulate(&mut s, 10_000, |id| busy_mask & (1 << id) != 0, |_| true);
            for i in 0..prios.len() as i64 {
                prop_assert!(ran.get(&i).copied().unwrap_or(0) > 0, "share {i} starved: {ran:?}");
            }
        }

        #[test]
        fn busy_shares_keep_the_4_2_1_ratio(
            prios in proptest::collection::vec(0u8..3, 2..8),
        ) {
            let mut s = GpuScheduler::default();
            for (i, p) in prios.iter().enumerate() {
                s.add(spec(i as i64, Priority::ALL[*p as usize]));
            }
            // A minute: a round of seven busy shares at their grown slices
            // lasts over a second, and a run cut mid-round shorts the last
            // shares of the round by up to one slice (10 s was too short for
            // 5 %: six HIGH shares and one LOW measured 0.152 against 0.16).
            let ran = simulate(&mut s, 60_000, |_| true, |_| true);
            let weight = |p: u8| base_slice_ms(Priority::ALL[p as usize]);
            let total_w: f64 = prios.iter().map(|p| weight(*p)).sum();
            let total: u64 = ran.values().sum();
            for (i, p) in prios.iter().enumerate() {
                let want = weight(*p) / total_w;
                let got = ran[&(i as i64)] as f64 / total as f64;
                prop_assert!((got - want).abs() / want < 0.05, "share {i}: {got} vs {want}");
            }
        }
    }
}
