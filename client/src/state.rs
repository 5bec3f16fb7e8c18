//! [`LoaderState`]: what a trainer saves next to its model checkpoint to
//! continue exactly after the last batch it was given, on this deployment
//! or on another one.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;

use loader_job::elastic::{self, Progress};
use loader_proto::pb::JobSpec;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::error::LoaderError;

/// The `format` this SDK writes and reads. Bumped whenever a field changes
/// meaning, so an old SDK refuses a newer state instead of misreading it.
/// Format 2: shuffled orders of sizes of odd bit width changed (the
/// sampler's permutation walks a smaller domain), so a format 1 state's
/// positions name other samples here.
pub const STATE_FORMAT: u32 = 2;

/// Where a [`Loader`](crate::Loader) stands in its job: the job spec, the
/// rank and world size, and the batches already yielded. Take it with
/// [`Loader::state`](crate::Loader::state) between two `next()` calls, save
/// it (it is serde-serializable; [`LoaderState::to_json`] and
/// [`LoaderState::save`] are ready-made), and pass it to
/// [`LoaderBuilder::resume`](crate::LoaderBuilder::resume): the new loader
/// yields exactly the batches the old one had not, in the same order, with
/// the same sample indices, whatever coordinator and however many workers
/// serve it (the sampler is a pure function of the spec).
///
/// As JSON:
/// ```json
/// {"format":2,"spec":"0a05...","rank":0,"world_size":2,"next_seq":17}
/// ```
/// `spec` is the job's `loader.v1.JobSpec`, protobuf-encoded, in lowercase
/// hex: exact, and readable by any protobuf tool. Out of order, batches
/// yielded ahead of `next_seq` are listed in `yielded_above`. A state made
/// by [`LoaderState::merge`] lists every rank's progress in `ranks`.
///
/// A state resumes on any world size and batch size (see
/// [`LoaderState::resume_as`]): on the same ones, each rank continues its
/// own sequence; on others, the rest of the job is re-planned so that every
/// sample of the epoch is delivered once over the whole run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderState {
    /// Layout version of this record; see [`STATE_FORMAT`].
    format: u32,
    /// The job spec as the coordinator planned it (its `consumers` is the
    /// world size), so a resumed loader needs no job flags and can re-create
    /// the job on a coordinator that never saw it.
    spec: String,
    /// The data-parallel rank whose batches these are.
    rank: u32,
    /// Number of ranks; the batches of a rank depend on it.
    world_size: u32,
    /// Every batch with a lower sequence number was yielded: the next batch
    /// to yield, in order.
    next_seq: u64,
    /// Batches above `next_seq` already yielded (out-of-order mode only), so
    /// that resumption does not yield them twice.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    yielded_above: BTreeSet<u64>,
    /// A merged state: every rank's progress, by rank (`rank` is then 0 and
    /// `next_seq` the slowest rank's). Empty for one rank's state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ranks: Vec<RankState>,
}

/// One rank's progress in a merged [`LoaderState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RankState {
    next_seq: u64,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    yielded_above: BTreeSet<u64>,
}

/// Where a resumed loader starts: its job and its first batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumption {
    /// The job to run: the saved one, or the rest of it re-planned for
    /// another world size or batch size.
    pub spec: JobSpec,
    /// The first batch to yield.
    pub next_seq: u64,
    /// Batches above `next_seq` already yielded.
    pub yielded_above: BTreeSet<u64>,
    /// True when the job was re-planned.
    pub replanned: bool,
}

impl Resumption {
    /// A re-planned job, which starts at its first batch.
    fn replanned(spec: JobSpec) -> Result<Self, LoaderError> {
        let next_seq = crate::spec::validate(&spec)?.first_seq();
        Ok(Self { spec, next_seq, yielded_above: BTreeSet::new(), replanned: true })
    }

    /// The state of rank `rank` of the resumed job before it yields
    /// anything: what a loader saves if asked right away, and what resumes
    /// it on its own world size from then on.
    pub fn into_state(self, rank: u32) -> LoaderState {
        LoaderState::new(&self.spec, rank, self.next_seq, self.yielded_above)
    }
}

impl LoaderState {
    /// The state of rank `rank` of the job `spec` (planned, so
    /// `spec.consumers` is the world size) that has yielded every batch below
    /// `next_seq`, and `yielded_above` beyond it.
    pub(crate) fn new(
        spec: &JobSpec,
        rank: u32,
        next_seq: u64,
        yielded_above: BTreeSet<u64>,
    ) -> Self {
        Self {
            format: STATE_FORMAT,
            spec: hex(&spec.encode_to_vec()),
            rank,
            world_size: spec.consumers,
            next_seq,
            yielded_above,
            ranks: Vec::new(),
        }
    }

