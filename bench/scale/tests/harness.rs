//! A CI-sized run of the coordinator load harness against a real
//! `loader-server`: 1,000 simulated workers and 50 trainer ranks, with
//! churn (a tenth of the workers join late, a tenth leave, a twentieth die
//! holding ranges, a tenth are drained). The coordinator's bookkeeping must
//! be exactly once: every batch delivered, every extra copy one it re-sent
//! knowingly and counted, its delivery counts the workers' own.

use std::time::Duration;

use loader_e2e::{Proc, run};

#[test]
fn a_thousand_workers_with_churn_keep_the_bookkeeping_exactly_once() {
    run(Duration::from_secs(120), |scope| {
        let server = Proc::listening(&scope, "loader-server", &["--listen", "127.0.0.1:0"]);
        let url = format!("http://{}", server.addr());
        let config = loader_scale::Config {
            workers: 1000,
            trainers: 50,
            batches_per_trainer: 200,
            batch_rate: 50.0,
            window: 2,
            channels: 16,
            beat: None,
            churn: true,
            limit: Duration::from_secs(90),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let report = runtime.block_on(loader_scale::run(&url, config)).expect("harness");
        assert!(report.finished, "the job did not finish within the limit: {report:?}");
        // Registrations spread over two seconds while the job runs, and the
        // churn starts early: not all thousand are ever registered at once.
        assert!(report.registered >= 700, "registered at the peak: {report:?}");
        assert_eq!(report.missing, 0, "{report:?}");
        assert_eq!(report.unexplained, 0, "{report:?}");
        assert_eq!(report.duplicates, report.resent, "every copy beyond the first was re-sent knowingly: {report:?}");
        assert!(report.exactly_once());
        assert_eq!(report.heartbeat_errors, 0, "{report:?}");
    });
}
