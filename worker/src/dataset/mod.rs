//! Datasets: where sample bytes come from.
//!
//! A [`Dataset`] describes the tensors of one sample and writes a sample
//! straight into its rows of the batch buffer, so collate never copies
//! through a per-sample buffer. [`Datasets`] turns a job's spec into the
//! dataset it names: a built-in one, or one a custom worker binary
//! registered for `custom` jobs (see `examples/custom-worker`).
//!
//! Built in: [`Synthetic`], [`Tokens`], [`Npy`], the image datasets
//! [`ImageFolder`] and [`WebDataset`], whose samples run through the job's
//! image pipeline, and [`Mix`], a weighted mixture of any of them. Which files they read, and in which order, comes from
//! `loader_listing`, the same code the submitter used to count them. The
//! bytes of a file come through `data_file`: a guarded mapping of a local
//! file, or chunks of an object in a store (`s3://`), read alike.

mod data_file;
mod frame_cache;
mod image_folder;
mod images;
mod made;
mod mix;
mod npy;
mod parquet;
mod prefetch;
mod registry;
mod rows;
pub(crate) mod synthetic;
mod tokens;
mod transformed;
mod webdataset;

use loader_proto::pb::{CorruptPolicy, Dtype};

pub use frame_cache::{CachePayoff, DECIDE_AFTER as CACHE_DECIDE_AFTER, FRAMES_PER_SAMPLE, FrameCache, cache_entries as frame_cache_entries};
pub use image_folder::ImageFolder;
pub use mix::Mix;
pub use npy::Npy;
pub use parquet::Parquet;
pub use registry::{Datasets, OpenCustom, open};
pub use made::{MadeBatch, MadeTensor};
pub use rows::{BatchRows, Skipped};
pub use synthetic::Synthetic;
pub use tokens::Tokens;
pub use transformed::{Transform, Transformed};
pub use webdataset::WebDataset;

/// What identifies one draw of a sample: random augmentations are derived
/// from it alone, so the same sample in the same epoch of the same job gets
/// the same pixels on any worker, with any worker count, in any run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// The job's sampler seed.
    pub seed: u64,
    /// Epoch the sample is drawn in.
    pub epoch: u64,
    /// Dataset index of the sample.
    pub index: u64,
}

/// One tensor of a sample: the batch holds it with a leading batch dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleTensor {
    /// Name the trainer looks the tensor up by.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape of one sample's tensor (without the batch dimension).
    pub shape: Vec<u64>,
}

/// A source of samples addressed by index.
///
/// Implementations are shared between threads and must be cheap to call per
/// sample; open files or mappings once, in the constructor.
pub trait Dataset: Send + Sync + std::fmt::Debug {
    /// The tensors of every sample, in the order `read_into` fills them.
    fn tensors(&self) -> &[SampleTensor];

    /// Number of samples; valid indices are `0..len()`.
    fn len(&self) -> u64;

    /// True when the dataset holds no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes sample `key.index` into `rows`: one row per tensor of
    /// [`tensors`](Dataset::tensors), each exactly that tensor's sample size
    /// in bytes, zeroed on entry. Random augmentations derive from `key`
    /// alone (never from a thread's state), so a sample gets the same bytes
    /// on any worker, with any worker count, in any run.
    ///
    /// A sample whose file cannot be read or decoded is reported as
    /// [`DatasetError::Corrupt`]: the job's policy then fails the job or
    /// leaves the sample out of its batch. Any other error fails the job.
    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError>;

    /// Hints that sample `key` is read soon: a dataset over memory it can
    /// address (a mapped file) asks the CPU to start loading it, so the
    /// next sample's memory latency overlaps this one's copy. The default
    /// does nothing.
    fn prefetch(&self, key: SampleKey) {
        let _ = key;
    }

    /// True when the dataset's reads wait on a network (objects in a
    /// store): the producer then tells it, with
    /// [`prefetch_batch`](Dataset::prefetch_batch), of the batches it makes
    /// next, so that their fetches overlap the batches made meanwhile.
    fn fetches_ahead(&self) -> bool {
        false
    }

    /// Hints that the samples `keys` (a batch made soon, after the one at
    /// hand) are read soon: a dataset that [`fetches_ahead`]
    /// (Dataset::fetches_ahead) starts fetching their bytes and returns at
    /// once. The default does nothing.
    fn prefetch_batch(&self, keys: &[SampleKey]) {
        let _ = keys;
    }

    /// True when `read_into` writes every byte of every row. A reused
    /// buffer (a shared-memory slot) is then not zeroed first, which saves a
    /// pass over the whole batch.
    fn writes_whole_rows(&self) -> bool {
        false
    }

    /// Reads the samples `keys` of one batch, in order, settling each in
    /// `batch` (kept, left out under `skip`, or the error that fails the
    /// batch). The default calls [`read_into`](Dataset::read_into) once per
    /// sample; a dataset that pays a fixed cost per call (a Python
    /// dataset: the interpreter's call and the GIL) reads them in one go.
    fn read_batch(&self, keys: &[SampleKey], batch: &mut BatchRows<'_>) -> Result<(), DatasetError> {
        read_each(self, keys, batch)
    }

    /// True when the dataset makes each batch whole with
    /// [`make_batch`](Dataset::make_batch) (its tensors and shapes known
    /// only then) instead of writing rows of [`tensors`](Dataset::tensors).
    fn makes_whole_batches(&self) -> bool {
        false
    }

