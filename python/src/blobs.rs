//! The host's blob directory for the package's Python half
//! (`loader._dataset.write_pickle` writes a pickled dataset there): the
//! directory the workers use, resolved from the same environment and
//! checked the same way (`loader_process::blobs`), so co-located workers
//! find the file without fetching it.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

/// The host's blob directory, created 0700 if needed; `OSError` in one
/// line when it is not a directory of this user or others may write to it.
#[pyfunction]
pub(crate) fn blob_dir() -> PyResult<String> {
    let dir = loader_process::blobs::BlobDir::open(loader_process::blobs::path_from_env())
        .map_err(|e| PyOSError::new_err(e.to_string()))?;
    Ok(dir.path().to_string_lossy().into_owned())
}
