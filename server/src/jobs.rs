//! Jobs, their consumers' queues and delivery progress.

use std::collections::{BTreeMap, HashMap};

use loader_proto::pb;
use loader_job::sampler::Plan;

use crate::error::CoordinatorError;
use crate::journal::{JournalError, JournaledJob};
use crate::kept_ranges::KeptRanges;
use crate::lanes::LaneHolders;
use crate::range_queue::RangeQueue;

/// What the coordinator tracks for one consumer (data-parallel rank).
#[derive(Debug)]
pub(crate) struct ConsumerState {
    /// Batches still to be handed to workers.
    pub(crate) queue: RangeQueue,
    /// Batches workers reported handed to this consumer's stream.
    pub(crate) delivered: u64,
    /// Delivered batches taken back unacknowledged (their worker died, or
    /// their trainer left) and delivered once more: `delivered` counts them
    /// twice. Counted when the second copy is reported, so that it always
    /// equals the copies beyond the first (a batch taken back just before
    /// its trainer finished may never go out again).
    pub(crate) resent: u64,
    /// Batches taken back after they were delivered, not yet delivered
    /// again: their next delivery is a re-send.
    pub(crate) redeliver: std::collections::BTreeSet<u64>,
    /// Watermark the trainer acknowledged: every seq below it was consumed.
    pub(crate) consumed: u64,
    /// The backup task running for batches the trainer waits on, if any.
    pub(crate) backup: Option<Backup>,
    /// Backup batches launched, won (the copy came first) and wasted (the
    /// original came first).
    pub(crate) backups: BackupCounts,
    /// On a shared stream: the rank this subscriber receives. None for a
    /// rank.
    pub(crate) subscribes_to: Option<u32>,
    /// A subscriber whose trainer left (finished, closed or died): nothing
    /// is made for it, and the job does not wait for it.
    pub(crate) left: bool,
    /// On a shared stream: batches handed out for this subscriber alone.
    pub(crate) assigned_alone: u64,
}

impl ConsumerState {
    /// A consumer whose batches below `consumed` need no making.
    fn at(consumed: u64, total: u64, subscribes_to: Option<u32>) -> Self {
        Self {
            queue: RangeQueue::starting_at(consumed, total),
            delivered: consumed,
            resent: 0,
            redeliver: std::collections::BTreeSet::new(),
            consumed,
            backup: None,
            backups: BackupCounts::default(),
            subscribes_to,
            left: false,
            assigned_alone: 0,
        }
    }
}

/// Most subscribers a shared stream holds over its life (each keeps a few
/// counters and a queue; a trainer restarting in a loop cannot grow the
/// coordinator without bound).
pub(crate) const MAX_SUBSCRIBERS: u32 = 4096;


/// A second copy of late batches (see `coordinator::backup`): at most one
/// per consumer at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Backup {
    /// The worker that held the late batches.
    pub(crate) original: u64,
    /// The worker making the copy, once one took it.
    pub(crate) copy: Option<u64>,
    /// The late batches neither has reported delivered yet.
    pub(crate) seqs: std::collections::BTreeSet<u64>,
    /// Of them, those the original had reported delivered (sent on a stream
    /// the trainer does not receive): the copy re-sends them.
    pub(crate) resend: std::collections::BTreeSet<u64>,
}

/// What backup tasks did for one consumer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BackupCounts {
    pub(crate) launched: u64,
    pub(crate) won: u64,
    pub(crate) wasted: u64,
}

/// A job and its progress.
#[derive(Debug)]
pub(crate) struct JobState {
    /// The job as trainers and workers see it.
    pub(crate) job: pb::Job,
    /// Its split into consumers and batches.
    pub(crate) plan: Plan,
    /// One entry per consumer.
    pub(crate) consumers: Vec<ConsumerState>,
    /// Set when a worker could not produce a batch; the job is stopped.
    pub(crate) error: Option<String>,
    /// Some batch of it was delivered (or consumed before a restart).
    pub(crate) delivered_any: bool,
    /// Workers whose lease expired while they held batches of this job
    /// before any was delivered: a job that kills every worker it reaches
    /// is failed instead of being handed around (see `Coordinator::expire`).
    pub(crate) deaths_before_delivery: u32,
    /// A resumed plan of the same name replaced it: no session opens on it.
    pub(crate) replaced: bool,
    /// Which worker reads which lane, for a job read as lanes.
    pub(crate) lanes: Option<LaneHolders>,
    /// Its workers' sample cache use, summed (None: no worker used a
    /// cache for it); not journaled.
    pub(crate) cache: Option<pb::CacheUse>,
    /// On a shared stream: which worker made (and keeps) which recent
    /// ranges, for subscribers that trail; not journaled.
    pub(crate) kept: KeptRanges,
    /// The `job` span: from creation (or restore) until every consumer
    /// consumed its last batch or the job failed. Disabled (free) unless
    /// spans are exported.
    life: tracing::Span,
}