    /// Makes the batch of samples `keys` whole: reads them, applies
    /// `on_corrupt` to those that cannot be read, and builds the batch's
    /// tensors from the others. Only called when
    /// [`makes_whole_batches`](Dataset::makes_whole_batches) says so.
    fn make_batch(&self, keys: &[SampleKey], on_corrupt: CorruptPolicy) -> Result<MadeBatch, DatasetError> {
        let _ = (keys, on_corrupt);
        Err(DatasetError::Spec("this dataset does not make whole batches".into()))
    }
}

/// Reads `keys` one after the other into `batch`'s rows: what
/// [`Dataset::read_batch`] does unless a dataset does more (asks for the
/// batch's bytes at once first).
pub(crate) fn read_each<D: Dataset + ?Sized>(dataset: &D, keys: &[SampleKey], batch: &mut BatchRows<'_>) -> Result<(), DatasetError> {
    for &key in keys {
        let read = dataset.read_into(key, &mut batch.next_rows());
        batch.settle(key.index, read)?;
    }
    // The batch's reads out of objects' chunks, counted in this thread.
    loader_storage::flush_reads();
    Ok(())
}

/// Why a dataset could not be opened or a sample read. Messages are one line
/// and name the file or index at fault.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The dataset's file could not be opened or mapped.
    #[error("{kind} dataset: cannot open {path}: {source}")]
    Open {
        /// Dataset kind ("tokens", ...).
        kind: &'static str,
        /// The file as the spec names it.
        path: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The file does not match what the spec says about it.
    #[error("{kind} dataset {path}: {problem}")]
    Mismatch {
        /// Dataset kind.
        kind: &'static str,
        /// The file as the spec names it.
        path: String,
        /// What disagrees, with both values.
        problem: String,
    },
    /// The spec cannot describe a dataset (missing kind, impossible shape).
    #[error("{0}")]
    Spec(String),
    /// A sample index past the end of the dataset.
    #[error("sample index {index} is out of range for a dataset of {len} samples")]
    IndexOutOfRange {
        /// The index asked for.
        index: u64,
        /// Samples in the dataset.
        len: u64,
    },
    /// `read_into` was handed rows that do not fit the dataset's tensors.
    #[error("sample {index}: rows do not match the dataset's tensors")]
    RowMismatch {
        /// The sample being read.
        index: u64,
    },
    /// An object in a store cannot be read (missing, access denied, the
    /// store down after every retry). An object that changed since the job
    /// opened it is `Corrupt` instead, like a local file that changed.
    #[error("{kind} dataset: {source}")]
    Storage {
        /// Dataset kind.
        kind: &'static str,
        /// What the store said, naming the object.
        source: loader_storage::StorageError,
    },
    /// One sample cannot be read or decoded; the job's corrupt-sample
    /// policy decides whether that fails the job or skips the sample.
    #[error("corrupt sample {path}: {reason}")]
    Corrupt {
        /// The file (or `shard.tar:key` member) at fault.
        path: String,
        /// Why it cannot be used.
        reason: String,
    },
}

impl DatasetError {
    /// A read of `path`'s mapping that found the file changed under it
    /// (`crate::mapped`): the job's corrupt-sample error, naming the file
    /// and where it stopped being readable.
    pub(crate) fn changed(path: &str, changed: crate::mapped::Changed) -> Self {
        DatasetError::Corrupt {
            path: format!("{path} (byte {})", changed.offset),
            reason: "the file changed while the job read it (truncated or replaced): its samples cannot be trusted; \
                     write a new file and start a new job"
                .to_owned(),
        }
    }

    /// A file whose size at a worker's open is not the size the job was
    /// planned for: the trainer measured it when it made the spec, so the
    /// file changed since, or this host holds another copy.
    pub(crate) fn resized(kind: &'static str, path: &str, holds: String) -> Self {
        DatasetError::Mismatch {
            kind,
            path: path.to_owned(),
            problem: format!(
                "{holds}: the file changed since the job was planned, or this host's copy differs; \
                 start a new job on the file as it is now"
            ),
        }
    }

    /// A failed read of an object of a `kind` dataset: an object that
    /// changed since the open is a corrupt sample (the job's policy
    /// decides), anything else the store's error.
    pub(crate) fn storage(kind: &'static str, e: loader_storage::StorageError) -> Self {
        match e.kind {
            loader_storage::ErrorKind::Changed => DatasetError::Corrupt { path: e.url, reason: e.problem },
            _ => DatasetError::Storage { kind, source: e },
        }
    }

    /// A listing failure of a `kind` dataset, naming the file.
    pub(crate) fn listing(kind: &'static str, e: loader_listing::ListingError) -> Self {
        DatasetError::Mismatch { kind, path: e.path, problem: e.problem }
    }
}

/// Bytes of one sample's tensor, or None when the shape overflows.
pub(crate) fn sample_bytes(t: &SampleTensor) -> Option<usize> {
    loader_proto::batch::tensor_bytes(t.dtype, &t.shape).and_then(|n| usize::try_from(n).ok())
}

/// Checks `rows` against the sample sizes a dataset declares, so a
/// dataset never indexes past a row it was handed.
pub(crate) fn check_rows(index: u64, rows: &[&mut [u8]], sizes: &[usize]) -> Result<(), DatasetError> {
    if rows.len() != sizes.len() || rows.iter().zip(sizes).any(|(r, &n)| r.len() != n) {
        return Err(DatasetError::RowMismatch { index });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
