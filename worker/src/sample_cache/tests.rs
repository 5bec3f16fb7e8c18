use std::os::fd::AsFd;
use std::sync::Arc;

use nix::sys::memfd::{MFdFlags, memfd_create};

use super::*;

fn reopen(cache: &SampleCache) -> SampleCache {
    let fd = cache.fd().try_clone_to_owned().expect("dup");
    SampleCache::open(File::from(fd), cache.entries()).expect("open")
}

#[test]
fn an_entry_stored_by_one_mapping_reads_back_in_another() {
    let cache = SampleCache::create(10, 1 << 20, None).expect("create");
    let other = reopen(&cache);
    assert_eq!(other.get(3), None);
    assert_eq!(cache.put(3, &[b"head", b"-", b"payload"]), Put::Stored);
    assert_eq!(other.get(3), Some(&b"head-payload"[..]));
    // Written once: a second put of the index is refused, the entry stays.
    assert_eq!(other.put(3, &[b"other"]), Put::Taken);
    assert_eq!(cache.get(3), Some(&b"head-payload"[..]));
    let stats = other.stats();
    assert_eq!((stats.stored, stats.stored_bytes), (1, 12));
}

#[test]
fn indexes_outside_the_cache_are_misses_and_refused() {
    let cache = SampleCache::create(4, 4096, None).expect("create");
    assert_eq!(cache.put(4, &[b"x"]), Put::Refused);
    assert_eq!(cache.get(4), None);
    assert_eq!(cache.get(u64::MAX), None);
}

#[test]
fn when_the_space_runs_out_later_indexes_are_never_cached() {
    // 4096 bytes of entries, each rounded up to 64: 3 of 1,000 bytes fit
    // (3 x 1,024), the fourth does not.
    let cache = SampleCache::create(8, 4096, None).expect("create");
    let sample = vec![7u8; 1000];
    for i in 0..4 {
        assert_eq!(cache.put(i, &[&sample]), Put::Stored, "entry {i}");
    }
    assert_eq!(cache.put(4, &[&sample]), Put::Full);
    // Marked for good: nobody tries that index again.
    assert_eq!(cache.put(4, &[b"small"]), Put::Taken);
    assert_eq!(cache.get(4), None);
    for i in 0..4 {
        assert_eq!(cache.get(i), Some(&sample[..]));
    }
    assert_eq!(cache.stats().refused, 1);
}

#[test]
fn turned_off_it_finds_and_stores_nothing_and_says_why() {
    let cache = SampleCache::create(4, 4096, None).expect("create");
    let other = reopen(&cache);
    assert_eq!(cache.put(0, &[b"kept"]), Put::Stored);
    other.turn_off(Off::DoesNotPay);
    other.turn_off(Off::Failed); // the first reason stays
    assert!(!cache.is_on());
    assert_eq!(cache.get(0), None);
    assert_eq!(cache.put(1, &[b"x"]), Put::Refused);
    assert_eq!(cache.stats().off, Some(Off::DoesNotPay));
}

#[test]
fn the_counters_are_every_mappings_sums() {
    let cache = SampleCache::create(4, 4096, None).expect("create");
    let other = reopen(&cache);
    cache.record_miss(300);
    other.record_miss(500);
    cache.time_store(40);
    other.record_hit(Some(20));
    other.record_hit(None);
    cache.time_hit(Some(10));
    let s = cache.stats();
    assert_eq!((s.misses, s.loads, s.load_nanos), (2, 2, 800));
    assert_eq!((s.stores_timed, s.store_nanos), (1, 40));
    assert_eq!((s.hits, s.hits_timed, s.hit_nanos), (2, 2, 30));
    assert_eq!((s.entries, s.capacity), (4, 4096));
    other.turn_off(Off::OneEpoch);
    assert_eq!(cache.stats().off, Some(Off::OneEpoch));
}

#[test]
fn a_file_that_is_not_a_cache_of_that_size_is_refused() {
    let cache = SampleCache::create(100, 4096, None).expect("create");
    let fd = cache.fd().try_clone_to_owned().expect("dup");
    let err = SampleCache::open(File::from(fd), 50).expect_err("other entries");
    assert!(err.to_string().contains("another number of samples"), "{err}");

    let plain = memfd_create("not-a-cache", MFdFlags::MFD_CLOEXEC).expect("memfd");
    let plain = File::from(plain);
    plain.set_len(1 << 16).expect("len");
    let err = SampleCache::open(plain, 10).expect_err("zeros");
    assert!(err.to_string().contains("no magic"), "{err}");

    assert!(matches!(SampleCache::create(MAX_ENTRIES + 1, 0, None), Err(CacheError::TooManyEntries(_))));
}

#[test]
fn a_cache_in_a_directory_leaves_no_file_there() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = SampleCache::create(16, 1 << 16, Some(dir.path())).expect("create");
    assert_eq!(cache.put(1, &[b"on disk"]), Put::Stored);
    assert_eq!(reopen(&cache).get(1), Some(&b"on disk"[..]));
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0);
    let missing = dir.path().join("missing");
    let err = SampleCache::create(16, 1 << 16, Some(&missing)).expect_err("no such dir");
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn writers_racing_for_indexes_store_each_once_and_readers_see_whole_entries() {
    let cache = Arc::new(SampleCache::create(512, 8 << 20, None).expect("create"));
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                let mut stored = 0;
                for i in 0..512u64 {
                    // Each index's bytes say which index they are, so a
                    // reader can tell a whole entry from a torn one.
                    let body = vec![(i % 251) as u8; 100 + (i as usize % 300)];
                    if cache.put(i, &[&i.to_le_bytes(), &body, &[t]]) == Put::Stored {
                        stored += 1;
                    }
                    let j = (i * 7 + u64::from(t)) % 512;
                    if let Some(entry) = cache.get(j) {
                        assert_eq!(entry[..8], j.to_le_bytes());
                        let body = &entry[8..entry.len() - 1];
                        assert_eq!(body.len(), 100 + (j as usize % 300));
                        assert!(body.iter().all(|&b| b == (j % 251) as u8));
                    }
                }
                stored
            })
        })
        .collect();
    let stored: u64 = threads.into_iter().map(|t| t.join().expect("thread")).sum();
    assert_eq!(stored, 512);
    assert_eq!(cache.stats().stored, 512);
    let _ = cache.fd().as_fd();
}
