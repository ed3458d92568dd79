//! Server and load-tool resource readings from `/proc`: resident memory
//! (`/proc/PID/status`, `VmRSS`) and CPU time (`/proc/PID/stat`, `utime` and
//! `stime`), summed over a set of processes (e.g. nginx's workers).

use anyhow::{anyhow, Context, Result};
use std::time::Instant;

/// Linux reports `utime`/`stime` in USER_HZ ticks, which is 100 per second
/// on every architecture the kernel ships (it is part of the ABI).
const USER_HZ: u64 = 100;

/// CPU time used so far, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    /// User time.
    pub user_us: u64,
    /// System (kernel) time.
    pub sys_us: u64,
}

impl Cpu {
    /// User plus system time.
    pub(crate) fn total_us(&self) -> u64 {
        self.user_us + self.sys_us
    }

    /// `self - earlier`, saturating.
    pub(crate) fn since(&self, earlier: &Cpu) -> Cpu {
        Cpu {
            user_us: self.user_us.saturating_sub(earlier.user_us),
            sys_us: self.sys_us.saturating_sub(earlier.sys_us),
        }
    }
}

fn stat_path(pid: Option<u32>, file: &str) -> String {
    match pid {
        Some(p) => format!("/proc/{p}/{file}"),
        None => format!("/proc/self/{file}"),
    }
}

/// CPU time of one process (`None`: this process).
///
/// # Errors
/// The process does not exist or its stat line is malformed.
pub(crate) fn cpu(pid: Option<u32>) -> Result<Cpu> {
    let path = stat_path(pid, "stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("{path}: malformed"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': field 3 (state) is index 0, so utime (14) is 11 and stime (15) is 12.
    let tick = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| anyhow!("{path}: no field {}", i + 3))
    };
    Ok(Cpu {
        user_us: tick(11)? * (1_000_000 / USER_HZ),
        sys_us: tick(12)? * (1_000_000 / USER_HZ),
    })
}

/// Resident set size of one process, in KiB.
///
/// # Errors
/// The process does not exist or has no `VmRSS` line.
pub(crate) fn rss_kb(pid: Option<u32>) -> Result<u64> {
    let path = stat_path(pid, "status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("{path}: no VmRSS"))
}

/// Busy CPU time of the whole machine (every process and the kernel), in µs,
/// from the first line of `/proc/stat`.
///
/// # Errors
/// `/proc/stat` is unreadable or malformed.
pub(crate) fn machine_busy_us() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow!("/proc/stat: no cpu line"))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum();
    Ok(busy * (1_000_000 / USER_HZ))
}

/// The processes measured as "the server".
#[derive(Debug, Clone, Default)]
pub(crate) struct Server {
    /// Their pids; empty means no server-side readings.
    pub pids: Vec<u32>,
}

impl Server {
    /// Summed CPU time, or `None` without pids.
    ///
    /// # Errors
    /// A process vanished.
    pub(crate) fn cpu(&self) -> Result<Option<Cpu>> {
        if self.pids.is_empty() {
            return Ok(None);
        }
        let mut sum = Cpu::default();
        for &p in &self.pids {
            let c = cpu(Some(p))?;
            sum.user_us += c.user_us;
            sum.sys_us += c.sys_us;
        }
        Ok(Some(sum))
    }

    /// Summed RSS in KiB, or `None` without pids.
    ///
    /// # Errors
    /// A process vanished.
    pub(crate) fn rss_kb(&self) -> Result<Option<u64>> {
        if self.pids.is_empty() {
            return Ok(None);
        }
        let mut sum = 0;
        for &p in &self.pids {
            sum += rss_kb(Some(p))?;
        }
        Ok(Some(sum))
    }
}

/// CPU readings of the server and of this process over one measured phase.
#[derive(Debug)]
pub(crate) struct Meter {
    server: Server,
    server0: Option<Cpu>,
    own0: Cpu,
    machine0: u64,
    t0: Instant,
}

/// What a [`Meter`] measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    /// Server CPU over the phase (`None` without pids).
    pub server: Option<Cpu>,
    /// This process's CPU over the phase.
    pub own: Cpu,
    /// Busy CPU time of the whole machine over the phase, in µs.
    pub machine_us: u64,
    /// Wall time of the phase, in seconds.
    pub wall_s: f64,
}

impl Meter {
    /// Takes the "before" readings.
    ///
    /// # Errors
    /// A process vanished.
    pub(crate) fn start(server: &Server) -> Result<Self> {
        Ok(Meter {
            server: server.clone(),
            server0: server.cpu()?,
            own0: cpu(None)?,
            machine0: machine_busy_us()?,
            t0: Instant::now(),
        })
    }

    /// Takes the "after" readings.
    ///
    /// # Errors
    /// A process vanished.
    pub(crate) fn stop(&self) -> Result<Usage> {
        let wall_s = self.t0.elapsed().as_secs_f64();
        let server = match (self.server.cpu()?, &self.server0) {
            (Some(now), Some(then)) => Some(now.since(then)),
            _ => None,
        };
        Ok(Usage {
            server,
            own: cpu(None)?.since(&self.own0),
            machine_us: machine_busy_us()?.saturating_sub(self.machine0),
            wall_s,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        assert!(rss_kb(None).expect("own status") > 0);
        cpu(None).expect("own stat");
    }
}
