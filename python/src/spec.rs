//! Job specs for Python: the text a user wrote (a dict as JSON, or a JSON or
//! YAML file) becomes a `JobSpec`, handed to Python as opaque protobuf bytes
//! so the Python side never re-implements the schema; and what a spec or a
//! saved state plans, for `len()` and `set_epoch()` before anything starts.

use std::path::Path;

use loader_client::{JobSpec, LoaderState};
use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::to_py;

/// Parses a job spec (JSON or YAML text; relative paths in it resolve
/// against `base_dir`) and returns it protobuf-encoded, validated.
#[pyfunction]
pub(crate) fn parse_spec<'py>(
    py: Python<'py>,
    text: &str,
    base_dir: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let spec = temporary_synthetic_only::parse(text, Path::new(base_dir))?;
    loader_client::spec::validate(&spec).map_err(to_py)?;
    Ok(PyBytes::new(py, &spec.encode_to_vec()))
}

/// Decodes what [`parse_spec`] returned.
pub(crate) fn decode(spec: &[u8]) -> PyResult<JobSpec> {
    JobSpec::decode(spec)
        .map_err(|e| PyValueError::new_err(format!("not an encoded job spec: {e}")))
}

/// `(batches_per_epoch, epochs)` of rank `rank` when the job `spec` runs
/// with `world_size` ranks (None: the spec's own `consumers`). Fails, with
/// the coordinator's message, on a spec or rank that cannot run.
#[pyfunction]
#[pyo3(signature = (spec, rank, world_size=None))]
pub(crate) fn plan(spec: &[u8], rank: u32, world_size: Option<u32>) -> PyResult<(u64, u32)> {
    let mut spec = decode(spec)?;
    if let Some(w) = world_size {
        spec.consumers = w;
    }
    let plan = loader_client::spec::validate(&spec).map_err(to_py)?;
    if rank >= plan.consumers {
        return Err(PyValueError::new_err(format!(
            "rank {rank} is outside world size {}",
            plan.consumers
        )));
    }
    Ok((plan.batches_per_epoch(), plan.epochs))
}

/// `(batches_per_epoch, epochs, yielded, rank, world_size)` of a saved
/// loader state (the JSON of `state_dict()`), checking it on the way.
#[pyfunction]
pub(crate) fn state_plan(state: &str) -> PyResult<(u64, u32, u64, u32, u32)> {
    let state = LoaderState::from_json(state).map_err(to_py)?;
    let spec = state.spec().map_err(to_py)?;
    let plan = loader_client::spec::validate(&spec).map_err(to_py)?;
    let yielded = state.next_seq() + state.yielded_above().len() as u64;
    Ok((
        plan.batches_per_epoch(),
        plan.epochs,
        yielded,
        state.rank(),
        state.world_size(),
    ))
}

/// TEMPORARY, until `loader_client::spec_file::parse` lands on main: reads
/// the synthetic dataset of the spec-file schema from JSON only. Delete this
/// module and call `spec_file::parse` instead.
mod temporary_synthetic_only {
    use std::path::Path;

    use loader_client::{Dtype, JobSpec};
    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use serde_json::Value;

    use crate::errors::to_py;

    pub(super) fn parse(text: &str, _base_dir: &Path) -> PyResult<JobSpec> {
        let bad = |m: String| PyValueError::new_err(format!("invalid job spec: {m}"));
        let doc: Value = serde_json::from_str(text)
            .map_err(|e| bad(format!("not JSON ({e}); YAML needs the spec-file parser")))?;
        let synthetic = doc
            .pointer("/dataset/synthetic")
            .ok_or_else(|| bad("dataset: only `synthetic` is supported for now".into()))?;
        let uint = |v: &Value, field: &str| -> PyResult<Option<u64>> {
            match v.get(field) {
                None => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| bad(format!("{field}: expected a non-negative integer"))),
            }
        };
        let num_samples = uint(synthetic, "num_samples")?
            .ok_or_else(|| bad("dataset.synthetic.num_samples: missing".into()))?;
        let shape = synthetic
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("dataset.synthetic.shape: expected a list of integers".into()))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .ok_or_else(|| bad("dataset.synthetic.shape: expected integers".into()))
            })
            .collect::<PyResult<Vec<u64>>>()?;
        let dtype_name = synthetic
            .get("dtype")
            .and_then(Value::as_str)
            .unwrap_or("uint8");
        let dtype = (1..=13)
            .filter_map(|i| Dtype::try_from(i).ok())
            .find(|d| d.short_name() == dtype_name)
            .ok_or_else(|| bad(format!("dataset.synthetic.dtype: unknown dtype {dtype_name:?}")))?;
        let mut b = loader_client::spec::synthetic(num_samples, &shape, dtype);
        if let Some(c) = uint(synthetic, "cost_ns")? {
            b = b.cost_ns(c);
        }
        if let Some(n) = uint(&doc, "batch_size")? {
            b = b.batch_size(u32::try_from(n).map_err(|_| bad("batch_size: too large".into()))?);
        }
        if let Some(n) = uint(&doc, "epochs")? {
            b = b.epochs(u32::try_from(n).map_err(|_| bad("epochs: too large".into()))?);
        }
        if let Some(n) = uint(&doc, "consumers")? {
            b = b.consumers(u32::try_from(n).map_err(|_| bad("consumers: too large".into()))?);
        }
        if let Some(name) = doc.get("name").and_then(Value::as_str) {
            b = b.name(name);
        }
        if let Some(sampler) = doc.get("sampler") {
            if sampler.get("shuffle").and_then(Value::as_bool) == Some(true) {
                b = b.shuffle(uint(sampler, "seed")?.unwrap_or(0));
            }
            if let Some(d) = sampler.get("drop_last").and_then(Value::as_bool) {
                b = b.drop_last(d);
            }
        }
        b.build().map_err(to_py)
    }
}