    /// One state for the whole job from the states its ranks saved (each
    /// rank's, or merged ones), which may have been taken at different
    /// steps and list batches yielded out of order: what every rank
    /// consumed is then known, and a resume on another world size delivers
    /// exactly the rest. Every rank must be there, once.
    pub fn merge(states: &[LoaderState]) -> Result<LoaderState, LoaderError> {
        let first = states.first().ok_or_else(|| invalid("there is no state to merge"))?;
        let world = first.world_size;
        let mut ranks: Vec<Option<RankState>> = vec![None; world as usize];
        for state in states {
            if state.spec != first.spec || state.world_size != world {
                return Err(invalid(format!(
                    "the states to merge are of different jobs (rank {} of {} and rank {} of {}, or another spec)",
                    first.rank, world, state.rank, state.world_size
                )));
            }
            for (rank, progress) in state.by_rank() {
                let slot = ranks.get_mut(rank as usize).ok_or_else(|| {
                    invalid(format!("rank {rank} is outside world size {world}"))
                })?;
                if slot.replace(progress).is_some() {
                    return Err(invalid(format!("rank {rank} is given twice")));
                }
            }
        }
        let missing: Vec<String> = (0..world)
            .filter(|&r| ranks[r as usize].is_none())
            .map(|r| r.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(invalid(format!(
                "merging needs every rank's state: rank {} of {world} missing",
                missing.join(", ")
            )));
        }
        let ranks: Vec<RankState> = ranks.into_iter().flatten().collect();
        let slowest = ranks.iter().map(|r| r.next_seq).min().unwrap_or(0);
        Ok(Self {
            format: STATE_FORMAT,
            spec: first.spec.clone(),
            rank: 0,
            world_size: world,
            next_seq: slowest,
            yielded_above: BTreeSet::new(),
            ranks,
        })
    }

    /// The ranks whose progress this state knows, with it.
    fn by_rank(&self) -> Vec<(u32, RankState)> {
        if self.ranks.is_empty() {
            let own = RankState { next_seq: self.next_seq, yielded_above: self.yielded_above.clone() };
            vec![(self.rank, own)]
        } else {
            (0u32..).zip(self.ranks.iter().cloned()).collect()
        }
    }

    /// True for a state made by [`merge`](Self::merge).
    pub fn is_merged(&self) -> bool {
        !self.ranks.is_empty()
    }

    /// Every rank's progress: a merged state's, or, from one rank's state,
    /// every rank at its step (a synchronous job's ranks save at the same
    /// step; out-of-order extras are known for that rank only).
    pub fn progress(&self) -> Vec<Progress> {
        if self.ranks.is_empty() {
            elastic::lockstep(self.world_size, self.rank, self.next_seq, &self.yielded_above)
        } else {
            self.ranks
                .iter()
                .map(|r| Progress { next_seq: r.next_seq, yielded_above: r.yielded_above.clone() })
                .collect()
        }
    }

    /// Where rank `rank` of `world_size` ranks of `batch_size` samples
    /// (None: the saved job's) starts from this state. On the saved world
    /// size and batch size, the rank continues its own sequence: its
    /// progress in a merged state, this state's own rank's, or (another
    /// rank's state) the step this one is at. Otherwise the rest of the job
    /// is re-planned for the new ranks, and each starts at its first batch
    /// (mid-way through the epoch the saved run had reached, as its
    /// sequence numbers tell: see `loader_job::sampler`).
    pub fn resume_as(
        &self,
        rank: u32,
        world_size: u32,
        batch_size: Option<u32>,
    ) -> Result<Resumption, LoaderError> {
        let spec = self.spec()?;
        check_rank(rank, world_size)?;
        let batch_size = batch_size.unwrap_or(spec.batch_size);
        if world_size == self.world_size && batch_size == spec.batch_size {
            let own = self.by_rank().into_iter().find(|(r, _)| *r == rank).map(|(_, p)| p);
            let (next_seq, yielded_above) = match own {
                Some(p) => (p.next_seq, p.yielded_above),
                None => (self.next_seq, BTreeSet::new()),
            };
            return Ok(Resumption { spec, next_seq, yielded_above, replanned: false });
        }
        let spec = self.replanned(&spec, world_size, batch_size)?
            .map_err(|e| LoaderError::State(format!("cannot resume this state on {world_size} ranks of batch size {batch_size}: {e}")))?;
        Resumption::replanned(spec)
    }

