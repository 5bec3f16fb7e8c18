//! The book against honest and lying reports, and a model of the protocol.
use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;

use bytes::BytesMut;
use loader_proto::pb::{RingToWorker, ring_to_worker};
use crate::frame::decode;
use proptest::prelude::*;

use super::*;
use crate::wake::WaitSet;

fn book(count: u32, prefetch: u32) -> Arc<Book> {
    Book::new(
        RingGeometry {
            slot_size: 4096,
            slot_count: count,
        },
        prefetch,
    )
}

/// The worker's end of a connection's socket, as a test reads it.
struct Peer {
    socket: UnixStream,
    buf: BytesMut,
}

/// Opens a connection on a real socket pair; the test keeps the worker's end.
fn conn(b: &Book) -> (ConnId, Peer) {
    let (ours, theirs) = UnixStream::pair().expect("socket pair");
    ours.set_nonblocking(true).expect("non-blocking");
    theirs.set_nonblocking(true).expect("non-blocking");
    let wait = Arc::new(WaitSet::new().expect("wait set"));
    let ours = Arc::new(ours);
    let id = b.open(|id| GrantLine::new(ours, wait, id));
    (
        id,
        Peer {
            socket: theirs,
            buf: BytesMut::new(),
        },
    )
}

/// Every grant written to `peer` so far (requests to give grants back,
/// which a worker may ignore, are left out: see [`messages`]).
fn grants(peer: &mut Peer) -> Vec<(u32, u64)> {
    messages(peer).into_iter().filter_map(Result::ok).collect()
}

#[test]
fn grants_are_credits_up_to_prefetch_and_come_back_with_a_new_generation() {
    let b = book(4, 2);
    let (a, mut ra) = conn(&b);
    assert_eq!(
        grants(&mut ra),
        vec![(0, 1), (1, 1)],
        "prefetch caps the grants"
    );
    let (c, mut rc) = conn(&b);
    assert_eq!(grants(&mut rc), vec![(2, 1), (3, 1)]);
    assert_eq!(
        b.census(),
        Census {
            free: 0,
            granted: 4,
            held: 0
        }
    );

    let held = b.filled(a, 0, 1, 100).expect("filled");
    assert_eq!(
        b.census(),
        Census {
            free: 0,
            granted: 3,
            held: 1
        }
    );
    drop(held);
    assert!(
        grants(&mut ra).is_empty(),
        "a's batch waits in the consumer: still a credit"
    );
    assert_eq!(
        b.census(),
        Census {
            free: 1,
            granted: 3,
            held: 0
        }
    );
    b.yielded(a);
    assert_eq!(
        grants(&mut ra),
        vec![(0, 2)],
        "yielded: the slot comes back to a, newer generation"
    );
    b.returned(c, 3, 1).expect("returned");
    assert_eq!(grants(&mut rc), vec![(3, 2)], "c is below prefetch again");
}

#[test]
fn the_slot_freed_last_is_granted_first_and_unused_slots_stay_untouched() {
    // A ring larger than the work in flight: one credit, eight slots.
    let b = book(8, 1);
    let (a, mut ra) = conn(&b);
    let mut grant = grants(&mut ra);
    let mut used = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let [(slot, generation)] = grant[..] else {
            panic!("one grant at a time: {grant:?}");
        };
        used.insert(slot);
        let held = b.filled(a, slot, generation, 1).expect("filled");
        b.yielded(a);
        drop(held);
        b.flush(a);
        grant = grants(&mut ra);
    }
    // The credit comes back when a batch is yielded, while the user still
    // holds it, so the next grant is the other slot; from then on each
    // batch goes into a slot freed just before. Two slots carry every batch
    // (their pages stay mapped and warm in both processes); the other six
    // are never touched.
    assert_eq!(used.into_iter().collect::<Vec<_>>(), vec![0, 1]);
}

#[test]
fn a_fast_worker_cannot_fill_the_ring_behind_a_slow_one() {
    let b = book(4, 2);
    let (fast, mut rf) = conn(&b);
    let first = grants(&mut rf);
    let held: Vec<_> = first
        .iter()
        .map(|&(s, g)| b.filled(fast, s, g, 1).expect("filled"))
        .collect();
    assert!(
        grants(&mut rf).is_empty(),
        "two batches wait in the consumer: no more credit"
    );
    let (_slow, mut rs) = conn(&b);
    assert_eq!(
        grants(&mut rs).len(),
        2,
        "the free slots are left for the slow worker"
    );
    assert_eq!(b.starved(), 0);
    drop(held);
}

