//! Server-rendered SVG charts: sparklines for tables and a line chart for
//! histories. The markup carries numbers only, plus labels escaped here,
//! so templates may include it unescaped.

use std::fmt::Write;

use time::OffsetDateTime;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// A small line of `values` (gaps where `None`) scaled to `0..=max`,
/// `w` by `h` pixels, with `label` for screen readers and as a tooltip.
pub fn sparkline(
    values: &[Option<f64>],
    max: f64,
    w: u32,
    h: u32,
    class: &str,
    label: &str,
) -> String {
    let mut out = format!(
        r#"<svg class="spark {}" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{}"><title>{}</title>"#,
        esc(class),
        esc(label),
        esc(label)
    );
    let n = values.len();
    if n > 0 && max > 0.0 {
        let step = f64::from(w) / (n.max(2) - 1) as f64;
        let at = |i: usize, v: f64| {
            let y = f64::from(h) - 1.0 - (v / max).clamp(0.0, 1.0) * (f64::from(h) - 2.0);
            (i as f64 * step, y)
        };
        let points: Vec<Option<(f64, f64)>> = values
            .iter()
            .enumerate()
            .map(|(i, v)| v.map(|v| at(i, v)))
            .collect();
        let d = path(&points);
        if !d.is_empty() {
            let _ = write!(out, r#"<path d="{d}" fill="none"/>"#);
        }
        // The latest value as a dot, so that even a short history shows.
        if let Some((x, y)) = points.iter().rev().flatten().next() {
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{y:.1}" r="1.8"/>"#,
                x.min(f64::from(w) - 2.0)
            );
        }
    }
    out.push_str("</svg>");
    out
}

/// SVG path data through `points`, lifting the pen at each gap.
fn path(points: &[Option<(f64, f64)>]) -> String {
    let mut d = String::new();
    let mut pen_down = false;
    for p in points {
        match p {
            Some((x, y)) => {
                let _ = write!(d, "{}{x:.1},{y:.1} ", if pen_down { "L" } else { "M" });
                pen_down = true;
            }
            None => pen_down = false,
        }
    }
    d.trim_end().to_string()
}

/// One line of a chart.
pub struct Series<'a> {
    pub label: &'a str,
    /// A CSS class (`line-a`, `line-b`, `line-limit`).
    pub class: &'a str,
    pub points: Vec<(OffsetDateTime, Option<f64>)>,
}

