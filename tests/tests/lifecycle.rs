//! Planned changes with real processes: a worker drained away mid-job (and
//! one whose consumer never fetches), and a trainer that continues from its
//! saved state after a SIGKILL.

use std::path::Path;
use std::time::{Duration, Instant};

use loader_client::{Dtype, JobSpec, Loader, spec};
use loader_e2e::{Cluster, SilentTrainer, Trainer, assert_exact, assert_received, loaderctl, run, wait_until};

/// Lease TTL of the coordinator in these tests.
const TTL_MS: u64 = 1000;

/// A synthetic job of `batches` batches of 16 samples, each sample costing
/// `cost_us` of worker CPU.
fn slow_job(batches: u64, cost_us: u64) -> JobSpec {
    spec::synthetic(batches * 16, &[16], Dtype::U8)
        .batch_size(16)
        .shuffle(7)
        .cost_ns(cost_us * 1000)
        .build()
        .expect("spec")
}

#[test]
fn drained_worker_exits_zero_and_the_sequence_stays_exact() {
    run(Duration::from_secs(120), |scope| {
        let ttl = Duration::from_millis(TTL_MS);
        let mut cluster = Cluster::builder().workers(3).ttl_ms(TTL_MS).start(&scope);
        let admin = cluster.admin();
        let job = slow_job(600, 1000);
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        trainer.wait_for(total / 4, Duration::from_secs(60));

        let victim = &mut cluster.workers[1];
        let id = admin.worker_id(victim.addr()).expect("the victim is listed");
        admin.drain(id).expect("drain");
        let drained = Instant::now();
        // Finishing what it holds takes a few batches of CPU; the rest is
        // one heartbeat to learn of the order and one to deregister.
        let bound = ttl + Duration::from_secs(5);
        let status = victim.wait_exit(bound).expect("the drained worker exits within its bound");
        let after = drained.elapsed();
        let at_exit = trainer.yielded();
        eprintln!(
            "drained worker exited {after:?} after the order with {status}; {at_exit} of {total} batches had arrived"
        );
        assert!(status.success(), "a drained worker exits 0, got {status}");
        assert!(at_exit < total, "the job ended before the drain finished; make it slower");
        admin.wait_for("the drained worker is no longer listed", Duration::from_secs(5), |a| {
            Ok(a.workers()?.iter().all(|w| w.worker_id != id).then_some(()))
        });

        let seen = trainer.join(Duration::from_secs(90));
        assert_received(&seen, &plan, 0, 0..total);
        for (i, worker) in cluster.workers.iter_mut().enumerate().filter(|(i, _)| *i != 1) {
            assert!(worker.wait_exit(Duration::ZERO).is_none(), "worker {i} exited too; only the drained one should");
        }
    });
}

#[test]
fn drain_hands_back_batches_nobody_fetches_and_another_worker_produces_them() {
    run(Duration::from_secs(120), |scope| {
        let ttl = Duration::from_millis(TTL_MS);
        let mut cluster = Cluster::builder()
            .workers(1)
            .ttl_ms(TTL_MS)
            .capture_worker_stderr()
            .worker_log("loader_worker=info")
            .start(&scope);
        let admin = cluster.admin();
        let job = spec::synthetic(64 * 16, &[16], Dtype::U8)
            .name("drain-silent")
            .batch_size(16)
            .shuffle(3)
            .build()
            .expect("spec");
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();

        // The worker's only session never fetches: its batches wait in the
        // worker's outbox.
        let silent = SilentTrainer::open(&cluster.url(), job.clone(), ttl / 3);
        let held = admin.wait_for("the worker holds batches for the silent session", Duration::from_secs(20), |a| {
            Ok(a.workers()?.first().map(|w| w.outstanding).filter(|&n| n > 0))
        });
        let victim = &mut cluster.workers[0];
        let id = admin.worker_id(victim.addr()).expect("the worker is listed");
        admin.drain(id).expect("drain");
        let drained = Instant::now();
        // Its held tasks take a moment of CPU; then one TTL in which nothing
        // moves, and a heartbeat interval to notice.
        let bound = ttl + ttl / 3 + Duration::from_secs(5);
        let status = victim.wait_exit(bound).expect("the drained worker exits within its bound");
        eprintln!("drained worker exited {:?} after the order with {status}; it held {held} batches", drained.elapsed());
        assert!(status.success(), "a drained worker exits 0, got {status}");
        assert!(
            victim.stderr().iter().any(|l| l.contains("handing the batches still held back")),
            "the worker said it handed its batches back"
        );
        let progress = admin.jobs().expect("jobs")[0].consumers[0];
        assert_eq!((progress.assigned, progress.delivered), (0, 0), "every batch it held is back in the queue");

        // Another worker, and a trainer that comes later for the same
        // consumer: it gets every batch, each once, in order.
        cluster.add_worker();
        cluster.wait_for_workers(1);
        let trainer = Trainer::spawn(Loader::builder(cluster.url()), job);
        let seen = trainer.join(Duration::from_secs(60));
        assert_received(&seen, &plan, 0, 0..total);
        // Each batch was produced and handed over once: the worker that
        // took them over reported every one delivered, none twice.
        let delivered = admin.wait_for("every batch reported delivered", Duration::from_secs(5), |a| {
            Ok(Some(a.jobs()?[0].consumers[0].delivered).filter(|&d| d >= total))
        });
        assert_eq!(delivered, total, "batches delivered by workers");
        drop(silent);
    });
}