#[test]
fn starved_workers_are_counted_when_every_slot_is_held() {
    let b = book(2, 2);
    let (a, mut ra) = conn(&b);
    let held: Vec<_> = grants(&mut ra)
        .iter()
        .map(|&(s, g)| b.filled(a, s, g, 1).expect("filled"))
        .collect();
    let (_c, _rc) = conn(&b);
    assert_eq!(b.starved(), 1, "c has credits but every slot is held");
    b.yielded(a);
    b.yielded(a);
    assert_eq!(
        b.starved(),
        2,
        "yielded but not dropped: still held, and a may fill again"
    );
    drop(held);
    assert_eq!(b.starved(), 0);
}

#[test]
fn fewest_credits_first() {
    let b = book(3, 8);
    let (a, mut ra) = conn(&b);
    assert_eq!(
        grants(&mut ra).len(),
        3,
        "alone, it takes everything up to prefetch"
    );
    let (_c, mut rc) = conn(&b);
    assert!(grants(&mut rc).is_empty());
    let h = b.filled(a, 0, 1, 1).expect("filled");
    b.yielded(a);
    drop(h);
    assert_eq!(
        grants(&mut rc),
        vec![(0, 2)],
        "the starved connection goes first"
    );
}

#[test]
fn reports_are_checked_against_the_book() {
    let b = book(2, 1);
    let (a, _ra) = conn(&b);
    let (c, _rc) = conn(&b);
    // a holds slot 0 gen 1, c holds slot 1 gen 1.
    assert_eq!(
        b.filled(a, 2, 1, 1).err(),
        Some(SlotError::OutOfRange { slot: 2, count: 2 })
    );
    assert_eq!(
        b.filled(a, u32::MAX, 1, 1).err(),
        Some(SlotError::OutOfRange {
            slot: u32::MAX,
            count: 2
        })
    );
    assert_eq!(
        b.filled(a, 1, 1, 1).err(),
        Some(SlotError::NotGranted { slot: 1 }),
        "c's slot"
    );
    assert_eq!(
        b.filled(a, 0, 7, 1).err(),
        Some(SlotError::WrongGeneration {
            slot: 0,
            generation: 7,
            granted: 1
        })
    );
    assert_eq!(
        b.filled(a, 0, 1, 4097).err(),
        Some(SlotError::TooLong {
            slot: 0,
            len: 4097,
            slot_size: 4096
        })
    );
    let held = b.filled(a, 0, 1, 4096).expect("a full slot is fine");
    assert_eq!(
        b.filled(a, 0, 1, 1).err(),
        Some(SlotError::NotGranted { slot: 0 }),
        "reported twice"
    );
    assert_eq!(
        b.returned(a, 0, 1),
        Err(SlotError::NotGranted { slot: 0 }),
        "held, not granted"
    );
    b.returned(c, 1, 1).expect("returned");
    drop(held);
}

#[test]
fn a_closed_connection_frees_its_grants_but_not_held_slots() {
    let b = book(4, 4);
    let (a, mut ra) = conn(&b);
    assert_eq!(grants(&mut ra).len(), 4);
    let held = b.filled(a, 2, 1, 10).expect("filled");
    assert_eq!(b.close(a), 3);
    assert_eq!(
        b.census(),
        Census {
            free: 3,
            granted: 0,
            held: 1
        }
    );
    let (c, mut rc) = conn(&b);
    let got = grants(&mut rc);
    assert_eq!(got.len(), 3);
    assert!(
        got.iter()
            .all(|&(slot, generation)| slot != 2 && generation == 2)
    );
    drop(held);
    assert!(
        grants(&mut rc).is_empty(),
        "c still knows of three grants: the new one waits for company"
    );
    b.flush(c);
    assert_eq!(grants(&mut rc), vec![(2, 2)]);
}