impl JobState {
    /// Ends the job's span: it failed.
    pub(crate) fn end_life(&mut self) {
        self.life = tracing::Span::none();
    }

    /// True once the job failed or every consumer consumed its last batch:
    /// nothing will be produced for it any more.
    pub(crate) fn finished(&self) -> bool {
        self.error.is_some() || self.all_consumed()
    }

    /// Every consumer the job waits for consumed its last batch: every rank,
    /// or on a shared stream every subscriber still there (and one came).
    fn all_consumed(&self) -> bool {
        let total = self.plan.total_batches();
        match self.shared_max_lag() {
            None => self.consumers.iter().all(|c| c.consumed >= total),
            Some(_) => {
                let subscribers = &self.consumers[self.plan.consumers as usize..];
                !subscribers.is_empty() && subscribers.iter().filter(|c| !c.left).all(|c| c.consumed >= total)
            }
        }
    }

    /// Ends the job's span if every consumer consumed its last batch.
    pub(crate) fn end_life_if_consumed(&mut self) {
        if !self.life.is_none() && self.all_consumed() {
            self.end_life();
        }
    }

    /// For a shared stream (`JobSpec.shared`), how many consumed batches a
    /// subscriber may trail the one furthest ahead and still share its
    /// batches; None for any other job.
    pub(crate) fn shared_max_lag(&self) -> Option<u64> {
        let shared = self.job.spec.as_ref()?.shared.as_ref()?;
        let lag = if shared.max_lag == 0 { loader_job::spec::DEFAULT_SHARED_MAX_LAG } else { shared.max_lag };
        Some(u64::from(lag))
    }

    /// Subscribers of this shared stream still there.
    pub(crate) fn live_subscribers(&self) -> usize {
        self.consumers.iter().filter(|c| c.subscribes_to.is_some() && !c.left).count()
    }

    /// Subscribes a trainer to rank `rank` of this shared stream, starting
    /// at `start` (its resume point, else the job's first batch): a new
    /// subscriber, or `reclaim`, the one a reopening session had. Returns
    /// the subscriber's consumer id.
    pub(crate) fn subscribe(&mut self, rank: u32, reclaim: Option<u32>, start: Option<u64>) -> Result<u32, CoordinatorError> {
        let job_id = self.job.job_id;
        let total = self.plan.total_batches();
        let first = self.plan.first_seq();
        let ranks = self.plan.consumers;
        let id = match reclaim {
            Some(id) if id < ranks => return Err(CoordinatorError::BadSubscriber { job_id, subscriber: id, rank }),
            Some(id) => id,
            None => u32::try_from(self.consumers.len()).unwrap_or(u32::MAX),
        };
        if id - ranks >= MAX_SUBSCRIBERS {
            return Err(CoordinatorError::TooManySubscribers(job_id, MAX_SUBSCRIBERS));
        }
        match self.consumers.get_mut(id as usize) {
            Some(c) if c.subscribes_to != Some(rank) => {
                return Err(CoordinatorError::BadSubscriber { job_id, subscriber: id, rank });
            }
            Some(c) => {
                // A session the coordinator lost comes back to its place.
                c.left = false;
                if let Some(start) = start {
                    let start = start.clamp(first, total);
                    c.queue = RangeQueue::starting_at(start, total);
                    c.consumed = start;
                    c.delivered = start;
                }
            }
            None => {
                // Ids below it that a coordinator restart forgot stay gaps:
                // subscribers that left.
                while self.consumers.len() < id as usize {
                    let mut gap = ConsumerState::at(total, total, Some(rank));
                    gap.left = true;
                    self.consumers.push(gap);
                }
                let start = start.unwrap_or(first).clamp(first, total);
                self.consumers.push(ConsumerState::at(start, total, Some(rank)));
            }
        }
        Ok(id)
    }
}

/// Whether two specs are the same job planned differently: equal but for
/// the world size, the batch size, where a resume starts and a mixture's
/// weights (new ones at a resume).
fn same_job(a: &pb::JobSpec, b: &pb::JobSpec) -> bool {
    let bare = |s: &pb::JobSpec| {
        let mut bare = pb::JobSpec { consumers: 0, batch_size: 0, resume: None, ..s.clone() };
        if let Some(pb::dataset_spec::Kind::Mix(m)) = bare.dataset.as_mut().and_then(|d| d.kind.as_mut()) {
            m.sources.iter_mut().for_each(|s| s.weight = 0.0);
            m.stages.clear();
            m.weights_from = 0;
        }
        bare
    };
    bare(a) == bare(b)
}

/// Every job, by id, and named jobs by name.
#[derive(Debug, Default)]
pub(crate) struct JobTable {
    next_id: u64,
    jobs: BTreeMap<u64, JobState>,
    names: HashMap<String, u64>,
}

