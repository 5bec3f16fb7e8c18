//! The table `bench/scale/run.sh` prints.

use crate::report::Report;

/// Columns: see docs/benchmarks.md ("The coordinator at scale").
pub const HEADER: &str = "| workers | trainer ranks | batches | heartbeats (timed) | p50 ms | p99 ms | max ms | coordinator CPU s | CPU us / heartbeat | assignments / s / core | peak RSS MB | run s | exactly once |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |";

/// One row for a run of `workers` workers and `trainers` ranks.
pub fn row(workers: &u32, trainers: u32, r: &Report, cpu: Option<f64>, peak_mb: Option<f64>) -> String {
    // No timed heartbeat (every call waited for work): no latency to show.
    let ms = |d: std::time::Duration| if r.heartbeats == 0 { "-".to_owned() } else { format!("{:.1}", d.as_secs_f64() * 1000.0) };
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let per_beat = cpu.map(|c| format!("{:.0}", c * 1e6 / r.calls.max(1) as f64));
    let per_core = cpu.map(|c| format!("{:.0}", r.assigned as f64 / c.max(1e-9)));
    let once = if r.exactly_once() {
        format!("yes ({} re-sent)", r.resent)
    } else {
        format!("NO: {} copies ({} re-sent), {} ranks unexplained, {} missing, finished {}", r.duplicates, r.resent, r.unexplained, r.missing, r.finished)
    };
    format!(
        "| {workers} | {trainers} | {} | {} ({}) | {} | {} | {} | {} | {} | {} | {} | {:.1} | {once} |",
        r.total,
        r.calls,
        r.heartbeats,
        ms(r.heartbeat_p50),
        ms(r.heartbeat_p99),
        ms(r.heartbeat_max),
        opt(cpu.map(|c| format!("{c:.1}"))),
        opt(per_beat),
        opt(per_core),
        opt(peak_mb.map(|m| format!("{m:.0}"))),
        r.elapsed.as_secs_f64(),
    )
}
