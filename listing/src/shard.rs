//! The index of one WebDataset tar shard.
//!
//! WebDataset's grouping rule: a member's key is its path up to the first
//! dot of its file name, its extension what follows (`a/b.seg.png` has key
//! `a/b` and extension `seg.png`); consecutive members with the same key
//! form one sample. The image is the member with extension `jpg`, `jpeg` or
//! `png`, the label the member with extension `cls` (decimal text).
//!
//! Indexing reads only the 512-byte headers (seeking over the contents), so
//! a submitter can count the samples of many large shards quickly; a worker
//! keeps the byte range of every member and reads the shard through one
//! mapping.

use std::path::Path;

use crate::ListingError;
use crate::source::Source;

/// Where one member's bytes lie in the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Byte offset of the contents in the shard file.
    pub offset: u64,
    /// Length of the contents.
    pub len: u64,
}

/// One sample: the members sharing a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSample {
    /// The key (member path up to the first dot of its file name).
    pub key: String,
    /// The image member, if the sample has one.
    pub image: Option<Member>,
    /// The `.cls` member, if the sample has one.
    pub label: Option<Member>,
}

/// The samples of one shard, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardIndex {
    /// Sample `i` of the shard is `samples[i]`.
    pub samples: Vec<ShardSample>,
}

/// Splits a member path into `(key, extension)`; None for a name without
/// a dot (WebDataset ignores those).
pub fn split_key(path: &str) -> Option<(&str, &str)> {
    let name_start = path.rfind('/').map_or(0, |i| i + 1);
    let dot = path[name_start..].find('.')? + name_start;
    Some((&path[..dot], &path[dot + 1..]))
}

/// Indexes the shard at `path`.
pub fn index(path: &Path) -> Result<ShardIndex, ListingError> {
    let (file, _) = crate::source::open(path)?;
    index_of(file, path)
}

/// Indexes the shard `path` names, read from `file`: an object the caller
/// holds open already, so that the bytes the walk fetches are the ones its
/// samples are read from later, not fetched twice.
pub fn index_of(file: Source, path: &Path) -> Result<ShardIndex, ListingError> {
    let bad = |e: std::io::Error| ListingError::new(path, format!("not a readable tar file: {e}"));
    let mut archive = tar::Archive::new(file);
    let mut index = ShardIndex::default();
    for entry in archive.entries_with_seek().map_err(bad)? {
        let entry = entry.map_err(bad)?;
        let kind = entry.header().entry_type();
        if !kind.is_file() && !kind.is_contiguous() {
            continue;
        }
        let name = entry.path().map_err(bad)?;
        let Some(name) = name.to_str() else {
            continue;
        };
        let Some((key, ext)) = split_key(name) else {
            continue;
        };
        if index.samples.last().is_none_or(|s| s.key != key) {
            index.samples.push(ShardSample { key: key.to_owned(), image: None, label: None });
        }
        let member = Member { offset: entry.raw_file_position(), len: entry.size() };
        let Some(sample) = index.samples.last_mut() else {
            continue;
        };
        let ext = ext.to_ascii_lowercase();
        if crate::image_folder::IMAGE_EXTENSIONS.contains(&ext.as_str()) {
            sample.image.get_or_insert(member);
        } else if ext == "cls" {
            sample.label.get_or_insert(member);
        }
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, data).expect("append");
    }

    #[test]
    fn keys_split_at_the_first_dot_of_the_file_name() {
        assert_eq!(split_key("a/b.seg.png"), Some(("a/b", "seg.png")));
        assert_eq!(split_key("x.v1/sample.jpg"), Some(("x.v1/sample", "jpg")));
        assert_eq!(split_key("dir/noext"), None);
    }

    #[test]
    fn members_group_by_key_with_their_byte_ranges() {
        let mut b = tar::Builder::new(Vec::new());
        append(&mut b, "s/000.jpg", b"jpeg-0");
        append(&mut b, "s/000.cls", b"3");
        append(&mut b, "s/001.cls", b"7\n");
        append(&mut b, "s/001.PNG", b"png-1");
        append(&mut b, "s/002.txt", b"caption");
        let long = format!("{}/003.jpg", "d".repeat(150));
        append(&mut b, &long, b"long-name");
        let bytes = b.into_inner().expect("finish");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("shard.tar");
        std::fs::write(&path, &bytes).expect("write");

        let index = index(&path).expect("index");
        let keys: Vec<&str> = index.samples.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, vec!["s/000", "s/001", "s/002", &long[..long.len() - 4]]);
        let slice = |m: &Option<Member>| {
            m.as_ref().map(|m| &bytes[m.offset as usize..(m.offset + m.len) as usize])
        };
        assert_eq!(slice(&index.samples[0].image), Some(&b"jpeg-0"[..]));
        assert_eq!(slice(&index.samples[0].label), Some(&b"3"[..]));
        assert_eq!(slice(&index.samples[1].image), Some(&b"png-1"[..]));
        assert_eq!(slice(&index.samples[1].label), Some(&b"7\n"[..]));
        assert_eq!((index.samples[2].image.clone(), index.samples[2].label.clone()), (None, None));
        assert_eq!(slice(&index.samples[3].image), Some(&b"long-name"[..]));
    }

    #[test]
    fn a_file_that_is_no_tar_fails_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("junk.tar");
        std::fs::write(&path, vec![7u8; 1024]).expect("write");
        let e = index(&path).expect_err("junk");
        assert!(e.to_string().starts_with(&format!("{}: not a readable tar file", path.display())), "{e}");
    }
}