/// The batches a `loaderctl consume --dump` file lists: `<seq> <epoch>
/// <idx0>,<idx1>,...` per line. A last line without its newline (the writer
/// was killed mid-line) is left out.
fn read_dump(path: &Path) -> Vec<(u64, Vec<u64>)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .map(|line| {
            let mut fields = line.split(' ');
            let seq = fields.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("dump line {line:?}"));
            let _epoch = fields.next();
            let indices = fields
                .next()
                .unwrap_or_default()
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap_or_else(|_| panic!("dump line {line:?}")))
                .collect();
            (seq, indices)
        })
        .collect()
}

#[test]
fn resumed_trainer_gets_the_batches_after_its_saved_state_exactly() {
    run(Duration::from_secs(180), |scope| {
        const SAVE_AFTER: u64 = 50;
        let (samples, batch, epochs) = (16_000u64, 16u32, 4u32);
        // The job loaderctl builds from these flags, for the expected batches.
        let job = spec::synthetic(samples, &[16], Dtype::U8)
            .name("resume-e2e")
            .batch_size(batch)
            .epochs(epochs)
            .build()
            .expect("spec");
        let plan = loader_job::spec::plan(&job).expect("plan");
        let total = plan.total_batches();
        let dir = tempfile::tempdir().expect("tempdir");
        let (state, before, after) =
            (dir.path().join("state.json"), dir.path().join("before"), dir.path().join("after"));
        let path = |p: &Path| p.display().to_string();

        // Two workers for the first trainer, a third one for the resumed one,
        // all on the same coordinator, which still has the job.
        let mut cluster = Cluster::builder().workers(2).ttl_ms(TTL_MS).start(&scope);
        let url = cluster.url();
        let first_args = [
            "consume",
            "--coordinator",
            &url,
            "--json",
            "--job-name",
            "resume-e2e",
            "--samples",
            &samples.to_string(),
            "--shape",
            "16",
            "--batch-size",
            &batch.to_string(),
            "--epochs",
            &epochs.to_string(),
            "--save-state-after",
            &SAVE_AFTER.to_string(),
            "--state-file",
            &path(&state),
            "--dump",
            &path(&before),
        ];
        let mut first = loaderctl(&scope, &first_args);
        wait_until("the first trainer saved its state", Duration::from_secs(30), || {
            assert!(first.wait_exit(Duration::ZERO).is_none(), "the first trainer exited before it was killed");
            state.exists()
        });
        first.kill();
        let consumed_before = read_dump(&before);
        eprintln!(
            "first trainer SIGKILLed after yielding {} of {total} batches; state saved at {SAVE_AFTER}",
            consumed_before.len()
        );
        assert!(consumed_before.len() as u64 >= SAVE_AFTER, "the dump holds every batch the state counts");
        assert!(
            (consumed_before.len() as u64) < total,
            "the first trainer finished before it was killed; make the job longer"
        );
        assert_exact(&consumed_before, &plan, 0, 0..consumed_before.len() as u64);

        cluster.add_worker();
        cluster.wait_for_workers(3);
        let mut resumed = loaderctl(
            &scope,
            &["consume", "--coordinator", &url, "--json", "--resume", &path(&state), "--dump", &path(&after)],
        );
        let status = resumed.wait_exit(Duration::from_secs(120)).expect("the resumed trainer finishes within 120 s");
        assert!(status.success(), "resumed trainer: {status}");
        assert_exact(&read_dump(&after), &plan, 0, SAVE_AFTER..total);
    });
}