    /// [`resume_as`](Self::resume_as) for a mixture under new `weights`
    /// (one per source, as in its spec): each source's walk continues
    /// where it stands, and the new proportions hold from the first global
    /// batch past everything this state delivered (see
    /// `loader_job::elastic::reweight`).
    pub fn resume_reweighted(
        &self,
        rank: u32,
        world_size: u32,
        batch_size: Option<u32>,
        weights: &[f64],
    ) -> Result<Resumption, LoaderError> {
        let spec = self.spec()?;
        check_rank(rank, world_size)?;
        let batch_size = batch_size.unwrap_or(spec.batch_size);
        let spec = self
            .replanned(&spec, world_size, batch_size)?
            .and_then(|replanned| elastic::reweight(&replanned, weights))
            .map_err(|e| LoaderError::State(format!("cannot resume this state under new weights: {e}")))?;
        Resumption::replanned(spec)
    }

    /// What is left of `spec` after this state, planned for `world_size`
    /// ranks of `batch_size` (the outer error: the spec itself is invalid).
    fn replanned(
        &self,
        spec: &JobSpec,
        world_size: u32,
        batch_size: u32,
    ) -> Result<Result<JobSpec, elastic::ResumeError>, LoaderError> {
        let plan = crate::spec::validate(spec)?;
        Ok(elastic::replan(spec, &plan, &self.progress(), world_size, batch_size))
    }

    /// This state as a *position* in the job `ours` (the configuration of
    /// the loader that loads it, as StatefulDataLoader and the frameworks
    /// treat a state): the saved job keeps its order and progress, and
    /// takes `ours`'s epoch bound. `ours`'s batch size, world size and
    /// mixture weights apply through [`resume_as`](Self::resume_as) /
    /// [`resume_reweighted`](Self::resume_reweighted). Refused, in one
    /// line, when `ours` reads another dataset (another kind or number of
    /// samples) or another seed: the saved position names nothing there.
    pub fn under(mut self, ours: &JobSpec) -> Result<Self, LoaderError> {
        let mut saved = self.spec()?;
        let (kind, theirs) = (dataset_kind(ours), dataset_kind(&saved));
        if kind != theirs {
            return Err(LoaderError::State(format!(
                "this state is of a {theirs} dataset, this loader reads a {kind} one; load it into a loader of the same dataset"
            )));
        }
        // A mixture's epoch length follows its weights, which may change
        // at a resume; its sources' sizes are checked by the re-weighting.
        if kind != "mix" {
            let (n, m) = (crate::spec::validate(ours)?.num_samples, crate::spec::validate(&saved)?.num_samples);
            if n != m {
                return Err(LoaderError::State(format!(
                    "this state is of a dataset of {m} samples, this loader reads {n}; load it into a loader of the same dataset"
                )));
            }
        }
        let seed = |s: &JobSpec| s.sampler.as_ref().map_or(0, |x| x.seed);
        if seed(ours) != seed(&saved) {
            return Err(LoaderError::State(format!(
                "this state was saved with seed {}, this loader has seed {}; give the loader the saved seed",
                seed(&saved),
                seed(ours)
            )));
        }
        if saved.epochs != ours.epochs {
            saved.epochs = ours.epochs;
            self.spec = hex(&saved.encode_to_vec());
        }
        Ok(self)
    }

    /// The job spec, decoded.
    pub fn spec(&self) -> Result<JobSpec, LoaderError> {
        let bytes =
            unhex(&self.spec).ok_or_else(|| invalid("its spec is not hex-encoded protobuf"))?;
        JobSpec::decode(bytes.as_slice())
            .map_err(|e| invalid(format!("its spec does not decode: {e}")))
    }

    /// The rank whose batches these are.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks of the job.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Sequence number of the next batch to yield; every batch below it was
    /// yielded. In order, also the number of batches yielded.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Batches yielded beyond [`next_seq`](Self::next_seq) (out of order only).
    pub fn yielded_above(&self) -> &BTreeSet<u64> {
        &self.yielded_above
    }

    /// Batches yielded in all.
    pub fn yielded(&self) -> u64 {
        self.next_seq + self.yielded_above.len() as u64
    }