/// A line chart over time: `series` against a y axis from 0 to `y_max`
/// with `unit`, with a legend and the time range underneath.
pub fn line_chart(series: &[Series], y_max: f64, unit: &str, title: &str) -> String {
    let (w, h, left, bottom) = (720.0_f64, 200.0_f64, 48.0_f64, 22.0_f64);
    if !series
        .iter()
        .any(|s| s.points.iter().any(|p| p.1.is_some()))
    {
        return format!(
            r#"<p class="muted">{}: nothing reported yet.</p>"#,
            esc(title)
        );
    }
    let times = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (t0, t1) = match (times.clone().min(), times.max()) {
        (Some(a), Some(b)) => (a, b),
        _ => return format!(r#"<p class="muted">{}: no samples yet.</p>"#, esc(title)),
    };
    let span = (t1 - t0).as_seconds_f64().max(1.0);
    let y_max = if y_max > 0.0 { y_max } else { 1.0 };
    let x = |t: OffsetDateTime| left + (t - t0).as_seconds_f64() / span * (w - left - 8.0);
    let y = |v: f64| 8.0 + (1.0 - (v / y_max).clamp(0.0, 1.0)) * (h - bottom - 8.0);
    let mut out = format!(
        r#"<figure class="chart"><svg viewBox="0 0 {w} {h}" role="img" aria-label="{t}"><title>{t}</title>"#,
        t = esc(title)
    );
    for frac in [0.0, 0.5, 1.0] {
        let v = y_max * frac;
        let _ = write!(
            out,
            r#"<line class="grid" x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}"/><text class="axis" x="{}" y="{:.1}" text-anchor="end">{v:.0}{}</text>"#,
            w - 8.0,
            left - 4.0,
            y(v) + 4.0,
            esc(unit),
            y = y(v)
        );
    }
    for s in series {
        let points: Vec<Option<(f64, f64)>> = thin(&s.points, t0, span)
            .into_iter()
            .map(|(t, v)| v.map(|v| (x(t), y(v))))
            .collect();
        let path = path(&points);
        let _ = write!(
            out,
            r#"<path class="{}" d="{}" fill="none"><title>{}</title></path>"#,
            esc(s.class),
            path,
            esc(s.label)
        );
    }
    let _ = write!(
        out,
        r#"<text class="axis" x="{left}" y="{}">{}</text><text class="axis" x="{}" y="{}" text-anchor="end">{}</text></svg>"#,
        h - 4.0,
        esc(&crate::booking::when(t0)),
        w - 8.0,
        h - 4.0,
        esc(&crate::booking::when(t1))
    );
    out.push_str("<figcaption>");
    for s in series {
        let _ = write!(
            out,
            r#"<span class="legend {}">{}</span> "#,
            esc(s.class),
            esc(s.label)
        );
    }
    out.push_str("</figcaption></figure>");
    out
}

/// Most points a line draws: a long history is averaged into this many
/// equal spans of time, so a page's size does not grow with it.
const MAX_POINTS: usize = 400;

fn thin(
    points: &[(OffsetDateTime, Option<f64>)],
    t0: OffsetDateTime,
    span: f64,
) -> Vec<(OffsetDateTime, Option<f64>)> {
    if points.len() <= MAX_POINTS {
        return points.to_vec();
    }
    let mut bins: Vec<(f64, usize, OffsetDateTime)> = vec![(0.0, 0, t0); MAX_POINTS];
    for (t, v) in points {
        let i = (((*t - t0).as_seconds_f64() / span) * MAX_POINTS as f64) as usize;
        let b = &mut bins[i.min(MAX_POINTS - 1)];
        if let Some(v) = v {
            b.0 += v;
            b.1 += 1;
        }
        b.2 = *t;
    }
    bins.into_iter()
        .filter(|b| b.2 != t0 || b.1 > 0)
        .map(|(sum, n, t)| (t, (n > 0).then(|| sum / n as f64)))
        .collect()
}

/// One row of an availability timeline: a GPU and its free stretches
/// (unix seconds).
pub struct TimelineRow {
    pub label: String,
    pub free: Vec<(i64, i64)>,
}

/// The availability timeline of the booking form: one bar per GPU over
/// `[from, to)` (unix seconds), free stretches drawn green and marked
/// `data-fill-start` (a click puts their start into the form), a tick at
/// each local midnight (`tz_offset_secs` east of UTC) and a line at `now`.
pub fn timeline(rows: &[TimelineRow], from: i64, to: i64, now: i64, tz_offset_secs: i64) -> String {
    // The label column fits the longest label (11 px text, ~6.6 px a character).
    let longest = rows
        .iter()
        .map(|r| r.label.chars().count())
        .max()
        .unwrap_or(0);
    let left = (longest as f64 * 6.6 + 12.0).clamp(80.0, 260.0);
    let (right, top, row_h, bar_h) = (712.0_f64, 18.0_f64, 24.0_f64, 16.0_f64);
    let w = right + 8.0;
    let h = top + row_h * rows.len() as f64 + 6.0;
    let span = (to - from).max(1) as f64;
    let x = |t: i64| left + ((t.clamp(from, to) - from) as f64 / span) * (right - left);
    let stamp = |t: i64| {
        OffsetDateTime::from_unix_timestamp(t)
            .ok()
            .and_then(|d| {
                d.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default()
    };
    let mut out = format!(
        r#"<svg class="timeline" viewBox="0 0 {w} {h}" role="img" aria-label="When it fits on each GPU"><title>When it fits on each GPU</title>"#
    );
    // Local midnights: day ticks and labels.
    let day = 86_400;
    let mut t = (from + tz_offset_secs).div_euclid(day) * day - tz_offset_secs;
    while t < to {
        if t >= from {
            let _ = write!(
                out,
                r#"<line class="grid" x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}"/>"#,
                top - 4.0,
                h - 4.0,
                x = x(t)
            );
        }
        let label_at = t.max(from);
        if let Ok(d) = OffsetDateTime::from_unix_timestamp(label_at + tz_offset_secs) {
            if (t + day).min(to) - label_at > day / 4 {
                let _ = write!(
                    out,
                    r#"<text class="axis" x="{:.1}" y="{}">{} {}</text>"#,
                    x(label_at) + 3.0,
                    top - 6.0,
                    &format!("{}", d.weekday())[..3],
                    d.day()
                );
            }
        }
        t += day;
    }
    for (i, r) in rows.iter().enumerate() {
        let y = top + row_h * i as f64;
        let _ = write!(
            out,
            r#"<text class="axis" x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect class="busy" x="{left}" y="{y:.1}" width="{:.1}" height="{bar_h}"><title>{}: taken</title></rect>"#,
            left - 6.0,
            y + bar_h - 4.0,
            esc(&r.label),
            right - left,
            esc(&r.label)
        );
        for &(a, b) in &r.free {
            let (x0, x1) = (x(a), x(b));
            let _ = write!(
                out,
                r#"<rect class="free" x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{bar_h}" data-fill-start="{}" tabindex="0" role="button"><title>{}: free from {} to {}; click to start then</title></rect>"#,
                (x1 - x0).max(1.0),
                stamp(a),
                esc(&r.label),
                esc(&crate::booking::when(
                    OffsetDateTime::from_unix_timestamp(a).unwrap_or(OffsetDateTime::UNIX_EPOCH)
                )),
                esc(&crate::booking::when(
                    OffsetDateTime::from_unix_timestamp(b).unwrap_or(OffsetDateTime::UNIX_EPOCH)
                )),
            );
        }
    }
    if (from..to).contains(&now) {
        let _ = write!(
            out,
            r#"<line class="now" x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}"/>"#,
            top - 4.0,
            h - 4.0,
            x = x(now)
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkline_breaks_at_gaps_and_escapes_its_label() {
        let s = sparkline(
            &[Some(1.0), None, Some(2.0), Some(0.0)],
            2.0,
            60,
            16,
            "util",
            "<b>x</b>",
        );
        assert_eq!(s.matches('M').count(), 2, "{s}");
        assert!(s.contains("&lt;b&gt;x&lt;/b&gt;"));
        assert!(!s.contains("<b>"));
    }

    #[test]
    fn long_histories_are_thinned() {
        let t0 = OffsetDateTime::now_utc();
        let points: Vec<_> = (0..5_000)
            .map(|i| (t0 + time::Duration::seconds(i * 10), Some(50.0)))
            .collect();
        let c = line_chart(
            &[Series {
                label: "a",
                class: "line-a",
                points,
            }],
            100.0,
            "%",
            "Use",
        );
        assert!(
            c.matches('L').count() <= MAX_POINTS,
            "{}",
            c.matches('L').count()
        );
    }

    #[test]
    fn an_empty_chart_says_so() {
        let c = line_chart(
            &[Series {
                label: "a",
                class: "line-a",
                points: vec![],
            }],
            1.0,
            "%",
            "Use",
        );
        assert!(c.contains("nothing reported yet"));
    }
}
