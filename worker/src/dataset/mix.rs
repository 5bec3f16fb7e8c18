//! `mix`: a weighted mixture of datasets (docs/mixtures.md). Position `p`
//! of the mixture's stream (`epoch x samples_per_epoch + index`) reads the
//! sample [`MixPlan::at`] names: a pure function of the job's seed and
//! `p`, so every worker, on any worker count, writes the same batch.
//!
//! Each source opens as the dataset it is (built-in or custom, a Python
//! dataset included) and reads its samples with its own pass number as
//! the epoch, so random transforms differ pass to pass as they do epoch to
//! epoch. Every source's samples must collate together: the same number of
//! tensors, each of the same dtype and shape (names are the first
//! source's); a mismatch fails the job at open, in one line naming the two
//! sources and the tensor.

use std::sync::Arc;

use loader_job::mixture::{Draw, Drawer, MixPlan};
use loader_proto::pb::{DatasetSpec, Dtype, JobSpec, MixSpec};
use loader_job::sampler::mix_seed;
use metrics::Counter;
use smallvec::SmallVec;

use super::{BatchRows, Dataset, DatasetError, Datasets, SampleKey, SampleTensor};

/// An open mixture.
#[derive(Debug)]
pub struct Mix {
    plan: MixPlan,
    sources: Vec<Arc<dyn Dataset>>,
    /// Source names, for messages.
    names: Vec<String>,
    /// The first source's tensors, then the source index when asked for.
    tensors: Vec<SampleTensor>,
    /// Tensors the sources write (without the source index).
    source_tensors: usize,
    /// Positions per epoch.
    len: u64,
    /// Samples read per source (`loader_worker_mix_samples_total{source}`).
    drawn: Vec<Counter>,
}

impl Mix {
    /// Opens every source of the mixture `m` of `spec` with `datasets`.
    pub fn open(datasets: &Datasets, spec: &JobSpec, m: &MixSpec) -> Result<Self, DatasetError> {
        let plan = loader_job::spec::mix_plan(spec)
            .map_err(|e| DatasetError::Spec(format!("{}: {}", e.field, e.problem)))?
            .ok_or_else(|| DatasetError::Spec("dataset.mix: missing".into()))?;
        let mut sources: Vec<Arc<dyn Dataset>> = Vec::with_capacity(m.sources.len());
        for source in &m.sources {
            let own = JobSpec {
                dataset: source.dataset.clone().map(|d| DatasetSpec { kind: d.kind }),
                ..spec.clone()
            };
            let dataset = datasets.open(&own).map_err(|e| {
                DatasetError::Spec(format!("dataset.mix source `{}`: {e}", source.name))
            })?;
            if dataset.makes_whole_batches() {
                return Err(DatasetError::Spec(format!(
                    "dataset.mix source `{}` makes whole batches with a collate_fn; a mixture collates samples itself",
                    source.name
                )));
            }
            sources.push(dataset);
        }
        let names: Vec<String> = m.sources.iter().map(|s| s.name.clone()).collect();
        let Some(first) = sources.first() else {
            return Err(DatasetError::Spec("dataset.mix.sources: must list at least one source".into()));
        };
        let mut tensors = first.tensors().to_vec();
        for (k, source) in sources.iter().enumerate().skip(1) {
            collates(&names[0], &tensors, &names[k], source.tensors())?;
        }
        let source_tensors = tensors.len();
        if !m.source_field.is_empty() {
            if tensors.iter().any(|t| t.name == m.source_field) {
                return Err(DatasetError::Spec(format!(
                    "dataset.mix.source_field: `{}` is already a tensor of the sources' samples",
                    m.source_field
                )));
            }
            tensors.push(SampleTensor {
                name: m.source_field.clone(),
                dtype: Dtype::I64,
                shape: Vec::new(),
            });
        }
        let drawn = names
            .iter()
            .map(|name| metrics::counter!("loader_worker_mix_samples_total", "source" => name.clone()))
            .collect();
        Ok(Self {
            plan,
            sources,
            names,
            tensors,
            source_tensors,
            len: m.samples_per_epoch,
            drawn,
        })
    }

    /// The position of the mixture's sample `key` in its stream.
    fn position(&self, key: SampleKey) -> Result<u64, DatasetError> {
        if key.index >= self.len {
            return Err(DatasetError::IndexOutOfRange {
                index: key.index,
                len: self.len,
            });
        }
        key.epoch
            .checked_mul(self.len)
            .and_then(|p| p.checked_add(key.index))
            .ok_or_else(|| {
                DatasetError::Spec(format!(
                    "dataset.mix: epoch {} is past the stream's end",
                    key.epoch
                ))
            })
    }

    /// Reads sample `own` of source `k` into `rows` (the mixture's sample
    /// `index`): the source's tensors, then the source index when asked for.
    fn read(&self, index: u64, k: usize, own: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        if rows.len() != self.tensors.len() {
            return Err(DatasetError::RowMismatch { index });
        }
        let (theirs, field) = rows.split_at_mut(self.source_tensors);
        if let Some(row) = field.first_mut() {
            if row.len() != 8 {
                return Err(DatasetError::RowMismatch { index });
            }
            row.copy_from_slice(&(k as i64).to_le_bytes());
        }
        self.sources[k].read_into(own, theirs).map_err(|e| match e {
            DatasetError::Corrupt { path, reason } => DatasetError::Corrupt {
                path: format!("{} (source `{}`)", path, self.names[k]),
                reason,
            },
            other => other,
        })
    }
}

