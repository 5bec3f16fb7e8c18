//! Which dataset a job's spec names: the built-in kinds, plus the `custom`
//! datasets a worker binary registers, so a user can serve data of their
//! own through the same coordinator, sampler, collate and transports.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

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
}

impl fmt::Debug for Datasets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.custom.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("Datasets").field("custom", &names).finish()
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
                let frames = kept_frames(folder.len(), spec)?;
                Arc::new(folder.keep_frames(frames))
            }
            Some(Kind::Webdataset(w)) => {
                let shards = WebDataset::open(w, &spec.transforms)?;
                let frames = kept_frames(shards.len(), spec)?;
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

/// The frames cache this worker's trainer gave it for an image job of
/// `samples` images (`Loader.local(spec, cache=...)`), if it gave one.
fn kept_frames(samples: u64, spec: &JobSpec) -> Result<Option<FrameCache>, DatasetError> {
    FrameCache::inherited(samples, spec.epochs).map_err(DatasetError::Spec)
}

/// Opens a job's dataset with the built-in kinds only.
pub fn open(spec: &JobSpec) -> Result<Arc<dyn Dataset>, DatasetError> {
    Datasets::new().open(spec)
}