    /// One line of JSON.
    pub fn to_json(&self) -> String {
        // A struct of integers, a string and a set of integers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses and checks a state written by [`to_json`](Self::to_json) (or
    /// any serde JSON writer).
    pub fn from_json(json: &str) -> Result<Self, LoaderError> {
        // Read the format first, so a newer record is refused for what it
        // is rather than for a field this SDK does not know.
        #[derive(Deserialize)]
        struct Format {
            format: Option<u32>,
        }
        let format = serde_json::from_str::<Format>(json)
            .map_err(|e| invalid(format!("not a loader state: {e}")))?
            .format
            .ok_or_else(|| invalid("not a loader state: it has no format"))?;
        if format == 1 {
            return Err(invalid(
                "format 1 was written by an older Loader whose shuffled order differs from this one's; \
                 resume it with the Loader that saved it",
            ));
        }
        if format != STATE_FORMAT {
            return Err(invalid(format!(
                "format {format} is not supported (this SDK reads format {STATE_FORMAT})"
            )));
        }
        let state: Self =
            serde_json::from_str(json).map_err(|e| invalid(format!("not a loader state: {e}")))?;
        state.check()?;
        Ok(state)
    }

    /// Reads a state file written by [`save`](Self::save).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LoaderError> {
        let path = path.as_ref();
        let in_file = |e: LoaderError| match e {
            LoaderError::State(m) => LoaderError::State(m.replacen(
                "invalid loader state: ",
                &format!("invalid loader state in {}: ", path.display()),
                1,
            )),
            other => other,
        };
        let json = std::fs::read_to_string(path).map_err(|e| {
            LoaderError::State(format!("cannot read loader state {}: {e}", path.display()))
        })?;
        Self::from_json(&json).map_err(in_file)
    }

    /// Writes the state to `path` atomically: a temporary file in the same
    /// directory, flushed, then renamed over `path`, so a reader (or a
    /// crash) never sees half a state.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), LoaderError> {
        let path = path.as_ref();
        let failed = |e: std::io::Error| {
            LoaderError::State(format!("cannot write loader state {}: {e}", path.display()))
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(".loader-state-")
            .tempfile_in(dir)
            .map_err(failed)?;
        tmp.write_all(self.to_json().as_bytes()).map_err(failed)?;
        tmp.write_all(b"\n").map_err(failed)?;
        tmp.as_file().sync_all().map_err(failed)?;
        tmp.persist(path).map_err(|e| failed(e.error))?;
        Ok(())
    }

    /// What deserialization alone cannot tell: the fields agree.
    fn check(&self) -> Result<(), LoaderError> {
        let spec = self.spec()?;
        if spec.consumers != self.world_size {
            return Err(invalid(format!(
                "its world size {} differs from its spec's {} consumers",
                self.world_size, spec.consumers
            )));
        }
        if self.rank >= self.world_size {
            return Err(invalid(format!(
                "its rank {} is outside its world size {}",
                self.rank, self.world_size
            )));
        }
        if self.yielded_above.iter().any(|&s| s <= self.next_seq) {
            return Err(invalid(
                "its yielded_above lists batches at or below next_seq",
            ));
        }
        if !self.ranks.is_empty() {
            if self.ranks.len() != self.world_size as usize {
                return Err(invalid(format!(
                    "it lists {} ranks' progress for world size {}",
                    self.ranks.len(),
                    self.world_size
                )));
            }
            if self.rank != 0 {
                return Err(invalid(format!(
                    "a merged state says rank 0, but it says rank {}",
                    self.rank
                )));
            }
            if self.ranks.iter().any(|r| r.yielded_above.iter().any(|&s| s <= r.next_seq)) {
                return Err(invalid(
                    "a rank's yielded_above lists batches at or below its next_seq",
                ));
            }
        }
        Ok(())
    }
}

/// A state that cannot be used, saying why.
/// The name of `spec`'s dataset kind, for messages.
fn dataset_kind(spec: &JobSpec) -> &'static str {
    use loader_proto::pb::dataset_spec::Kind;
    match spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::Synthetic(_)) => "synthetic",
        Some(Kind::Tokens(_)) => "tokens",
        Some(Kind::ImageFolder(_)) => "image_folder",
        Some(Kind::Webdataset(_)) => "webdataset",
        Some(Kind::Npy(_)) => "npy",
        Some(Kind::Custom(_)) => "python",
        Some(Kind::Mix(_)) => "mix",
        Some(Kind::Parquet(_)) => "parquet",
        None => "missing",
    }
}