/// The seed source `k`'s samples are read with under the job seed `seed`:
/// each source's random transforms are seeded apart from the others'.
fn source_seed(seed: u64, k: usize) -> u64 {
    mix_seed(seed, k as u64 + 1)
}

/// The key a source reads for the mixture's sample drawn as `d`, with the
/// source's seed `seed`: its pass is the source's own epoch.
fn own_key(d: &Draw, seed: u64) -> SampleKey {
    SampleKey { seed, epoch: d.pass, index: d.index }
}

/// Checks that `b`'s samples collate with `a`'s: one line naming both
/// sources and the first tensor that differs.
fn collates(
    a: &str,
    at: &[SampleTensor],
    b: &str,
    bt: &[SampleTensor],
) -> Result<(), DatasetError> {
    if at.len() != bt.len() {
        return Err(DatasetError::Spec(format!(
            "dataset.mix: sources `{a}` and `{b}` do not collate: {} tensors per sample in `{a}`, {} in `{b}`",
            at.len(),
            bt.len()
        )));
    }
    for (x, y) in at.iter().zip(bt) {
        if x.dtype != y.dtype || x.shape != y.shape {
            return Err(DatasetError::Spec(format!(
                "dataset.mix: sources `{a}` and `{b}` do not collate: tensor `{}` is {} {:?} in `{a}` and `{}` is {} {:?} in `{b}`",
                x.name,
                x.dtype.short_name(),
                x.shape,
                y.name,
                y.dtype.short_name(),
                y.shape
            )));
        }
    }
    Ok(())
}

impl Mix {
    /// The source and own key of each of `keys`, in order, up to the first
    /// that cannot be drawn (returned with its error).
    #[allow(clippy::type_complexity)]
    fn draw(&self, keys: &[SampleKey]) -> (SmallVec<[(usize, SampleKey); 64]>, Option<(u64, DatasetError)>) {
        // A batch's positions share one block and each source's pass, and
        // its keys one job seed: set them up once.
        let mut drawer = Drawer::new(&self.plan);
        let job_seed = keys.first().map_or(0, |key| key.seed);
        let seeds: SmallVec<[u64; 8]> = (0..self.sources.len()).map(|k| source_seed(job_seed, k)).collect();
        let mut draws: SmallVec<[(usize, SampleKey); 64]> = SmallVec::with_capacity(keys.len());
        for key in keys {
            let p = match self.position(*key) {
                Ok(p) => p,
                Err(e) => return (draws, Some((key.index, e))),
            };
            let d = drawer.at(p);
            let seed = if key.seed == job_seed { seeds[d.source] } else { source_seed(key.seed, d.source) };
            draws.push((d.source, own_key(&d, seed)));
        }
        (draws, None)
    }
}

impl Dataset for Mix {
    fn fetches_ahead(&self) -> bool {
        self.sources.iter().any(|s| s.fetches_ahead())
    }

    fn prefetch_batch(&self, keys: &[SampleKey]) {
        let (draws, _) = self.draw(keys);
        for (k, source) in self.sources.iter().enumerate().filter(|(_, s)| s.fetches_ahead()) {
            let own: Vec<SampleKey> = draws.iter().filter(|(d, _)| *d == k).map(|(_, key)| *key).collect();
            if !own.is_empty() {
                source.prefetch_batch(&own);
            }
        }
    }

    fn tensors(&self) -> &[SampleTensor] {
        &self.tensors
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn writes_whole_rows(&self) -> bool {
        self.sources.iter().all(|s| s.writes_whole_rows())
    }

    fn read_into(&self, key: SampleKey, rows: &mut [&mut [u8]]) -> Result<(), DatasetError> {
        let d = Drawer::new(&self.plan).at(self.position(key)?);
        let own = own_key(&d, source_seed(key.seed, d.source));
        self.read(key.index, d.source, own, rows)?;
        self.drawn[d.source].increment(1);
        Ok(())
    }

    fn read_batch(
        &self,
        keys: &[SampleKey],
        batch: &mut BatchRows<'_>,
    ) -> Result<(), DatasetError> {
        let mut drawn: SmallVec<[u64; 8]> = smallvec::smallvec![0; self.sources.len()];
        // Drawn first, read after: the reads (copies, decodes) run back to
        // back, as a plan's precomputed indices let a single dataset's. A
        // sample that cannot be drawn ends the draws; the samples before it
        // are read, then it settles as the error it is.
        let (draws, failed) = self.draw(keys);
        for (i, (key, &(k, own))) in keys.iter().zip(&draws).enumerate() {
            // The next sample's bytes start loading while this one's are
            // copied: a mixture's loop (a virtual call and more bookkeeping
            // between copies than a single dataset's) otherwise leaves each
            // copy waiting on memory.
            if let Some(&(next, own)) = draws.get(i + 1) {
                self.sources[next].prefetch(own);
            }
            let read = self.read(key.index, k, own, &mut batch.next_rows());
            if read.is_ok() {
                drawn[k] += 1;
            }
            batch.settle(key.index, read)?;
        }
        if let Some((index, e)) = failed {
            batch.settle(index, Err(e))?;
        }
        // The batch's `batch.produce` span (when traced) carries its mix.
        let span = tracing::Span::current();
        if !span.is_disabled() {
            let mix: Vec<String> = self
                .names
                .iter()
                .zip(&drawn)
                .filter(|(_, n)| **n > 0)
                .map(|(name, n)| format!("{name}={n}"))
                .collect();
            span.record("sources", mix.join(" "));
        }
        for (counter, n) in self.drawn.iter().zip(drawn) {
            if n > 0 {
                counter.increment(n);
            }
        }
        Ok(())
    }
}
