use std::io::Write;

use super::*;

fn file_of(pages: usize) -> (tempfile::NamedTempFile, usize) {
    let page = {
        install();
        PAGE.load(Ordering::Relaxed)
    };
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    let bytes: Vec<u8> = (0..pages * page).map(|i| (i % 251) as u8 + 1).collect();
    f.write_all(&bytes).expect("write");
    f.flush().expect("flush");
    (f, page)
}

#[test]
fn a_file_truncated_under_its_mapping_reads_as_changed_not_a_crash() {
    let (f, page) = file_of(3);
    let mapped = MappedFile::map(f.as_file()).expect("map");
    let other = MappedFile::map(&File::open(f.path()).expect("open")).expect("map again");
    assert_eq!(mapped.bytes()[page + 5], ((page + 5) % 251) as u8 + 1);
    assert_eq!(mapped.intact(), Ok(()));
    f.as_file().set_len(page as u64).expect("truncate");
    // Before this module, this copy was a SIGBUS that killed the process.
    let mut copy = vec![0u8; page];
    copy.copy_from_slice(&mapped.bytes()[2 * page..3 * page]);
    assert_eq!(copy, vec![0u8; page], "the lost page reads as zeros");
    assert_eq!(mapped.intact(), Err(Changed { offset: 2 * page as u64 }));
    // The first page is still the file's; the other mapping has not read
    // past the end, so it is still intact until it does.
    assert_eq!(mapped.bytes()[5], 6);
    assert_eq!(other.intact(), Ok(()));
    std::hint::black_box(other.bytes()[page + 1]);
    assert_eq!(other.intact(), Err(Changed { offset: page as u64 }));
}

#[test]
fn a_dropped_mapping_frees_its_slot_for_the_next() {
    let (f, _) = file_of(1);
    let used = HIGH.load(Ordering::Acquire);
    for _ in 0..1000 {
        let mapped = MappedFile::map(f.as_file()).expect("map");
        assert!(mapped.slot.is_some());
    }
    // Other tests of this binary map files meanwhile, a few at a time.
    assert!(HIGH.load(Ordering::Acquire) < used + 100, "slots are reused, not leaked");
}
