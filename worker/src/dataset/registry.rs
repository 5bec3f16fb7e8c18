//! Which dataset a job's spec names: the built-in kinds, plus the `custom`
//! datasets a worker binary registers, so a user can serve data of their
//! own through the same coordinator, sampler, collate and transports.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use loader_proto::pb::{CustomSpec, JobSpec, dataset_spec::Kind};

use super::{Dataset, DatasetError, FrameCache, ImageFolder, Mix, Npy, Parquet, Synthetic, Tokens, WebDataset};

/// Opens a custom dataset from its spec (its `params` say what to read).
pub type OpenCustom = dyn Fn(&CustomSpec) -> Result<Arc<dyn Dataset>, DatasetError> + Send + Sync;

/// The datasets a worker can open: every built-in kind and the custom ones
/// registered with [`register`](Datasets::register).
#[derive(Clone, Default)]
pub struct Datasets {
    /// Custom datasets by the name a `custom` spec gives.
    custom: HashMap<String, Arc<OpenCustom>>,
    /// Frames this worker keeps itself, when its trainer gave it no cache.
    own_frames: Option<OwnFrames>,
}

/// The kept frames of a worker started with `--cache SIZE` (a standalone
/// or remote worker, which inherits no cache from a trainer): one image
/// job at a time keeps its frames in a cache of SIZE this worker makes,
/// so the worker's memory stays within SIZE whatever it serves. The slot
/// frees when that job's dataset closes (its job ended long ago, or more
/// recent jobs pushed it out of the worker's open datasets).
#[derive(Debug, Clone)]
struct OwnFrames {
    capacity: u64,
    dir: Option<PathBuf>,
    /// Share each job's cache with the other workers of this node started
    /// with the same `dir` (`--cache-shared`: a file in `dir` named after
    /// the job's spec, `sample_cache::on_node`).
    on_node: bool,
    /// The slot the cache of the job that keeps frames holds.
    slot: Arc<Mutex<Weak<()>>>,
}

impl fmt::Debug for Datasets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.custom.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("Datasets").field("custom", &names).field("own_frames", &self.own_frames).finish()
    }
}

impl Datasets {
    /// The built-in datasets only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves jobs whose dataset is `custom { name, .. }` with `open`.
    pub fn register(
        mut self,
        name: impl Into<String>,
        open: impl Fn(&CustomSpec) -> Result<Arc<dyn Dataset>, DatasetError> + Send + Sync + 'static,
    ) -> Self {
        self.custom.insert(name.into(), Arc::new(open));
        self
    }

    /// Keeps the frames of built-in image jobs in a cache of `capacity`
    /// bytes this worker makes (in memory, or an unnamed file in `dir`)
    /// when its trainer gave it none: `loader-worker --cache`.
    pub fn keep_frames(mut self, capacity: u64, dir: Option<PathBuf>) -> Self {
        self.own_frames = Some(OwnFrames { capacity, dir, on_node: false, slot: Arc::default() });
        self
    }

    /// As [`keep_frames`](Self::keep_frames), with each job's cache a file
    /// in `dir` that the other workers of this node started so share:
    /// `loader-worker --cache SIZE --cache-dir DIR --cache-shared`. The
    /// first of them to need it makes it, of `capacity` bytes.
    pub fn keep_frames_on_node(mut self, capacity: u64, dir: PathBuf) -> Self {
        self.own_frames = Some(OwnFrames { capacity, dir: Some(dir), on_node: true, slot: Arc::default() });
        self
    }

    /// Opens the dataset of a job: files are opened or mapped once here,
    /// and the result is checked against what the submitter saw.
    pub fn open(&self, spec: &JobSpec) -> Result<Arc<dyn Dataset>, DatasetError> {
        let kind = spec.dataset.as_ref().and_then(|d| d.kind.as_ref());
        Ok(match kind {
            None => return Err(DatasetError::Spec("dataset: missing".into())),
            Some(Kind::Synthetic(s)) => Arc::new(Synthetic::new(s)?),
            Some(Kind::Tokens(t)) => Arc::new(Tokens::open(t)?),
            Some(Kind::Npy(n)) => Arc::new(Npy::open(n)?),
            Some(Kind::Parquet(p)) => Arc::new(Parquet::open(p, &spec.transforms)?),
            Some(Kind::ImageFolder(f)) => {
                let folder = ImageFolder::open(f, &spec.transforms)?;
                let frames = self.kept_frames(folder.len(), spec)?;
                Arc::new(folder.keep_frames(frames))
            }
            Some(Kind::Webdataset(w)) => {
                let shards = WebDataset::open(w, &spec.transforms)?;
                let frames = self.kept_frames(shards.len(), spec)?;
                Arc::new(shards.keep_frames(frames))
            }
            Some(Kind::Custom(c)) => {
                let Some(open) = self.custom.get(&c.name) else {
                    return Err(DatasetError::Spec(format!(
                        "dataset.custom.name: this worker has no dataset `{}`; run a worker binary that registers it",
                        c.name
                    )));
                };
                open(c)?
            }
            Some(Kind::Mix(m)) => Arc::new(Mix::open(self, spec, m)?),
        })
    }
}

impl Datasets {
    /// The frames cache of an image job of `samples` images: the one this
    /// worker's trainer gave it (`Loader.local(spec, cache=...)`,
    /// `loaderctl run --cache`), else one of its own (`--cache`) when no
    /// other job keeps frames in it now, else none.
    fn kept_frames(&self, samples: u64, spec: &JobSpec) -> Result<Option<FrameCache>, DatasetError> {
        if let Some(inherited) = FrameCache::inherited(samples, spec.epochs).map_err(DatasetError::Spec)? {
            return Ok(Some(inherited));
        }
        let Some(own) = &self.own_frames else { return Ok(None) };
        let mut slot = own.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.strong_count() > 0 {
            tracing::info!(job = %spec.name, "sample cache: another image job keeps its frames in this worker's --cache; this one keeps none");
            return Ok(None);
        }
        let held = Arc::new(());
        let made = match (&own.dir, own.on_node) {
            (Some(dir), true) => {
                FrameCache::on_node(samples, spec.epochs, own.capacity, dir, &node_name(spec), Arc::clone(&held))
            }
            _ => FrameCache::own(samples, spec.epochs, own.capacity, own.dir.as_deref(), Arc::clone(&held)),
        };
        match made {
            Ok(frames) => {
                *slot = Arc::downgrade(&held);
                Ok(Some(frames))
            }
            // The job runs without: a cache only saves work.
            Err(e) => {
                tracing::warn!(job = %spec.name, "sample cache: cannot make one ({e}); the job decodes every epoch");
                Ok(None)
            }
        }
    }
}

/// The name of a job's cache among the files of a node's workers: a hash
/// of this build and of the job's whole spec (which names the files its
/// frames come from), so workers of one build serving one job agree on it,
/// and nothing else does.
fn node_name(spec: &JobSpec) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    env!("CARGO_PKG_VERSION").hash(&mut hasher);
    prost::Message::encode_to_vec(spec).hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Opens a job's dataset with the built-in kinds only.
pub fn open(spec: &JobSpec) -> Result<Arc<dyn Dataset>, DatasetError> {
    Datasets::new().open(spec)
}
