//! `loader._native`: the compiled half of Loader's Python SDK. The Python
//! package (`python/loader/`) holds the user-facing `Loader` (epochs,
//! `len`, `state_dict`, spec handling, clean exit); this module holds what
//! must be native: the loader itself, zero-copy batch views and the worker
//! entry point the package re-executes its own interpreter into.
//!
//! # Layout
//! - `session`: [`NativeLoader`](session::NativeLoader), one
//!   `loader_client::Loader` behind a lock; waits with the GIL released and
//!   checks for Ctrl-C while it waits; `close` from any thread.
//! - `batch`: [`Batch`](batch::Batch), a read-only mapping of tensor name to
//!   numpy array over the batch's own memory (a ring slot or a gRPC frame).
//! - `tensor`: [`TensorView`](tensor::TensorView), the keep-alive owner of
//!   one tensor's bytes: the buffer protocol (numpy) and DLPack (torch).
//! - `dlpack`: the DLPack C structures and the capsule that carries them.
//! - `options`: the loader's options as the Rust SDK's `LoaderOptions`
//!   JSON: their defaults and their checks, for `loader.Loader`'s keywords.
//! - `spec`: job specs from JSON/YAML text, and what a spec or a saved state
//!   plans (batches per epoch, epochs).
//! - `blobs`: the host's blob directory, where `Loader.local` writes the
//!   pickled dataset its workers read.
//! - `errors`: the one mapping of `LoaderError` to Python exceptions.
//! - `telemetry`: trace export from the trainer when the OpenTelemetry
//!   environment asks for it, flushed at exit.
//! - `worker`: `run_worker`, `loader-worker`'s command line in this module.
//! - `template`: `WorkerTemplate`, the trainer's end of the worker template
//!   (`loader._template`), which forks embedded mode's workers.
//! - `dataset`: `PythonDataset`, a user's Python dataset served by that
//!   worker (`__getitem__` for a batch's indices in one call, each sample
//!   copied into the batch buffer).
//! - `image_draws`: the image pipeline's random draws for one sample (crop
//!   box, flip), for the parity tests against torchvision.
//! - `sample_cache`: `SampleCache`, the sample cache of `Loader.local(cache=)`
//!   (`loader_worker::sample_cache`) for the trainer and `loader._cache`.
//! - `ring`: the shared-memory ring of a job only a sample sizes (a Python
//!   dataset's): its batch's bytes from the batch layout, and the window
//!   and slots for them (`loader._ring`).
//! - `sample_plan`: `SamplePlan`, the shape of a dataset's samples, which
//!   writes a plain sample (containers, arrays, numbers) into its rows
//!   without a Python call per leaf.

mod batch;
mod blobs;
mod dataset;
mod dlpack;
mod errors;
mod image_draws;
mod options;
mod ring;
mod sample_cache;
mod sample_plan;
mod session;
mod spec;
mod telemetry;
mod template;
mod tensor;
mod worker;

use pyo3::prelude::*;

/// The module `loader._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<session::NativeLoader>()?;
    m.add_class::<batch::Batch>()?;
    m.add_class::<tensor::TensorView>()?;
    m.add_class::<template::WorkerTemplate>()?;
    m.add_class::<sample_cache::PySampleCache>()?;
    m.add_class::<sample_cache::CacheEntry>()?;
    m.add("LoaderError", py.get_type::<errors::LoaderError>())?;
    // Batches of each rank per lane's turn (`loader._stream` keeps that many
    // ranks' samples read ahead).
    m.add("LANE_TURN", loader_job::sampler::LANE_TURN)?;
    m.add_function(wrap_pyfunction!(options::default_options, m)?)?;
    m.add_function(wrap_pyfunction!(options::check_options, m)?)?;
    m.add_function(wrap_pyfunction!(spec::parse_spec, m)?)?;
    m.add_function(wrap_pyfunction!(blobs::blob_dir, m)?)?;
    m.add_function(wrap_pyfunction!(spec::parse_spec_file, m)?)?;
    m.add_function(wrap_pyfunction!(spec::plan, m)?)?;
    m.add_function(wrap_pyfunction!(spec::batch_bytes, m)?)?;
    m.add("DEFAULT_SLOT_SIZE", loader_client::DEFAULT_SLOT_SIZE)?;
    m.add_function(wrap_pyfunction!(spec::frame_cache_entries, m)?)?;
    m.add_function(wrap_pyfunction!(spec::resume_state, m)?)?;
    m.add_function(wrap_pyfunction!(spec::merge_states, m)?)?;
    m.add_function(wrap_pyfunction!(worker::run_worker, m)?)?;
    m.add_function(wrap_pyfunction!(worker::worker_log, m)?)?;
    m.add_function(wrap_pyfunction!(telemetry::flush_telemetry, m)?)?;
    m.add_function(wrap_pyfunction!(dataset::py_sample_seed, m)?)?;
    m.add_function(wrap_pyfunction!(ring::batch_len, m)?)?;
    m.add_function(wrap_pyfunction!(ring::ring_for_batch, m)?)?;
    // Timed loads and reads back before a sample cache decides whether it
    // pays (`loader._cache` reads this many entries back as it stores).
    m.add("CACHE_DECIDE_AFTER", loader_worker::dataset::CACHE_DECIDE_AFTER)?;
    m.add_function(wrap_pyfunction!(image_draws::random_resized_crop_box, m)?)?;
    m.add_function(wrap_pyfunction!(image_draws::flip_drawn, m)?)?;
    m.add("STATE_FORMAT", loader_client::STATE_FORMAT)?;
    Ok(())
}
