//! What the image datasets share: the job's pipeline, which turns an
//! encoded JPEG/PNG into the `image` row, and the int64 `label` row next to
//! it (a scalar per sample, so the batch holds labels of shape `[B]`).

use loader_proto::pb::{Dtype, Transform};

use super::{DatasetError, FrameCache, SampleKey, SampleTensor, check_rows};
use crate::image::{ImageError, Pipeline};

/// The pipeline and the two tensors of an image sample.
#[derive(Debug)]
pub(super) struct ImageSamples {
    /// Decode and augment, deterministic given the sample key.
    pipeline: Pipeline,
    /// `image` (the pipeline's output) and `label` (int64 scalar).
    tensors: Vec<SampleTensor>,
    /// Bytes of the `image` and `label` rows.
    sizes: [usize; 2],
    /// Decoded frames kept across epochs, when the trainer gave a cache.
    frames: Option<FrameCache>,
}

impl ImageSamples {
    /// Builds the pipeline of a `kind` dataset from the job's transforms.
    pub(super) fn new(kind: &'static str, transforms: &[Transform]) -> Result<Self, DatasetError> {
        let pipeline =
            Pipeline::new(transforms).map_err(|e| DatasetError::Spec(format!("{kind} dataset: {e}")))?;
        let (dtype, shape) = pipeline.output();
        let image = SampleTensor { name: "image".into(), dtype, shape: shape.to_vec() };
        let label = SampleTensor { name: "label".into(), dtype: Dtype::I64, shape: Vec::new() };
        let sizes = [pipeline.output_bytes(), 8];
        Ok(Self { pipeline, tensors: vec![image, label], sizes, frames: None })
    }

    /// Keeps decoded frames in `frames` from now on.
    pub(super) fn keep_frames(&mut self, frames: Option<FrameCache>) {
        self.frames = frames;
    }

    pub(super) fn tensors(&self) -> &[SampleTensor] {
        &self.tensors
    }

    /// Checks the rows handed in before any file is read.
    pub(super) fn check(&self, index: u64, rows: &[&mut [u8]]) -> Result<(), DatasetError> {
        check_rows(index, rows, &self.sizes)
    }

    /// Whether decoded frames are kept (a kept sample's bytes are never read).
    pub(super) fn keeps_frames(&self) -> bool {
        self.frames.is_some()
    }

    /// Runs the pipeline on the image `read` gives into the image row and
    /// writes the label. With kept frames, a sample whose frame is kept is
    /// made without calling `read`. An undecodable image is
    /// [`DatasetError::Corrupt`] naming `path` (built only on failure), and
    /// `read`'s error is returned as it is.
    pub(super) fn write<R: AsRef<[u8]>>(
        &self,
        key: SampleKey,
        read: impl FnOnce() -> Result<R, DatasetError>,
        label: i64,
        path: impl FnOnce() -> String,
        rows: &mut [&mut [u8]],
    ) -> Result<(), DatasetError> {
        let [image, label_row] = rows else {
            return Err(DatasetError::RowMismatch { index: key.index });
        };
        match &self.frames {
            None => run_pipeline(&self.pipeline, read()?.as_ref(), key, image, path)?,
            Some(frames) => {
                let mut unread = None;
                let made = self.pipeline.run_kept(key, image, frames, || {
                    read().map_err(|e| {
                        unread = Some(e);
                        ImageError::Corrupt(String::new())
                    })
                });
                if let Some(e) = unread {
                    return Err(e);
                }
                pipeline_result(made, path)?;
            }
        }
        label_row.copy_from_slice(&label.to_le_bytes());
        Ok(())
    }
}

/// Runs `pipeline` on `encoded` into `row`. An undecodable image is
/// [`DatasetError::Corrupt`] naming `path` (built only on failure), for the
/// job's corrupt-sample policy; any other failure of the pipeline fails the
/// job.
pub(super) fn run_pipeline(
    pipeline: &Pipeline,
    encoded: &[u8],
    key: SampleKey,
    row: &mut [u8],
    path: impl FnOnce() -> String,
) -> Result<(), DatasetError> {
    pipeline_result(pipeline.run(encoded, key, row), path)
}

/// A pipeline's result as the dataset's: see [`run_pipeline`].
fn pipeline_result(made: Result<(), ImageError>, path: impl FnOnce() -> String) -> Result<(), DatasetError> {
    match made {
        Ok(()) => Ok(()),
        Err(ImageError::Corrupt(reason)) => Err(DatasetError::Corrupt { path: path(), reason }),
        Err(other) => Err(DatasetError::Spec(format!("{}: {other}", path()))),
    }
}
