//! `loaderctl scale`: sets how many workers a coordinator's worker pool runs
//! (`loader-server --worker-pool local`), and with `--wait` waits until the
//! workers it started have registered and those it drained have left;
//! `loaderctl autoscale`: hands the pool's size to the coordinator's policy.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use loader_proto::pb::{AutoscaleRequest, ListWorkersRequest, ScaleWorkersRequest, ScaleWorkersResponse};
use tonic::Code;

use super::{AutoscaleArgs, ScaleArgs};
use super::status::{admin, runtime};
use loader_client::LoaderError;
use loader_client::connect::{self, attempt};

/// How often `--wait` looks at the worker list.
const POLL: Duration = Duration::from_millis(200);

/// Scales the pool, prints one line, and waits if asked.
pub(crate) fn run(args: &ScaleArgs) -> anyhow::Result<()> {
    let address = connect::normalize(&args.coordinator);
    runtime()?.block_on(async {
        let mut admin = admin(&address).await?;
        let before: HashSet<u64> = attempt(&address, "ListWorkers", admin.list_workers(ListWorkersRequest {}))
            .await?
            .workers
            .iter()
            .map(|w| w.worker_id)
            .collect();
        let scaled = match attempt(
            &address,
            "ScaleWorkers",
            admin.scale_workers(ScaleWorkersRequest { workers: args.workers }),
        )
        .await
        {
            Err(LoaderError::Rpc {
                code: Code::FailedPrecondition | Code::PermissionDenied | Code::InvalidArgument,
                message,
                ..
            }) => {
                return Err(anyhow::anyhow!("coordinator {address}: {message}"));
            }
            other => other?,
        };
        println!("{}", describe(&scaled));
        let Some(limit) = args.wait.filter(|w| *w > 0.0).map(Duration::from_secs_f64) else {
            return Ok(());
        };
        let deadline = Instant::now() + limit;
        loop {
            let listed = attempt(&address, "ListWorkers", admin.list_workers(ListWorkersRequest {}))
                .await?
                .workers;
            let joined = listed.iter().filter(|w| !before.contains(&w.worker_id)).count() as u32;
            let leaving = listed.iter().filter(|w| scaled.draining.contains(&w.worker_id)).count();
            if joined >= scaled.started && leaving == 0 {
                println!("{} workers running", listed.len());
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(anyhow::anyhow!(
                    "after {:.0?}: {joined} of {} started workers registered, {leaving} drained workers still running",
                    limit,
                    scaled.started
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    })
}

/// Turns autoscaling on (or off) and prints one line.
pub(crate) fn autoscale(args: &AutoscaleArgs) -> anyhow::Result<()> {
    let address = connect::normalize(&args.coordinator);
    let request = AutoscaleRequest {
        min: args.min.unwrap_or(0),
        max: args.max.unwrap_or(0),
        target_stall: args.target_stall,
        cooldown_ms: (args.cooldown * 1000.0) as u64,
        off: args.off,
    };
    runtime()?.block_on(async {
        let mut admin = admin(&address).await?;
        match attempt(&address, "Autoscale", admin.autoscale(request)).await {
            Err(LoaderError::Rpc { code: Code::FailedPrecondition | Code::InvalidArgument, message, .. }) => {
                Err(anyhow::anyhow!("coordinator {address}: {message}"))
            }
            other => other.map(drop).map_err(anyhow::Error::from),
        }
    })?;
    if args.off {
        println!("autoscaling off: the pool keeps its current size");
    } else {
        println!(
            "autoscaling {}..{} workers on a target stall of {:.1}% (cool-down {:.0?})",
            args.min.unwrap_or(0),
            args.max.unwrap_or(0),
            args.target_stall * 100.0,
            Duration::from_secs_f64(args.cooldown)
        );
    }
    Ok(())
}

/// One line: what the pool does.
fn describe(s: &ScaleWorkersResponse) -> String {
    let mut line = format!("workers {} -> {}", s.previous, s.workers);
    if s.started > 0 {
        line.push_str(&format!(": started {}", s.started));
    }
    if !s.draining.is_empty() {
        let ids: Vec<String> = s.draining.iter().map(u64::to_string).collect();
        line.push_str(&format!(
            ": draining worker{} {} (they finish what they hold, then exit)",
            if ids.len() == 1 { "" } else { "s" },
            ids.join(", ")
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_what_the_pool_does() {
        let up = ScaleWorkersResponse { previous: 1, workers: 3, started: 2, draining: vec![] };
        assert_eq!(describe(&up), "workers 1 -> 3: started 2");
        let down = ScaleWorkersResponse { previous: 3, workers: 1, started: 0, draining: vec![4, 7] };
        assert_eq!(describe(&down), "workers 3 -> 1: draining workers 4, 7 (they finish what they hold, then exit)");
        let same = ScaleWorkersResponse { previous: 2, workers: 2, started: 0, draining: vec![] };
        assert_eq!(describe(&same), "workers 2 -> 2");
    }
}
