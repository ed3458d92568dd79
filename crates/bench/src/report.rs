//! Results: one [`Record`] per scenario run, printed for people and appended
//! as one JSON line to a file for `bench/compare`, which puts two runs side
//! by side with their ratio ([`compare`]).

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A latency histogram in microseconds, 1 µs to 1 hour, 3 significant digits.
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant histogram bounds are valid")
}

/// The percentiles kept for plots.
const CURVE_PERCENTILES: [f64; 16] = [
    0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.995, 99.999,
    99.9995, 100.0,
];

/// One run's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    /// Scenario name.
    pub scenario: String,
    /// Target label (e.g. `gapless`, `nchan`).
    pub target: String,
    /// The scenario's parameters, as `name=value` words.
    pub params: String,
    /// Measured figures, in the order they were added: name (with unit) and value.
    pub metrics: Vec<(String, f64)>,
    /// Exactness check: every count as expected.
    pub exact: bool,
    /// What the check found wrong, if anything.
    pub problems: Vec<String>,
    /// Percentile curves (for plots): name, then (percentile, milliseconds) points.
    #[serde(default)]
    pub curves: Vec<(String, Vec<(f64, f64)>)>,
}

impl Record {
    /// An empty record.
    pub(crate) fn new(scenario: &str, target: &str, params: String) -> Self {
        Record {
            scenario: scenario.to_owned(),
            target: target.to_owned(),
            params,
            metrics: Vec::new(),
            exact: true,
            problems: Vec::new(),
            curves: Vec::new(),
        }
    }

    /// Adds one figure.
    pub(crate) fn metric(&mut self, name: &str, value: f64) {
        self.metrics.push((name.to_owned(), value));
    }

    /// Adds p50/p90/p99/p999/max of a µs histogram, in milliseconds, as `PREFIX_p50_ms` etc.
    pub(crate) fn latency(&mut self, prefix: &str, h: &Histogram<u64>) {
        if h.is_empty() {
            return;
        }
        for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)] {
            self.metric(
                &format!("{prefix}_{name}_ms"),
                h.value_at_quantile(q) as f64 / 1000.0,
            );
        }
        self.metric(&format!("{prefix}_max_ms"), h.max() as f64 / 1000.0);
        let points = CURVE_PERCENTILES
            .iter()
            .map(|&p| (p, h.value_at_percentile(p) as f64 / 1000.0))
            .collect();
        self.curves.push((prefix.to_owned(), points));
    }

    /// Records `{prefix}_p50_ms` and `{prefix}_p99_ms` of a latency histogram
    /// (µs), without a curve (per-node breakdowns of a latency already recorded).
    pub(crate) fn quantiles(&mut self, prefix: &str, h: &Histogram<u64>) {
        if h.is_empty() {
            return;
        }
        for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
            self.metric(
                &format!("{prefix}_{name}_ms"),
                h.value_at_quantile(q) as f64 / 1000.0,
            );
        }
    }

    /// Records a failed exactness check.
    pub(crate) fn problem(&mut self, what: String) {
        self.exact = false;
        self.problems.push(what);
    }

    /// Prints the record for people.
    pub(crate) fn print(&self) {
        println!("== {} on {} ({})", self.scenario, self.target, self.params);
        for (k, v) in &self.metrics {
            println!("  {k:<34} {}", fmt_num(*v));
        }
        if self.exact {
            println!("  counts: exact");
        } else {
            for p in &self.problems {
                println!("  COUNT PROBLEM: {p}");
            }
        }
    }

    /// Appends the record as one JSON line.
    ///
    /// # Errors
    /// The file cannot be written.
    pub(crate) fn append_json(&self, path: &Path) -> Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("open {}", path.display()))?;
        let line = serde_json::to_string(self).context("encode record")?;
        writeln!(f, "{line}").with_context(|| format!("write {}", path.display()))
    }
}

/// A number with sensible precision.
pub(crate) fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".to_owned()
    } else if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

fn read_records(path: &Path) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("parse {}", path.display())))
        .collect()
}