fn invalid(why: impl Into<String>) -> LoaderError {
    LoaderError::State(format!("invalid loader state: {}", why.into()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Refuses a rank outside its world size, in one line.
fn check_rank(rank: u32, world_size: u32) -> Result<(), LoaderError> {
    if rank >= world_size {
        return Err(LoaderError::InvalidArgument(format!("rank {rank} is outside world size {world_size}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;

    fn spec(consumers: u32) -> JobSpec {
        let mut spec = crate::spec::synthetic(1000, &[3, 4], Dtype::F32)
            .batch_size(16)
            .epochs(2)
            .shuffle(9)
            .name("resume-me")
            .build()
            .expect("spec");
        spec.consumers = consumers;
        spec
    }

    #[test]
    fn json_round_trip_keeps_everything() {
        for above in [BTreeSet::new(), BTreeSet::from([9, 12])] {
            let state = LoaderState::new(&spec(4), 3, 7, above);
            let json = state.to_json();
            assert!(!json.contains('\n'));
            let back = LoaderState::from_json(&json).expect("parses");
            assert_eq!(back, state);
            assert_eq!(back.spec().expect("spec"), spec(4));
            assert_eq!((back.rank(), back.world_size(), back.next_seq()), (3, 4, 7));
        }
    }

    #[test]
    fn under_another_configuration_keeps_the_position_and_takes_its_epoch_bound() {
        let state = LoaderState::new(&spec(1), 0, 70, BTreeSet::new());
        let mut ours = spec(1);
        ours.epochs = 1 << 20;
        ours.batch_size = 8;
        let under = state.clone().under(&ours).expect("same dataset and seed");
        assert_eq!(under.spec().expect("spec").epochs, 1 << 20);
        assert_eq!((under.next_seq(), under.spec().expect("spec").batch_size), (70, 16), "the position and the saved plan");
        let mut other_seed = spec(1);
        other_seed.sampler.as_mut().expect("sampler").seed = 3;
        let e = state.clone().under(&other_seed).expect_err("another seed");
        assert_eq!(e.to_string().lines().count(), 1);
        assert!(e.to_string().contains("saved with seed 9, this loader has seed 3"), "{e}");
        let other_data = crate::spec::synthetic(999, &[3, 4], Dtype::F32).batch_size(16).shuffle(9).build().expect("spec");
        let e = state.under(&other_data).expect_err("another dataset");
        assert!(e.to_string().contains("of 1000 samples, this loader reads 999"), "{e}");
    }

    #[test]
    fn save_is_atomic_and_load_reads_it_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let state = LoaderState::new(&spec(1), 0, 42, BTreeSet::new());
        state.save(&path).expect("save");
        state.save(&path).expect("overwrite");
        assert_eq!(LoaderState::load(&path).expect("load"), state);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("state.json")],
            "no temp files left"
        );
    }

    #[test]
    fn bad_states_are_one_line_errors() {
        let good = LoaderState::new(&spec(2), 1, 5, BTreeSet::new());
        let good_json: serde_json::Value = serde_json::from_str(&good.to_json()).expect("json");
        let with = |key: &str, value: serde_json::Value| {
            let mut v = good_json.clone();
            v[key] = value;
            v.to_string()
        };
        let cases = [
            ("{not json".to_owned(), "not a loader state"),
            ("{}".to_owned(), "has no format"),
            (with("format", 99.into()), "format 99 is not supported"),
            (with("format", 1.into()), "resume it with the Loader that saved it"),
            (with("spec", "zz".into()), "not hex-encoded"),
            (with("spec", "ff".into()), "does not decode"),
            (with("rank", 2.into()), "outside its world size"),
            (with("world_size", 3.into()), "differs from its spec"),
            (with("surprise", 1.into()), "unknown field"),
            (with("ranks", serde_json::json!([{"next_seq": 1}])), "lists 1 ranks' progress for world size 2"),
            (
                with("ranks", serde_json::json!([{"next_seq": 1}, {"next_seq": 2}])),
                "a merged state says rank 0, but it says rank 1",
            ),
            (
                {
                    let mut v = good_json.clone();
                    v["rank"] = 0.into();
                    v["ranks"] = serde_json::json!([{"next_seq": 1}, {"next_seq": 2, "yielded_above": [2]}]);
                    v.to_string()
                },
                "a rank's yielded_above lists batches at or below its next_seq",
            ),
            (with("next_seq", "five".into()), "not a loader state"),
        ];
        for (json, needle) in cases {
            let e = LoaderState::from_json(&json).expect_err(&json).to_string();
            assert!(e.starts_with("invalid loader state"), "{e}");
            assert!(e.contains(needle), "{json}: {e:?} lacks {needle:?}");
            assert!(!e.contains('\n'), "{e}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("corrupt.json");
        std::fs::write(&path, "\0\0garbage").expect("write");
        let e = LoaderState::load(&path).expect_err("corrupt").to_string();
        assert!(e.contains("corrupt.json: not a loader state"), "{e}");
        assert!(e.starts_with("invalid loader state in "), "{e}");
        let e = LoaderState::load(dir.path().join("missing.json"))
            .expect_err("missing")
            .to_string();
        assert!(e.starts_with("cannot read loader state "), "{e}");
    }
}
