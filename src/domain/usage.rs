//! Metering arithmetic (pure): which intervals of a booking are due, what
//! each costs in slice-seconds and GiB-seconds, and CSV cells that
//! spreadsheets will not run as formulas.

/// The intervals of a booking held over `[start, end)` that are complete
/// at `now` and not yet metered (`metered_until`): boundaries every `step`
/// seconds from the start, the last one ending exactly at the end.
pub fn due_intervals(
    start: i64,
    end: i64,
    metered_until: Option<i64>,
    now: i64,
    step: i64,
) -> Vec<(i64, i64)> {
    let step = step.max(1);
    let mut a = metered_until.unwrap_or(start).max(start);
    // Realign to the booking's grid (a metered_until always lies on it, but
    // a changed step setting must not create overlapping intervals).
    let offset = (a - start) % step;
    if offset != 0 {
        a += step - offset;
        a = a.min(end);
    }
    let mut out = Vec::new();
    while a < end {
        let b = (a + step).min(end);
        if b > now {
            break;
        }
        out.push((a, b));
        a = b;
    }
    out
}

/// One usage row before it is stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UsageRow {
    pub booking_id: i64,
    pub start: i64,
    pub end: i64,
    pub slice_seconds: f64,
    pub gib_seconds: f64,
    pub utilization_pct: Option<f32>,
    pub memory_used_mib: Option<i64>,
}

/// The usage of holding `compute_slices` and `memory_gib` over an interval.
pub fn usage_of(
    booking_id: i64,
    (start, end): (i64, i64),
    compute_slices: f64,
    memory_gib: f64,
) -> UsageRow {
    let secs = (end - start) as f64;
    UsageRow {
        booking_id,
        start,
        end,
        slice_seconds: compute_slices * secs,
        gib_seconds: memory_gib * secs,
        utilization_pct: None,
        memory_used_mib: None,
    }
}

/// A text cell for CSV (RFC 4180): quoted when it holds a comma, quote,
/// CR or LF; and prefixed with `'` when it starts with = + - @ tab or CR,
/// so that a spreadsheet shows it instead of evaluating it.
pub fn csv_text(s: &str) -> String {
    let guarded = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if guarded.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", guarded.replace('"', "\"\""))
    } else {
        guarded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn intervals_follow_the_grid_and_end_exactly_at_the_end() {
        assert_eq!(
            due_intervals(0, 150, None, 1000, 60),
            vec![(0, 60), (60, 120), (120, 150)]
        );
        // Only complete intervals: at 130 the third is still running.
        assert_eq!(
            due_intervals(0, 150, None, 130, 60),
            vec![(0, 60), (60, 120)]
        );
        assert_eq!(due_intervals(0, 150, Some(120), 130, 60), vec![]);
        assert_eq!(due_intervals(0, 150, Some(120), 150, 60), vec![(120, 150)]);
        assert_eq!(due_intervals(0, 150, Some(150), 9999, 60), vec![]);
    }

    #[test]
    fn formulas_are_defused_and_quoting_follows_rfc_4180() {
        assert_eq!(csv_text("=1+1"), "'=1+1");
        assert_eq!(csv_text("-2"), "'-2");
        assert_eq!(csv_text("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(csv_text("\tx"), "'\tx");
        assert_eq!(csv_text("a,b"), "\"a,b\"");
        assert_eq!(csv_text("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_text("+1,\"2\""), "\"'+1,\"\"2\"\"\"");
        assert_eq!(csv_text("plain"), "plain");
    }

    /// Reads one RFC 4180 field back (for the property test).
    fn unquote(cell: &str) -> String {
        match cell.strip_prefix('"').and_then(|c| c.strip_suffix('"')) {
            Some(inner) => inner.replace("\"\"", "\""),
            None => cell.to_string(),
        }
    }

    proptest! {
        #[test]
        fn metering_never_leaves_a_gap_or_an_overlap(
            start in 0i64..1000, len in 1i64..5000, step in 1i64..400,
            nows in proptest::collection::vec(0i64..8000, 1..8),
        ) {
            let end = start + len;
            let mut nows = nows;
            nows.sort_unstable();
            nows.push(end + 1);
            let mut until = None;
            let mut all = Vec::new();
            for now in nows {
                let got = due_intervals(start, end, until, now, step);
                if let Some(last) = got.last() {
                    until = Some(last.1);
                }
                all.extend(got);
            }
            prop_assert_eq!(all.first().map(|i| i.0), Some(start));
            prop_assert_eq!(all.last().map(|i| i.1), Some(end));
            for w in all.windows(2) {
                prop_assert_eq!(w[0].1, w[1].0);
            }
        }

        #[test]
        fn a_csv_cell_reads_back_and_never_starts_a_formula(s in "\\PC{0,20}") {
            let cell = csv_text(&s);
            let back = unquote(&cell);
            let dangerous = s.starts_with(['=', '+', '-', '@', '\t', '\r']);
            if dangerous {
                prop_assert_eq!(back, format!("'{s}"));
            } else {
                prop_assert_eq!(back, s.clone());
            }
            // Unquoted cells hold no separator, quote or line break.
            if !cell.starts_with('"') {
                prop_assert!(!cell.contains([',', '"', '\r', '\n']));
            }
        }
    }
}
