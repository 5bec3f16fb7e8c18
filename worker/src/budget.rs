//! The worker's memory budget: how much memory the batches it holds may
//! take, so one job with an enormous (but valid) batch fails with a clear
//! error instead of aborting the worker on an allocation, and the worker
//! keeps serving every other job.
//!
//! The budget covers the batches a worker holds per consumer: its outbox of
//! produced gRPC batches and the batches it is making. A job whose full
//! batch times the configured `max_outstanding` does not fit is refused by
//! the worker (its tasks fail, naming the sizes and the flags) and, when
//! every registered worker announced a budget it cannot fit, by the
//! coordinator when it is submitted.
//!
//! By default the budget is half the memory this process may use: the
//! cgroup's limit when there is one (a container's), else the machine's RAM.

use std::path::Path;

/// Budget when neither a cgroup limit nor /proc/meminfo can be read.
const FALLBACK: u64 = 4 << 30;

/// Half of what this process may use: the cgroup limit (v2 `memory.max`,
/// v1 `memory.limit_in_bytes`) when set, else the machine's RAM.
pub fn detect() -> u64 {
    let ram = meminfo_total(Path::new("/proc/meminfo"));
    let cgroup = cgroup_limit(Path::new("/sys/fs/cgroup"));
    let limit = match (cgroup, ram) {
        (Some(c), Some(r)) => c.min(r),
        (Some(c), None) => c,
        (None, Some(r)) => r,
        (None, None) => return FALLBACK,
    };
    limit / 2
}

/// `MemTotal` of a meminfo file, in bytes.
fn meminfo_total(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The memory limit of the cgroup mounted at `root` (v2, or v1's memory
/// controller); None when unlimited or unreadable.
fn cgroup_limit(root: &Path) -> Option<u64> {
    for file in ["memory.max", "memory/memory.limit_in_bytes"] {
        if let Ok(text) = std::fs::read_to_string(root.join(file)) {
            // "max" (v2) or a huge number (v1) mean no limit.
            return text.trim().parse::<u64>().ok().filter(|&n| n < (1 << 60));
        }
    }
    None
}

pub use loader_process::size::parse_bytes;

/// `--memory-budget`: a size no larger than the memory this process may
/// use (the cgroup limit, else RAM). A budget above it would let a job's
/// batches be allocated that the machine cannot hold, and the allocation
/// would abort the worker instead of refusing that one job.
pub fn parse_budget(text: &str) -> Result<u64, String> {
    let budget = parse_bytes(text)?;
    let ram = meminfo_total(Path::new("/proc/meminfo"));
    let limit = match (cgroup_limit(Path::new("/sys/fs/cgroup")), ram) {
        (Some(c), Some(r)) => Some(c.min(r)),
        (c, r) => c.or(r),
    };
    check_budget(budget, limit)
}

/// `budget`, unless it exceeds `limit` (what this process may use).
fn check_budget(budget: u64, limit: Option<u64>) -> Result<u64, String> {
    use loader_job::footprint::human_bytes;
    match limit {
        Some(limit) if budget > limit => Err(format!(
            "{} is more than the {} of memory this worker may use (its container's limit, or the machine's RAM); \
             give at most that, or leave it out for half of it",
            human_bytes(budget),
            human_bytes(limit)
        )),
        _ => Ok(budget),
    }
}

/// Why a job's batches do not fit, in one line; None when they do.
pub(crate) fn refuse(job_id: u64, batch_bytes: u64, in_flight: u32, budget: u64) -> Option<String> {
    let need = batch_bytes.saturating_mul(u64::from(in_flight.max(1)));
    (need > budget).then(|| {
        use loader_job::footprint::human_bytes;
        format!(
            "job {job_id}: batches of {} do not fit this worker's memory budget of {} with {in_flight} in flight \
             (--memory-budget, --max-outstanding); use a smaller batch_size or sample shape",
            human_bytes(batch_bytes),
            human_bytes(budget),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_above_the_machines_memory_is_refused_in_one_line() {
        assert_eq!(check_budget(8 << 30, Some(16 << 30)), Ok(8 << 30));
        assert_eq!(check_budget(8 << 30, None), Ok(8 << 30), "nothing known: taken as given");
        let e = check_budget(1 << 40, Some(16 << 30)).expect_err("1 TiB on 16 GiB");
        assert!(e.contains("1099.5 GB is more than the 17.2 GB of memory") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn limits_come_from_the_cgroup_or_meminfo() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("meminfo"), "MemTotal:       24576000 kB\nMemFree: 1 kB\n").expect("write");
        assert_eq!(meminfo_total(&dir.path().join("meminfo")), Some(24_576_000 * 1024));
        assert_eq!(cgroup_limit(dir.path()), None, "no cgroup files");
        std::fs::write(dir.path().join("memory.max"), "max\n").expect("write");
        assert_eq!(cgroup_limit(dir.path()), None, "unlimited");
        std::fs::write(dir.path().join("memory.max"), "4294967296\n").expect("write");
        assert_eq!(cgroup_limit(dir.path()), Some(4 << 30));
        assert!(detect() > 0);
    }

    #[test]
    fn a_batch_that_does_not_fit_is_refused_in_one_line() {
        assert_eq!(refuse(1, 10 << 20, 8, 1 << 30), None);
        let e = refuse(7, 40_000_000_224, 8, 12 << 30).expect("refused");
        assert!(e.starts_with("job 7: batches of 40.0 GB do not fit this worker's memory budget of 12.9 GB"), "{e}");
        assert!(!e.contains('\n'));
    }
}
