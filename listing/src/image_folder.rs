//! Image folders: which files are the samples, and which label each has.
//!
//! Class-folder layout (torchvision's `ImageFolder`): every subdirectory of
//! the root is a class; classes are numbered in byte order of their names;
//! the samples are the `.jpg`, `.jpeg` and `.png` files (any case) anywhere
//! under a class folder, directories visited in byte order of their paths
//! and files in byte order of their names, as `sorted(os.walk(..))` does.
//! A class folder with no image keeps its number, so labels never shift.
//!
//! Manifest layout: a text file of `relative/path<TAB>label` lines (paths
//! relative to the root), in dataset order; blank lines and lines starting
//! with `#` are ignored.
//!
//! The [fingerprint](ImageListing::fingerprint) covers the relative paths
//! and labels, not the root, so the same tree mounted elsewhere on a worker
//! matches, and a tree that gained, lost or renamed a file does not.

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::ListingError;

/// Deepest folder nesting followed under a class folder: a symlink loop
/// ends here instead of recursing forever.
const MAX_DEPTH: usize = 64;

/// File extensions that are samples (compared case-insensitively).
pub const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// One image and its label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSample {
    /// Path relative to the root.
    pub path: PathBuf,
    /// Class index (class-folder layout) or the manifest's label.
    pub label: i64,
}

/// The samples of an image folder, in dataset order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageListing {
    /// Every sample; sample `i` of the dataset is `samples[i]`.
    pub samples: Vec<ImageSample>,
    /// Class names by label (class-folder layout; empty for a manifest).
    pub classes: Vec<String>,
    /// For a folder in a bucket: each sample's object (size and the ETag a
    /// read must still find); empty for a local folder.
    pub objects: Vec<loader_storage::Listed>,
}

impl ImageListing {
    /// FNV-1a over every relative path and label: equal listings give equal
    /// fingerprints on every machine and build.
    pub fn fingerprint(&self) -> u64 {
        let mut hash = Fnv::default();
        for s in &self.samples {
            hash.write(s.path.as_os_str().as_bytes());
            hash.write(&[0]);
            hash.write(&s.label.to_le_bytes());
        }
        hash.0
    }
}

/// 64-bit FNV-1a: simple, stable across Rust releases (unlike `DefaultHasher`).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// True when `path` has an image extension.
pub fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// Lists the image folder at `root`: from `manifest` when given, else from
/// its class folders. Fails when the listing holds no sample.
pub fn list(root: &Path, manifest: Option<&Path>) -> Result<ImageListing, ListingError> {
    let listing = match manifest {
        Some(m) => from_manifest(m)?,
        None if loader_storage::is_url(&root.to_string_lossy()) => from_bucket(root)?,
        None => from_class_folders(root)?,
    };
    if listing.samples.is_empty() {
        let what = manifest.unwrap_or(root);
        let problem = if manifest.is_some() {
            "the manifest lists no image".to_owned()
        } else {
            format!("no image files ({}) in class folders", IMAGE_EXTENSIONS.map(|e| format!(".{e}")).join(", "))
        };
        return Err(ListingError::new(what, problem));
    }
    Ok(listing)
}

fn from_class_folders(root: &Path) -> Result<ImageListing, ListingError> {
    let mut classes: Vec<OsString> = Vec::new();
    for entry in read_dir(root)? {
        let (name, path) = entry;
        // `metadata` follows symlinks, as torchvision's scandir().is_dir() does.
        if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            classes.push(name);
        }
    }
    classes.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let mut samples = Vec::new();
    for (label, class) in classes.iter().enumerate() {
        let mut dirs = Vec::new();
        walk(root, &PathBuf::from(class), 0, &mut dirs)?;
        dirs.sort_unstable_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
        for (dir, files) in dirs {
            for file in files {
                samples.push(ImageSample { path: dir.join(file), label: label as i64 });
            }
        }
    }
    let classes = classes.into_iter().map(|c| c.to_string_lossy().into_owned()).collect();
    Ok(ImageListing { samples, classes, objects: Vec::new() })
}

/// Collects `(relative dir, sorted image file names)` for `rel` and every
/// folder below it.
/// The class-folder layout of the objects under a bucket's prefix
/// (`s3://bucket/train/`): every first-level "folder" holding an object is
/// a class, and the order is the local walk's (classes, then folders, then
/// files, each in byte order), so a tree uploaded as it is lists alike and
/// has the same fingerprint. A class "folder" holding no object does not
/// exist in a store, so it takes no number.
fn from_bucket(root: &Path) -> Result<ImageListing, ListingError> {
    let name = root.to_string_lossy();
    let url = loader_storage::ObjectUrl::parse(&name).map_err(|e| ListingError { path: e.url, problem: e.problem })?;
    let listed = loader_storage::list(&url).map_err(|e| ListingError { path: e.url, problem: e.problem })?;
    // (class, folder, file) of each image, with its object.
    let mut images: Vec<(&str, &str, &str, &loader_storage::Listed)> = Vec::new();
    let mut classes: Vec<&str> = Vec::new();
    for object in &listed {
        let Some((class, rest)) = object.key.split_once('/') else { continue };
        if class.is_empty() || rest.split('/').count() > MAX_DEPTH + 1 {
            continue;
        }
        classes.push(class);
        let (folder, file) = rest.rsplit_once('/').unwrap_or(("", rest));
        if !file.is_empty() && is_image(Path::new(file)) {
            images.push((class, folder, file, object));
        }
    }
    classes.sort_unstable();
    classes.dedup();
    images.sort_unstable_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
    let mut samples = Vec::with_capacity(images.len());
    let mut objects = Vec::with_capacity(images.len());
    for (class, _, _, object) in images {
        let label = classes.binary_search(&class).unwrap_or_default() as i64;
        samples.push(ImageSample { path: PathBuf::from(&object.key), label });
        objects.push(object.clone());
    }
    let classes = classes.into_iter().map(str::to_owned).collect();
    Ok(ImageListing { samples, classes, objects })
}

