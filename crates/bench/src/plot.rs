//! SVG plots of latency percentile curves: one line per results file, with
//! the percentile on a "nines" axis (50, 90, 99, 99.9 … equally spaced), so
//! the tail is as visible as the median.

use crate::report::Record;
use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;
use std::path::Path;

/// Where a percentile lands on the nines axis: `-log10(1 - p/100)`, capped.
fn nines(p: f64) -> f64 {
    let rest = (1.0 - p / 100.0).max(1e-5);
    -rest.log10()
}

const COLORS: [RGBColor; 4] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
];

/// Draws curve `curve` (e.g. `latency`) of the last record of each file into `out`.
///
/// # Errors
/// A file has no record with that curve, or the SVG cannot be written.
pub(crate) fn plot(
    out: &Path,
    curve: &str,
    title: &str,
    files: &[std::path::PathBuf],
) -> Result<()> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
        let record: Record = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(serde_json::from_str)
            .transpose()
            .with_context(|| format!("parse {}", f.display()))?
            .ok_or_else(|| anyhow!("{} holds no result", f.display()))?;
        let points = record
            .curves
            .iter()
            .find(|(name, _)| name == curve)
            .map(|(_, p)| p.clone())
            .ok_or_else(|| anyhow!("{} has no {curve} curve", f.display()))?;
        series.push((record.target.clone(), points));
    }
    let max_ms = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, v)| v))
        .fold(0.0f64, f64::max)
        .max(0.001);
    let root = SVGBackend::new(out, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("draw: {e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..5.0f64, 0.0..max_ms * 1.05)
        .map_err(|e| anyhow!("draw: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc(format!("{curve} (ms)"))
        .x_labels(6)
        .x_label_formatter(&|x| {
            let p = 100.0 * (1.0 - 10f64.powf(-x));
            format!("{}", (p * 1000.0).round() / 1000.0)
        })
        .draw()
        .map_err(|e| anyhow!("draw: {e}"))?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = points.iter().map(|&(p, v)| (nines(p), v)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow!("draw: {e}"))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))
            .map_err(|e| anyhow!("draw: {e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("draw: {e}"))?;
    root.present()
        .map_err(|e| anyhow!("write {}: {e}", out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_axis() {
        assert!(nines(0.0).abs() < 1e-12);
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        assert!((nines(100.0) - 5.0).abs() < 1e-9);
    }
}