#[test]
fn a_connection_whose_socket_is_gone_gets_no_more_grants_until_closed() {
    let b = book(3, 2);
    let (a, ra) = conn(&b);
    drop(ra);
    // The grant this frees (slot 0, granted again at once: the last freed
    // goes first) cannot be written: the line breaks, and a keeps
    // what it was granted (its reports may still be in the socket) until the
    // read side closes it.
    b.returned(a, 0, 1).expect("returned");
    let (_c, mut rc) = conn(&b);
    assert_eq!(grants(&mut rc), vec![(2, 1)], "c gets the one free slot");
    assert_eq!(
        b.census(),
        Census {
            free: 0,
            granted: 3,
            held: 0
        }
    );
    assert_eq!(b.close(a), 2);
    assert_eq!(
        grants(&mut rc),
        vec![(1, 2)],
        "a's slots are free again; c takes up to prefetch"
    );
    assert_eq!(
        b.census(),
        Census {
            free: 1,
            granted: 2,
            held: 0
        }
    );
}

#[test]
fn grants_go_out_a_few_at_a_time_while_the_worker_has_plenty() {
    // One connection: fair share 8, prefetch 8, so grants are held back
    // while the worker knows of more than 4.
    let b = book(8, 8);
    let (a, mut ra) = conn(&b);
    let first = grants(&mut ra);
    assert_eq!(first.len(), 8);
    let mut received = Vec::new();
    for &(slot, generation) in &first[..5] {
        let held = b.filled(a, slot, generation, 64).expect("filled");
        b.yielded(a);
        drop(held);
        received.push(grants(&mut ra).len());
    }
    // The worker knows of 7, 6, 5 grants: the freed slots wait. At 4 (the
    // fourth report) the three waiting go out together; the fourth freed
    // slot waits again, and so does the fifth.
    assert_eq!(received, vec![0, 0, 0, 3, 0]);
    assert_eq!(
        b.census(),
        Census {
            free: 0,
            granted: 8,
            held: 0
        },
        "held-back grants are still granted: no other worker gets them"
    );
    // A writable socket (or any flush) sends what waits.
    b.flush(a);
    assert_eq!(grants(&mut ra).len(), 2);
}

/// One thing that can happen to the book.
#[derive(Debug, Clone)]
enum Step {
    Open,
    Close(usize),
    Fill(usize, u32, u64, u64),
    Return(usize, u32, u64),
    FillGranted(usize),
    Drop(usize),
    Yield(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Open),
        (0usize..4).prop_map(Step::Close),
        (0usize..4, 0u32..6, 0u64..6, 0u64..5000).prop_map(|(c, s, g, l)| Step::Fill(c, s, g, l)),
        (0usize..4, 0u32..6, 0u64..6).prop_map(|(c, s, g)| Step::Return(c, s, g)),
        (0usize..4).prop_map(Step::FillGranted),
        (0usize..8).prop_map(Step::Drop),
        (0usize..4).prop_map(Step::Yield),
    ]
}