/// Two ranks SIGKILLed after saving their states at different steps (as
/// preempted trainers are); the states merged with `loaderctl merge-states`;
/// three ranks resume from the merged state with `consume --resume
/// --world-size 3` on the same coordinator, which replaces the job by its
/// re-planned rest once the killed ranks' sessions expire. Over the whole
/// run every sample of each epoch is delivered once (plus the padding of
/// DistributedSampler's split).
#[test]
fn killed_ranks_resume_on_another_world_size_from_their_merged_states() {
    run(Duration::from_secs(180), |scope| {
        let saved_after = [30u64, 33];
        let (samples, batch, epochs) = (4_000u64, 16u32, 2u32);
        let dir = tempfile::tempdir().expect("tempdir");
        let file = |name: String| dir.path().join(name).display().to_string();
        let cluster = Cluster::builder().workers(2).ttl_ms(TTL_MS).start(&scope);
        let url = cluster.url();

        let mut firsts = Vec::new();
        for (rank, after) in saved_after.iter().enumerate() {
            let args = [
                "consume", "--coordinator", &url, "--json", "--job-name", "elastic-e2e",
                "--samples", &samples.to_string(), "--shape", "16", "--batch-size", &batch.to_string(),
                "--epochs", &epochs.to_string(), "--rank", &rank.to_string(), "--world-size", "2",
                "--save-state-after", &after.to_string(), "--state-file", &file(format!("state{rank}.json")),
                "--dump", &file(format!("before{rank}")),
            ];
            firsts.push(loaderctl(&scope, &args));
        }
        wait_until("both ranks saved their states", Duration::from_secs(60), || {
            (0..2).all(|r| Path::new(&file(format!("state{r}.json"))).exists())
        });
        for first in &mut firsts {
            first.kill();
        }
        let old = loader_client::LoaderState::load(file("state0.json".into())).expect("state");
        let old_plan = loader_job::spec::plan(&old.spec().expect("spec")).expect("plan");
        let mut delivered: Vec<(u32, Vec<u64>)> = Vec::new();
        for (rank, &after) in saved_after.iter().enumerate() {
            // The dump holds what the rank yielded, past its state too: the
            // state's batches are what the job counts as consumed.
            let mut dump = read_dump(Path::new(&file(format!("before{rank}"))));
            dump.truncate(after as usize);
            assert_exact(&dump, &old_plan, rank as u32, 0..after);
            delivered.extend(dump.into_iter().map(|(seq, i)| (old_plan.locate(seq).0, i)));
        }

        let merged = file("merged.json".into());
        let mut merge = loaderctl(&scope, &["merge-states", &file("state0.json".into()), &file("state1.json".into()), "--out", &merged]);
        assert!(merge.wait_exit(Duration::from_secs(30)).expect("merge-states exits").success());
        let mut resumed: Vec<_> = (0..3)
            .map(|rank| {
                let args = [
                    "consume", "--coordinator", &url, "--json", "--resume", &merged,
                    "--rank", &rank.to_string(), "--world-size", "3", "--dump", &file(format!("after{rank}")),
                ];
                loaderctl(&scope, &args)
            })
            .collect();
        for (rank, proc) in resumed.iter_mut().enumerate() {
            let status = proc.wait_exit(Duration::from_secs(120)).expect("a resumed rank finishes within 120 s");
            assert!(status.success(), "resumed rank {rank}: {status}: {:?}", proc.stderr());
        }
        let state = loader_client::LoaderState::load(&merged).expect("merged state");
        let resumption = state.resume_as(0, 3, None).expect("re-planned");
        let plan = loader_job::spec::plan(&resumption.spec).expect("plan");
        let mut padding = 0;
        for rank in 0..3u32 {
            let dump = read_dump(Path::new(&file(format!("after{rank}"))));
            assert_exact(&dump, &plan, rank, plan.first_seq()..plan.total_batches());
            for seq in plan.first_seq()..plan.total_batches() {
                let (epoch, index) = plan.locate(seq);
                padding += plan.batch_positions(epoch, index).filter(|&p| plan.epoch_position(epoch, rank, p).1).count();
            }
            delivered.extend(dump.into_iter().map(|(seq, i)| (plan.locate(seq).0, i)));
        }
        let mut repeats = 0;
        for epoch in 0..epochs {
            let mut got: Vec<u64> = delivered.iter().filter(|(e, _)| *e == epoch).flat_map(|(_, i)| i.iter().copied()).collect();
            got.sort_unstable();
            let total = got.len();
            got.dedup();
            assert_eq!(got, (0..samples).collect::<Vec<_>>(), "epoch {epoch}: every sample");
            repeats += total - got.len();
        }
        assert_eq!(repeats, padding, "repeats beyond the padding of the split");
    });
}