/// The median of every figure over `records` (all of one scenario), in the
/// order of the first record; with the runs' exactness combined.
fn median(records: &[Record]) -> Option<Record> {
    let first = records.first()?;
    let mut out = Record::new(&first.scenario, &first.target, first.params.clone());
    for (k, _) in &first.metrics {
        let mut vals: Vec<f64> = records
            .iter()
            .filter_map(|r| r.metrics.iter().find(|(kr, _)| kr == k).map(|(_, v)| *v))
            .collect();
        vals.sort_by(f64::total_cmp);
        let n = vals.len();
        if n == 0 {
            continue;
        }
        let m = if n % 2 == 1 {
            vals[n / 2]
        } else {
            (vals[n / 2 - 1] + vals[n / 2]) / 2.0
        };
        out.metric(k, m);
    }
    for (i, r) in records.iter().enumerate() {
        for p in &r.problems {
            out.problem(format!("run {}: {p}", i + 1));
        }
    }
    Some(out)
}

/// Prints, as a Markdown table, the records of file `a` beside those of each
/// file in `others` (the median of each figure when a file holds several runs
/// of the same scenario) with the ratio a/other for every figure both have; `a`
/// alone without others. With one other file the ratio column is `ratio`, with
/// several it is `a/TARGET` per other target.
///
/// # Errors
/// A file is missing, empty or not made of records.
pub(crate) fn compare(a: &Path, others: &[PathBuf]) -> Result<()> {
    let all_a = read_records(a)?;
    let ra = median(&all_a).ok_or_else(|| anyhow::anyhow!("{} holds no result", a.display()))?;
    let mut rest = Vec::with_capacity(others.len());
    let mut runs_of = vec![all_a.len()];
    for b in others {
        let all_b = read_records(b)?;
        runs_of.push(all_b.len());
        rest.push(
            median(&all_b).ok_or_else(|| anyhow::anyhow!("{} holds no result", b.display()))?,
        );
    }
    let runs = if runs_of.iter().all(|&n| n == 1) {
        String::new()
    } else {
        let list: Vec<String> = runs_of.iter().map(ToString::to_string).collect();
        match list.len() {
            1 => format!(", median of {} runs", list[0]),
            2 => format!(", median of {} and {} runs", list[0], list[1]),
            _ => format!(", median of {} runs", list.join(", ")),
        }
    };
    let verdict = |r: &Record| {
        if r.exact {
            "exact".to_owned()
        } else {
            r.problems.join("; ")
        }
    };
    println!("### {} ({}{runs})", ra.scenario, ra.params);
    println!();
    let mut head = format!("| figure | {} |", ra.target);
    let mut rule = "|---|---:|".to_owned();
    for rb in &rest {
        head.push_str(&format!(" {} |", rb.target));
        rule.push_str("---:|");
    }
    for rb in &rest {
        if rest.len() == 1 {
            head.push_str(" ratio |");
        } else {
            head.push_str(&format!(" {}/{} |", ra.target, rb.target));
        }
        rule.push_str("---:|");
    }
    println!("{head}");
    println!("{rule}");
    for (k, va) in &ra.metrics {
        let mut line = format!("| {k} | {} |", fmt_num(*va));
        let mut ratios = String::new();
        for rb in &rest {
            let vb = rb.metrics.iter().find(|(kb, _)| kb == k).map(|(_, v)| *v);
            let (sb, ratio) = match vb {
                Some(vb) if vb != 0.0 => (fmt_num(vb), format!("{:.2}", va / vb)),
                Some(vb) => (fmt_num(vb), "-".to_owned()),
                None => ("n/a".to_owned(), "-".to_owned()),
            };
            line.push_str(&format!(" {sb} |"));
            ratios.push_str(&format!(" {ratio} |"));
        }
        println!("{line}{ratios}");
    }
    let mut counts = format!("| counts | {} |", verdict(&ra));
    for rb in &rest {
        counts.push_str(&format!(" {} |", verdict(rb)));
    }
    for _ in &rest {
        counts.push_str(" |");
    }
    println!("{counts}");
    Ok(())
}