proptest! {
    /// Honest or lying reports in any order: a slot is in exactly one
    /// state, a connection's grants and waiting batches never exceed
    /// prefetch, each generation of a slot is granted once, and the book
    /// never loses a slot.
    #[test]
    fn the_book_never_loses_or_doubles_a_slot(steps in proptest::collection::vec(step(), 0..80)) {
        const COUNT: u32 = 5;
        const PREFETCH: u32 = 2;
        let b = book(COUNT, PREFETCH);
        // Each connection: its id, its grants channel, what it holds,
        // and how many of its batches wait in the consumer.
        type Conn = (ConnId, Peer, Vec<(u32, u64)>, u32);
        let mut conns: Vec<Conn> = Vec::new();
        let mut held: Vec<SlotRelease> = Vec::new();
        let mut seen: std::collections::HashSet<(u32, u64)> = Default::default();
        for step in steps {
            match step {
                Step::Open => { let (id, peer) = conn(&b); conns.push((id, peer, Vec::new(), 0)); }
                Step::Close(i) if i < conns.len() => { let (id, ..) = conns.remove(i); b.close(id); }
                Step::Fill(i, slot, g, len) if i < conns.len() => {
                    if let Ok(r) = b.filled(conns[i].0, slot, g, len) {
                        let pos = conns[i].2.iter().position(|&x| x == (slot, g));
                        prop_assert!(pos.is_some(), "accepted a report of a slot not granted");
                        conns[i].2.remove(pos.unwrap_or_default());
                        conns[i].3 += 1;
                        held.push(r);
                    }
                }
                Step::Return(i, slot, g) if i < conns.len() && b.returned(conns[i].0, slot, g).is_ok() => {
                    let pos = conns[i].2.iter().position(|&x| x == (slot, g));
                    prop_assert!(pos.is_some(), "accepted a return of a slot not granted");
                    conns[i].2.remove(pos.unwrap_or_default());
                }
                Step::FillGranted(i) if i < conns.len() => {
                    if let Some(&(slot, g)) = conns[i].2.first() {
                        held.push(b.filled(conns[i].0, slot, g, 64).expect("an honest report"));
                        conns[i].2.remove(0);
                        conns[i].3 += 1;
                    }
                }
                Step::Drop(i) if i < held.len() => { held.remove(i); }
                Step::Yield(i) if i < conns.len() && conns[i].3 > 0 => { conns[i].3 -= 1; b.yielded(conns[i].0); }
                _ => {}
            }
            for (_, rx, granted, waiting) in &mut conns {
                for g in grants(rx) {
                    prop_assert!(seen.insert(g), "slot {} generation {} granted twice", g.0, g.1);
                    granted.push(g);
                }
                prop_assert!(granted.len() + *waiting as usize <= PREFETCH as usize);
            }
            let c = b.census();
            prop_assert_eq!(c.free + c.granted + c.held, COUNT as usize);
            prop_assert_eq!(c.held, held.len());
            prop_assert_eq!(c.granted, conns.iter().map(|c| c.2.len()).sum::<usize>());
            if c.free > 0 {
                // Nobody could take it: full credits, or a fair share of grants.
                let fair = (COUNT as usize / conns.len().max(1)).max(1);
                prop_assert!(
                    conns.iter().all(|c| c.2.len() + c.3 as usize == PREFETCH as usize || c.2.len() >= fair),
                    "a free slot left ungranted"
                );
            }
        }
    }
}

/// Every message written to `peer` so far: grants as `Ok((slot,
/// generation))`, reclaim requests as `Err(count)`.
fn messages(peer: &mut Peer) -> Vec<Result<(u32, u64), u32>> {
    let mut chunk = [0u8; 4096];
    loop {
        match peer.socket.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => peer.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("reading messages: {e}"),
        }
    }
    std::iter::from_fn(|| decode::<RingToWorker>(&mut peer.buf).expect("frame"))
        .map(|m| match m.msg {
            Some(ring_to_worker::Msg::Grant(g)) => Ok((g.slot, g.generation)),
            Some(ring_to_worker::Msg::Reclaim(r)) => Err(r.count),
            other => panic!("expected a grant or a reclaim, got {other:?}"),
        })
        .collect()
}

#[test]
fn a_worker_attaching_after_idle_ones_took_every_slot_gets_their_excess_back() {
    // Two workers took all 16 slots and went idle (no batch to write); a
    // third attaches with the batch the consumer may be waiting for.
    let b = book(16, 8);
    let (a, mut ra) = conn(&b);
    let (bb, mut rb) = conn(&b);
    let held_a = grants(&mut ra);
    let held_b = grants(&mut rb);
    assert_eq!((held_a.len(), held_b.len()), (8, 8));
    let (c, mut rc) = conn(&b);
    assert!(grants(&mut rc).is_empty(), "no slot is free");
    // Fair share is 16 / 3 = 5: each idle worker is asked for 3, once.
    assert_eq!(messages(&mut ra), vec![Err(3)]);
    assert_eq!(messages(&mut rb), vec![Err(3)]);
    b.flush(a);
    assert!(messages(&mut ra).is_empty(), "asked once, not on every change");
    // The workers return their latest grants; the late worker gets them.
    for &(slot, generation) in held_a.iter().rev().take(3) {
        b.returned(a, slot, generation).expect("returned");
    }
    for &(slot, generation) in held_b.iter().rev().take(3) {
        b.returned(bb, slot, generation).expect("returned");
    }
    // Grants after the first few may wait to go out together.
    let mut got = grants(&mut rc);
    b.flush(c);
    got.extend(grants(&mut rc));
    assert_eq!(got.len(), 5, "up to its fair share: {got:?}");
    assert_eq!(
        b.census(),
        Census { free: 1, granted: 15, held: 0 }
    );
    assert!(messages(&mut ra).is_empty() && messages(&mut rb).is_empty(), "nothing more asked");
}
