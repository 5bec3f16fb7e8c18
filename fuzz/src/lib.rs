//! What the fuzz targets share: the input formats (so the seed generator,
//! `src/bin/seeds.rs`, writes inputs the targets read), and the drivers.

pub mod batch;
pub mod ring;
pub mod rpc;
pub mod spec;
