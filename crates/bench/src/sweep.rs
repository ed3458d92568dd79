//! Sweep plots: one figure of many runs against another (e.g. server CPU per
//! delivery against subscribers, p99 against event rate), one line per target,
//! drawn as a standalone SVG (`gapless-bench plot-sweep`, fed by
//! `bench/sweep.sh`), with the same points printed as a Markdown table.
//!
//! A figure is named as in the results: a metric (`server_cpu_us_per_delivery`,
//! `publish_per_s`, …) or, written `param:NAME`, a number in the record's
//! parameters (`param:subs`, `param:rate`; a value that is not a number, such as
//! `rate=max`, leaves the record out of a plot keyed on it).

use crate::report::{fmt_num, Record};
use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const COLORS: [RGBColor; 5] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
];

/// One target's points: its label and (x, y) pairs sorted by x.
pub(crate) type Line = (String, Vec<(f64, f64)>);

/// What to draw.
#[derive(Debug)]
pub(crate) struct Spec<'a> {
    /// The SVG file to write.
    pub out: &'a Path,
    /// The x figure (metric, or `param:NAME`).
    pub x: &'a str,
    /// The y figure.
    pub y: &'a str,
    /// Only records of this scenario (default: all).
    pub scenario: Option<&'a str>,
    /// Logarithmic x axis (x must be above 0).
    pub log_x: bool,
    /// The chart's title.
    pub title: &'a str,
    /// Rows of the printed table by this parameter's value as written (e.g. `rate`, whose
    /// `max` is no number), each cell `y @ x`; default: one row per x.
    pub table_key: Option<&'a str>,
}

/// The value of parameter `name` in `r`'s parameters, as written.
fn param<'r>(r: &'r Record, name: &str) -> Option<&'r str> {
    r.params
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

/// The value of figure `name` in `r`: a metric, or `param:NAME` from the parameters.
fn figure(r: &Record, name: &str) -> Option<f64> {
    match name.strip_prefix("param:") {
        Some(p) => param(r, p).and_then(|v| v.parse().ok()),
        None => r.metrics.iter().find(|(k, _)| k == name).map(|(_, v)| *v),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The points of every target, in the order the targets first appear: (x, y) sorted
/// by x. Records at the same x (repeats) give the median of their y; a record
/// without either figure, or not of `scenario`, is left out.
///
/// # Errors
/// A file cannot be read or holds something other than records.
pub(crate) fn series(
    files: &[PathBuf],
    x: &str,
    y: &str,
    scenario: Option<&str>,
) -> Result<Vec<Line>> {
    let mut order: Vec<String> = Vec::new();
    let mut points: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let r: Record =
                serde_json::from_str(line).with_context(|| format!("parse {}", f.display()))?;
            if scenario.is_some_and(|s| s != r.scenario) {
                continue;
            }
            let (Some(vx), Some(vy)) = (figure(&r, x), figure(&r, y)) else {
                continue;
            };
            if !order.contains(&r.target) {
                order.push(r.target.clone());
            }
            points.entry(r.target.clone()).or_default().push((vx, vy));
        }
    }
    Ok(order
        .into_iter()
        .map(|t| {
            let mut raw = points.remove(&t).unwrap_or_default();
            raw.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut merged: Vec<(f64, f64)> = Vec::new();
            let mut i = 0;
            while i < raw.len() {
                let same: Vec<f64> = raw[i..]
                    .iter()
                    .take_while(|p| p.0 == raw[i].0)
                    .map(|p| p.1)
                    .collect();
                let n = same.len();
                let mut ys = same;
                merged.push((raw[i].0, median(&mut ys)));
                i += n;
            }
            (t, merged)
        })
        .collect())
}

/// Draws the sweep per `spec` from `files` (JSON lines of results) and prints its points
/// as a Markdown table (one row per x, one column per target).
///
/// # Errors
/// No point to draw, a non-positive x on a log axis, or the SVG cannot be written.
pub(crate) fn plot_sweep(spec: &Spec<'_>, files: &[PathBuf]) -> Result<()> {
    let lines = series(files, spec.x, spec.y, spec.scenario)?;
    let all: Vec<(f64, f64)> = lines.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if all.is_empty() {
        bail!(
            "no record holds both {} and {}{}",
            spec.x,
            spec.y,
            spec.scenario
                .map(|s| format!(" in scenario {s}"))
                .unwrap_or_default()
        );
    }
    let (mut x0, mut x1) = (f64::MAX, f64::MIN);
    let mut y1 = 0.0f64;
    for &(x, y) in &all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if spec.log_x && x0 <= 0.0 {
        bail!("--log-x: {} has a value of {x0}, not above 0", spec.x);
    }
    // Headroom above the highest point for the legend (upper left).
    let y_max = (y1 * 1.35).max(1e-9);
    let x_desc = spec.x.strip_prefix("param:").unwrap_or(spec.x);
    let root = SVGBackend::new(spec.out, (800, 480)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("draw {}: {e}", spec.out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    // One body for both axis kinds: plotters types a chart by its coordinates.
    macro_rules! draw {
        ($xr:expr) => {{
            let mut chart = ChartBuilder::on(&root)
                .caption(spec.title, ("sans-serif", 20))
                .margin(15)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d($xr, 0.0..y_max)
                .map_err(|x| e(&x))?;
            chart
                .configure_mesh()
                .x_desc(x_desc)
                .y_desc(spec.y)
                .light_line_style(TRANSPARENT)
                .x_labels(8)
                .x_label_formatter(&|v| axis_num(*v))
                .y_label_formatter(&|v| fmt_num(*v))
                .draw()
                .map_err(|x| e(&x))?;
            for (i, (name, pts)) in lines.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|x| e(&x))?
                    .label(name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
                chart
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|x| e(&x))?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|x| e(&x))?;
        }};
    }
    let pad = if x1 > x0 { (x1 - x0) * 0.02 } else { 1.0 };
    if spec.log_x {
        draw!((x0 / 1.2..x1 * 1.2).log_scale());
    } else {
        draw!((x0 - pad).max(0.0)..x1 + pad);
    }
    root.present()
        .map_err(|x| anyhow!("write {}: {x}", spec.out.display()))?;
    match spec.table_key {
        Some(key) => print_keyed_table(spec, key, files)?,
        None => print_table(spec, &lines),
    }
    Ok(())
}

