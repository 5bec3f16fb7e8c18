//! Job specs for Python: the text a user wrote (a dict as JSON, or a JSON or
//! YAML file) becomes a `JobSpec` through the SDK's one spec-file parser
//! (`loader_job::authoring::file`), handed to Python as opaque protobuf bytes so
//! the Python side never re-implements the schema; and what a spec or a
//! saved state plans, for `len()` and `set_epoch()` before anything starts.

use std::path::Path;

use loader_client::{JobSpec, LoaderState};
use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::to_py;

/// Parses a job spec given as text (JSON when it starts with `{`, else
/// YAML; relative paths in it resolve against `base_dir`) and returns it
/// protobuf-encoded, validated, with its dataset's size read from its files.
/// Releases the GIL: listing a large image folder takes a while.
#[pyfunction]
pub(crate) fn parse_spec<'py>(
    py: Python<'py>,
    text: &str,
    base_dir: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let spec = py
        .detach(|| loader_job::authoring::file::parse(text, Path::new(base_dir))?.build())
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &spec.encode_to_vec()))
}

/// Like [`parse_spec`] for the spec file at `path` (`.json` is JSON,
/// anything else YAML); errors name the file, and relative paths resolve
/// against its directory.
#[pyfunction]
pub(crate) fn parse_spec_file<'py>(py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyBytes>> {
    let spec = py
        .detach(|| loader_job::authoring::file::parse_file(Path::new(path))?.build())
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &spec.encode_to_vec()))
}

/// Decodes what [`parse_spec`] returned.
pub(crate) fn decode(spec: &[u8]) -> PyResult<JobSpec> {
    JobSpec::decode(spec)
        .map_err(|e| PyValueError::new_err(format!("not an encoded job spec: {e}")))
}

/// For a built-in image job (`image_folder`, `webdataset`): how many
/// entries its workers' shared sample cache needs (a frame per sample and
/// DCT scale, `loader_worker::dataset::FrameCache`); None for any other
/// dataset, whose pipeline keeps nothing.
#[pyfunction]
pub(crate) fn frame_cache_entries(spec: &[u8]) -> PyResult<Option<u64>> {
    loader_worker::dataset::frame_cache_entries(&decode(spec)?).map_err(PyValueError::new_err)
}

/// `(batches_per_epoch, epochs, batch_size, drop_last, num_samples)` of
/// rank `rank` when the job `spec` runs with `world_size` ranks (None: the
/// spec's own `consumers`): what a DataLoader-shaped loader answers for
/// `len()`, `batch_size`, `drop_last` and `len(dataset)`. Fails, with the
/// coordinator's message, on a spec or rank that cannot run.
#[pyfunction]
#[pyo3(signature = (spec, rank, world_size=None))]
pub(crate) fn plan(spec: &[u8], rank: u32, world_size: Option<u32>) -> PyResult<(u64, u32, u64, bool, u64)> {
    let mut spec = decode(spec)?;
    if let Some(w) = world_size {
        spec.consumers = w;
    }
    let plan = loader_job::authoring::validate(&spec).map_err(to_py)?;
    if rank >= plan.consumers {
        return Err(PyValueError::new_err(format!(
            "rank {rank} is outside world size {}",
            plan.consumers
        )));
    }
    Ok((plan.batches_per_epoch(), plan.epochs, plan.batch_size, plan.drop_last, plan.num_samples))
}

/// Bytes of one batch of `spec` in the batch format, when the spec tells
/// (built-in datasets; None for a Python dataset, whose samples tell): for
/// sizing the ring of a job whose batches outgrow the default slot.
#[pyfunction]
pub(crate) fn batch_bytes(spec: &[u8]) -> PyResult<Option<u64>> {
    Ok(loader_job::footprint::batch_bytes(&decode(spec)?))
}

/// A loader that resumes from a saved state (the JSON of `state_dict()`)
/// as rank `rank` of `world_size` with `batch_size` samples per batch: the
/// state it resumes from, re-planned when the world size or batch size
/// differ (see `LoaderState::resume_as`), and `(batches_per_epoch, epochs,
/// yielded)` of it. Checks the state.
///
/// With `spec`, the job of the loader that loads it: the state is a
/// position and `spec` the configuration (see `LoaderState::under`): its
/// batch size applies unless `batch_size` says otherwise, and its epoch
/// bound; a state of another dataset or seed is refused. Without it, the
/// state's own job and `batch_size` (None: the saved one).
#[pyfunction]
#[pyo3(signature = (state, rank=None, world_size=None, batch_size=None, spec=None))]
pub(crate) fn resume_state(
    state: &str,
    rank: Option<u32>,
    world_size: Option<u32>,
    batch_size: Option<u32>,
    spec: Option<&[u8]>,
) -> PyResult<(String, u64, u32, u64)> {
    let mut state = LoaderState::from_json(state).map_err(to_py)?;
    let mut batch_size = batch_size;
    if let Some(spec) = spec {
        let ours = decode(spec)?;
        state = state.under(&ours).map_err(to_py)?;
        batch_size = batch_size.or(Some(ours.batch_size));
    }
    let rank = rank.unwrap_or(state.rank());
    let world_size = world_size.unwrap_or(state.world_size());
    let resumed = state.resume_as(rank, world_size, batch_size).map_err(to_py)?;
    let plan = loader_job::authoring::validate(&resumed.spec).map_err(to_py)?;
    let yielded = resumed.next_seq.max(plan.first_seq()) + resumed.yielded_above.len() as u64;
    let json = if resumed.replanned { resumed.into_state(rank).to_json() } else { state.to_json() };
    Ok((json, plan.batches_per_epoch(), plan.epochs, yielded))
}

/// One state for the whole job from the states (JSON) its ranks saved,
/// at the same step or not (see `LoaderState::merge`), as JSON.
#[pyfunction]
pub(crate) fn merge_states(states: Vec<String>) -> PyResult<String> {
    let states = states
        .iter()
        .map(|s| LoaderState::from_json(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(to_py)?;
    Ok(LoaderState::merge(&states).map_err(to_py)?.to_json())
}