fn walk(
    root: &Path,
    rel: &Path,
    depth: usize,
    out: &mut Vec<(PathBuf, Vec<OsString>)>,
) -> Result<(), ListingError> {
    let mut files = Vec::new();
    for (name, path) in read_dir(&root.join(rel))? {
        let Ok(meta) = fs::metadata(&path) else {
            // A dangling symlink is no sample.
            continue;
        };
        if meta.is_dir() {
            if depth < MAX_DEPTH {
                walk(root, &rel.join(&name), depth + 1, out)?;
            }
        } else if meta.is_file() && is_image(Path::new(&name)) {
            files.push(name);
        }
    }
    files.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    out.push((rel.to_path_buf(), files));
    Ok(())
}

fn read_dir(dir: &Path) -> Result<Vec<(OsString, PathBuf)>, ListingError> {
    let entries = fs::read_dir(dir).map_err(|e| ListingError::io(dir, &e))?;
    entries
        .map(|e| {
            let e = e.map_err(|e| ListingError::io(dir, &e))?;
            Ok((e.file_name(), e.path()))
        })
        .collect()
}

fn from_manifest(manifest: &Path) -> Result<ImageListing, ListingError> {
    let bytes = fs::read(manifest).map_err(|e| ListingError::io(manifest, &e))?;
    let mut samples = Vec::new();
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) || line.first() == Some(&b'#') {
            continue;
        }
        let bad = |problem: String| ListingError::new(manifest, format!("line {}: {problem}", n + 1));
        let Some(tab) = line.iter().rposition(|&b| b == b'\t') else {
            return Err(bad("expected `relative/path<TAB>label`".into()));
        };
        let (path, label) = (&line[..tab], &line[tab + 1..]);
        let label = std::str::from_utf8(label)
            .ok()
            .and_then(|l| l.trim().parse::<i64>().ok())
            .ok_or_else(|| bad(format!("label {:?} is not an integer", String::from_utf8_lossy(label))))?;
        if path.is_empty() {
            return Err(bad("empty path".into()));
        }
        samples.push(ImageSample { path: PathBuf::from(OsString::from_vec(path.to_vec())), label });
    }
    Ok(ImageListing { samples, classes: Vec::new(), objects: Vec::new() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(root: &Path, rel: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, b"x").expect("write");
    }

    #[test]
    fn class_folders_are_labelled_in_byte_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for rel in ["dog/b.PNG", "dog/a.jpg", "cat/z.jpeg", "cat/notes.txt", "cat/sub/c.jpg", "Zebra/q.jpg"] {
            touch(root, rel);
        }
        fs::create_dir_all(root.join("empty")).expect("mkdir");
        touch(root, "stray.jpg");
        let listing = list(root, None).expect("list");
        assert_eq!(listing.classes, vec!["Zebra", "cat", "dog", "empty"]);
        let got: Vec<(String, i64)> =
            listing.samples.iter().map(|s| (s.path.display().to_string(), s.label)).collect();
        let expect = [("Zebra/q.jpg", 0), ("cat/z.jpeg", 1), ("cat/sub/c.jpg", 1), ("dog/a.jpg", 2), ("dog/b.PNG", 2)];
        assert_eq!(got, expect.map(|(p, l)| (p.to_owned(), l)).to_vec());

        let fp = listing.fingerprint();
        assert_eq!(list(root, None).expect("list").fingerprint(), fp);
        touch(root, "dog/c.png");
        assert_ne!(list(root, None).expect("list").fingerprint(), fp);
    }

    #[test]
    fn manifest_lines_give_paths_and_labels() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = dir.path().join("train.tsv");
        fs::write(&m, "# header\na/x.jpg\t3\n\nb c/y.png\t-1\r\n").expect("write");
        let listing = list(dir.path(), Some(&m)).expect("list");
        assert_eq!(listing.samples, vec![
            ImageSample { path: "a/x.jpg".into(), label: 3 },
            ImageSample { path: "b c/y.png".into(), label: -1 },
        ]);
        fs::write(&m, "a/x.jpg 3\n").expect("write");
        let e = list(dir.path(), Some(&m)).expect_err("no tab");
        assert_eq!(e.to_string(), format!("{}: line 1: expected `relative/path<TAB>label`", m.display()));
        fs::write(&m, "a/x.jpg\tcat\n").expect("write");
        let e = list(dir.path(), Some(&m)).expect_err("label");
        assert!(e.to_string().ends_with("line 1: label \"cat\" is not an integer"), "{e}");
    }

    #[test]
    fn empty_or_missing_folders_fail_naming_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = list(dir.path(), None).expect_err("empty");
        assert_eq!(e.to_string(), format!("{}: no image files (.jpg, .jpeg, .png) in class folders", dir.path().display()));
        let missing = dir.path().join("nope");
        let e = list(&missing, None).expect_err("missing");
        assert!(e.to_string().starts_with(&format!("{}: No such file", missing.display())), "{e}");
    }
}
