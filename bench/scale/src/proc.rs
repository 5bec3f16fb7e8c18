//! The coordinator's process, read from `/proc`.

/// CPU seconds (user + system) process `pid` has used.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised name: state is the 1st, utime the
    // 12th, stime the 13th.
    let rest = stat.rsplit(')').next().unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    Ok((ticks(11) + ticks(12)) as f64 / USER_HZ)
}

/// The peak resident memory of process `pid` (VmHWM), in MB.
pub fn peak_rss_mb(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/{pid}/status"))?;
    Ok(kb / 1000.0)
}

/// Clock ticks per second of `/proc/PID/stat`: USER_HZ, 100 on every
/// Linux architecture Loader builds for.
const USER_HZ: f64 = 100.0;
