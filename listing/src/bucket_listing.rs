//! An image folder in a bucket, listed once for a job: the submitter's
//! listing travels to the workers as the blob `listing`
//! (`loader_proto::blob::IMAGE_FOLDER_LISTING`, a `BucketListing`), and a
//! worker reads it instead of listing the store again.
//!
//! Why: a store answers a LIST a thousand keys at a time, one round trip
//! each, and every worker listed the folder before its first batch (a
//! quarter of a second for 12,800 images behind a 10 ms link, seconds for
//! ImageNet, and a LIST bill per worker). And with one listing, every
//! worker reads the objects, and pins the ETags, the job was submitted
//! with: an object replaced after submission is a changed object for all
//! of them, not new bytes for the workers that listed late.
//!
//! The blob holds the listing as arranged (class names, and each image's
//! key, label, size and ETag in dataset order), not the store's raw answer,
//! so a worker rebuilds exactly the submitter's [`ImageListing`]; its
//! fingerprint is checked against the spec's as a worker's own listing is.

use std::path::{Path, PathBuf};

use loader_proto::pb::{BucketListing, ListedImage};
use loader_storage::Listed;
use prost::Message;

use crate::ListingError;
use crate::image_folder::{ImageListing, ImageSample};

/// The blob's bytes for `listing`; None for a folder not in a bucket (its
/// listing holds no objects), which workers list themselves.
pub fn encode(listing: &ImageListing) -> Option<Vec<u8>> {
    if listing.objects.is_empty() || listing.objects.len() != listing.samples.len() {
        return None;
    }
    let images = listing
        .samples
        .iter()
        .zip(&listing.objects)
        .map(|(sample, object)| ListedImage {
            key: object.key.clone(),
            label: sample.label,
            size: object.size,
            etag: object.etag.clone().unwrap_or_default(),
        })
        .collect();
    Some(BucketListing { classes: listing.classes.clone(), images }.encode_to_vec())
}

/// The listing in the blob file at `path`; one line naming the file when it
/// is not one.
pub fn read(path: &Path) -> Result<ImageListing, ListingError> {
    let bytes = std::fs::read(path).map_err(|e| ListingError::new(path, e.to_string()))?;
    decode(&bytes).map_err(|problem| ListingError::new(path, problem))
}

fn decode(bytes: &[u8]) -> Result<ImageListing, String> {
    let listing = BucketListing::decode(bytes).map_err(|e| format!("not a bucket listing ({e})"))?;
    let classes = listing.classes.len();
    let mut samples = Vec::with_capacity(listing.images.len());
    let mut objects = Vec::with_capacity(listing.images.len());
    for (i, image) in listing.images.into_iter().enumerate() {
        if image.key.is_empty() || usize::try_from(image.label).map_or(true, |l| l >= classes) {
            return Err(format!("image {i} has no key or a label outside the {classes} classes"));
        }
        samples.push(ImageSample { path: PathBuf::from(&image.key), label: image.label });
        let etag = Some(image.etag).filter(|e| !e.is_empty());
        objects.push(Listed { key: image.key, size: image.size, etag });
    }
    Ok(ImageListing { samples, classes: listing.classes, objects })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing() -> ImageListing {
        let objects = vec![
            Listed { key: "cat/a b.jpg".into(), size: 10, etag: Some("\"e1\"".into()) },
            Listed { key: "dog/x/1.png".into(), size: 20, etag: None },
        ];
        ImageListing {
            samples: objects.iter().zip([0, 1]).map(|(o, l)| ImageSample { path: PathBuf::from(&o.key), label: l }).collect(),
            classes: vec!["cat".into(), "dog".into()],
            objects,
        }
    }

    #[test]
    fn a_listing_reads_back_as_it_was_with_its_fingerprint() {
        let listing = listing();
        let bytes = encode(&listing).expect("a bucket's listing");
        let back = decode(&bytes).expect("decodes");
        assert_eq!(back, listing);
        assert_eq!(back.fingerprint(), listing.fingerprint());
    }

    #[test]
    fn a_local_folder_has_no_blob() {
        let mut listing = listing();
        listing.objects.clear();
        assert_eq!(encode(&listing), None);
    }

    #[test]
    fn bytes_that_are_no_listing_are_one_line() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("listing");
        std::fs::write(&path, b"\xff\xff\xff").expect("write");
        let e = read(&path).expect_err("not a listing");
        assert!(e.to_string().starts_with(&format!("{}: not a bucket listing", path.display())), "{e}");
        assert!(!e.to_string().contains('\n'));
        let mut bad = listing();
        bad.samples[1].label = 2;
        let e = decode(&encode(&bad).expect("bytes")).expect_err("label out of range");
        assert!(e.contains("image 1"), "{e}");
    }
}
