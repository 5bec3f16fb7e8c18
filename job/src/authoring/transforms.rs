//! The steps of an image pipeline, as [`Transform`] messages, so a Rust
//! trainer writes `vec![decode(), random_resized_crop(224), horizontal_flip()]`
//! instead of nested protobuf structs. Workers apply them in order; every
//! random choice derives from (seed, epoch, sample index).

use loader_proto::pb::{
    CenterCrop, Cast, Decode, Dtype, HorizontalFlip, Layout, Normalize, RandomResizedCrop, Resize,
    Transform, transform::Op,
};

fn op(op: Op) -> Transform {
    Transform { op: Some(op) }
}

/// Decodes JPEG or PNG to 8-bit RGB; the first step of every pipeline.
pub fn decode() -> Transform {
    op(Op::Decode(Decode {}))
}

/// torchvision's `RandomResizedCrop(size)` with the default scale
/// (0.08, 1.0), ratio (3/4, 4/3) and interpolation (bilinear), to a
/// `size` x `size` square.
pub fn random_resized_crop(size: u32) -> Transform {
    op(Op::RandomResizedCrop(RandomResizedCrop { size: vec![size], ..Default::default() }))
}

/// Resizes the shorter side to `size`, keeping the aspect ratio
/// (bilinear, torchvision's default interpolation).
pub fn resize(size: u32) -> Transform {
    op(Op::Resize(Resize { size: vec![size], ..Default::default() }))
}

/// Crops the centre `size` x `size` square.
pub fn center_crop(size: u32) -> Transform {
    op(Op::CenterCrop(CenterCrop { size: vec![size] }))
}

/// Mirrors left-right with probability 0.5.
pub fn horizontal_flip() -> Transform {
    op(Op::HorizontalFlip(HorizontalFlip { p: None }))
}

/// `(x / 255 - mean) / std` per channel, giving float32.
pub fn normalize(mean: [f32; 3], std: [f32; 3]) -> Transform {
    op(Op::Normalize(Normalize { mean: mean.to_vec(), std: std.to_vec() }))
}

/// Converts the element type (uint8 <-> float32).
pub fn cast(dtype: Dtype) -> Transform {
    op(Op::Cast(Cast { dtype: dtype as i32 }))
}

/// Sets the memory layout of the image tensor (CHW is the default).
pub fn layout(layout: Layout) -> Transform {
    op(Op::Layout(layout as i32))
}

/// The standard ImageNet training pipeline: decode, RandomResizedCrop(size),
/// horizontal flip; uint8 CHW `[3, size, size]`.
pub fn standard_train(size: u32) -> Vec<Transform> {
    vec![decode(), random_resized_crop(size), horizontal_flip()]
}