impl JobTable {
    /// Creates the job, or attaches to the one with the same name and spec.
    /// Returns the job and whether it was attached.
    /// `persist` records a new job durably before it becomes visible.
    ///
    /// A job resumed on another world size or batch size (a spec with
    /// `resume`) comes back under its name with another plan: it replaces
    /// the job of that name when that one is the same job (dataset, sampler,
    /// epochs, pipeline) and no trainer has a session on it (`in_use`), so
    /// that every new rank, given the same state, attaches to one new job,
    /// and ranks given different states, or an old run still going, are
    /// refused rather than split silently.
    pub(crate) fn create_or_attach(
        &mut self,
        spec: pb::JobSpec,
        in_use: impl Fn(u64) -> bool,
        persist: impl FnOnce(&pb::Job) -> Result<(), JournalError>,
    ) -> Result<(pb::Job, bool), CoordinatorError> {
        let plan = loader_job::spec::plan(&spec)?;
        if !spec.name.is_empty()
            && let Some(&id) = self.names.get(&spec.name)
        {
            let existing = &self.jobs[&id];
            match existing.job.spec.as_ref() {
                Some(s) if *s == spec => return Ok((existing.job.clone(), true)),
                Some(s) if spec.resume.is_some() && same_job(s, &spec) => {
                    if in_use(id) {
                        return Err(CoordinatorError::ResumeConflict(spec.name));
                    }
                    tracing::info!(job_id = id, name = %spec.name, "job replaced by a resumed plan");
                    if let Some(old) = self.jobs.get_mut(&id) {
                        old.replaced = true;
                        old.end_life();
                    }
                    self.names.remove(&spec.name);
                }
                _ => return Err(CoordinatorError::NameTaken(spec.name)),
            }
        }
        self.next_id += 1;
        let id = self.next_id;
        let job = pb::Job {
            job_id: id,
            num_samples: plan.num_samples,
            batches_per_epoch: plan.batches_per_epoch(),
            spec: Some(spec),
        };
        persist(&job)?;
        self.insert(job.clone(), plan, &[]);
        Ok((job, false))
    }

    /// Brings back a journaled job: each consumer resumes at its watermark.
    pub(crate) fn restore(&mut self, journaled: JournaledJob) -> Result<(), CoordinatorError> {
        let spec = journaled.job.spec.clone().ok_or(CoordinatorError::Missing("spec of a journaled job"))?;
        let plan = loader_job::spec::plan(&spec)?;
        self.next_id = self.next_id.max(journaled.job.job_id);
        self.insert(journaled.job, plan, &journaled.watermarks);
        Ok(())
    }

    fn insert(&mut self, job: pb::Job, plan: Plan, watermarks: &[(u32, u64)]) {
        // A resumed job's sequence numbers start past 0.
        let first = plan.first_seq();
        let consumers = (0..plan.consumers)
            .map(|c| {
                let consumed = watermarks.iter().find(|(k, _)| *k == c).map_or(0, |(_, w)| *w).max(first);
                ConsumerState::at(consumed, plan.total_batches(), None)
            })
            .collect();
        if let Some(spec) = &job.spec
            && !spec.name.is_empty()
        {
            self.names.insert(spec.name.clone(), job.job_id);
        }
        let name = job.spec.as_ref().map_or("", |s| s.name.as_str());
        let life = tracing::info_span!("job", job_id = job.job_id, name, batches = plan.total_batches());
        self.jobs.insert(job.job_id, JobState {
                life,
                job,
                lanes: LaneHolders::new(&plan),
                plan,
                consumers,
                error: None,
                delivered_any: watermarks.iter().any(|&(_, w)| w > 0),
                replaced: false,
                deaths_before_delivery: 0,
                cache: None,
                kept: KeptRanges::default(),
            });
    }

    pub(crate) fn get(&self, id: u64) -> Result<&JobState, CoordinatorError> {
        self.jobs.get(&id).ok_or(CoordinatorError::UnknownJob(id))
    }

    /// Restarts a consumer's queue at `start_seq`, the first batch a resumed
    /// trainer has not consumed.
    pub(crate) fn reposition(&mut self, id: u64, consumer: u32, start_seq: u64) -> Result<(), CoordinatorError> {
        let job = self.jobs.get_mut(&id).ok_or(CoordinatorError::UnknownJob(id))?;
        let total = job.plan.total_batches();
        let consumers = job.plan.consumers;
        let c = job.consumers.get_mut(consumer as usize).ok_or(CoordinatorError::BadConsumer { consumer, consumers })?;
        if start_seq > total {
            return Err(CoordinatorError::BadResume { start_seq, total });
        }
        // Nothing exists before a resumed job's first batch.
        let start_seq = start_seq.max(job.plan.first_seq());
        c.queue = RangeQueue::starting_at(start_seq, total);
        c.consumed = start_seq;
        c.delivered = start_seq;
        Ok(())
    }

    /// The job named `name`, if any (an empty name names none).
    pub(crate) fn id_of(&self, name: &str) -> Option<u64> {
        if name.is_empty() { None } else { self.names.get(name).copied() }
    }

    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut JobState> {
        self.jobs.get_mut(&id)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &JobState> {
        self.jobs.values()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut JobState> {
        self.jobs.values_mut()
    }
}