/// The points as a Markdown table with one row per value of parameter `key` (in the order
/// numbers first, ascending, then words such as `max`) and one column per target, each
/// cell `y @ x` (the last record's, for repeats).
fn print_keyed_table(spec: &Spec<'_>, key: &str, files: &[PathBuf]) -> Result<()> {
    let mut targets: Vec<String> = Vec::new();
    let mut cells: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut keys: Vec<String> = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let r: Record =
                serde_json::from_str(line).with_context(|| format!("parse {}", f.display()))?;
            if spec.scenario.is_some_and(|s| s != r.scenario) {
                continue;
            }
            let (Some(k), Some(x), Some(y)) =
                (param(&r, key), figure(&r, spec.x), figure(&r, spec.y))
            else {
                continue;
            };
            if !targets.contains(&r.target) {
                targets.push(r.target.clone());
            }
            if !keys.iter().any(|q| q == k) {
                keys.push(k.to_owned());
            }
            cells.insert(
                (k.to_owned(), r.target.clone()),
                format!("{} @ {}", fmt_num(y), fmt_num(x)),
            );
        }
    }
    keys.sort_by(|a, b| match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x.total_cmp(&y),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    });
    let x_name = spec.x.strip_prefix("param:").unwrap_or(spec.x);
    println!("#### {} @ {x_name}, by {key}", spec.y);
    println!();
    let mut head = format!("| {key} |");
    let mut rule = "|---:|".to_owned();
    for t in &targets {
        head.push_str(&format!(" {t} |"));
        rule.push_str("---:|");
    }
    println!("{head}\n{rule}");
    for k in &keys {
        let mut row = format!("| {k} |");
        for t in &targets {
            let c = cells.get(&(k.clone(), t.clone()));
            row.push_str(&format!(" {} |", c.map_or("", String::as_str)));
        }
        println!("{row}");
    }
    println!();
    Ok(())
}

/// An axis label: whole numbers without decimals, others as in the tables.
fn axis_num(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        fmt_num(v)
    }
}

/// The points as a Markdown table: x, then one column per target.
fn print_table(spec: &Spec<'_>, lines: &[Line]) {
    let mut xs: Vec<f64> = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let x_name = spec.x.strip_prefix("param:").unwrap_or(spec.x);
    println!("#### {} against {x_name}", spec.y);
    println!();
    let mut head = format!("| {x_name} |");
    let mut rule = "|---:|".to_owned();
    for (t, _) in lines {
        head.push_str(&format!(" {t} |"));
        rule.push_str("---:|");
    }
    println!("{head}\n{rule}");
    for x in xs {
        let mut row = format!("| {} |", fmt_num(x));
        for (_, p) in lines {
            let v = p.iter().find(|q| q.0 == x).map(|q| fmt_num(q.1));
            row.push_str(&format!(" {} |", v.as_deref().unwrap_or("")));
        }
        println!("{row}");
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(target: &str, params: &str, metrics: &[(&str, f64)]) -> String {
        let mut r = Record::new("fanout", target, params.to_owned());
        for (k, v) in metrics {
            r.metric(k, *v);
        }
        serde_json::to_string(&r).expect("encode")
    }

    #[test]
    fn series_by_target_sorted_with_repeats_merged() {
        let dir = std::env::temp_dir().join(format!("sweep-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("a.jsonl");
        let text = [
            rec("g", "subs=1000 rate=max", &[("cpu", 3.0)]),
            rec("g", "subs=100 rate=10", &[("cpu", 5.0)]),
            rec("n", "subs=100 rate=10", &[("cpu", 9.0)]),
            rec("g", "subs=1000 rate=10", &[("cpu", 1.0)]),
            rec("g", "subs=1000 rate=10", &[("cpu", 2.0)]),
            rec("g", "subs=5", &[("other", 1.0)]),
        ]
        .join("\n");
        std::fs::write(&f, text).expect("write");
        let s = series(std::slice::from_ref(&f), "param:subs", "cpu", None).expect("series");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "g");
        assert_eq!(s[0].1, vec![(100.0, 5.0), (1000.0, 2.0)]);
        assert_eq!(s[1].1, vec![(100.0, 9.0)]);
        // rate=max is not a number: left out of a plot keyed on the rate.
        let r = series(std::slice::from_ref(&f), "param:rate", "cpu", None).expect("series");
        assert_eq!(r[0].1, vec![(10.0, 2.0)], "the median of 5, 1 and 2");
        let out = dir.join("p.svg");
        let spec = Spec {
            out: &out,
            x: "param:subs",
            y: "cpu",
            scenario: Some("fanout"),
            log_x: true,
            title: "t",
            table_key: None,
        };
        plot_sweep(&spec, &[f]).expect("plot");
        let svg = std::fs::read_to_string(&out).expect("svg");
        assert!(svg.starts_with("<svg") && svg.contains("polyline"), "{svg}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
